"""A local sandbox's /etc: only what name resolution, TLS, users, the loader and Python need.

The host's whole /etc carries what no job should read (shadow and gshadow files, SSH host keys, the
host's service configs and credentials, its list of users) and what it has no use for. A sandbox gets
an empty, read-only /etc with these entries bound read-only from the host where they exist, a
symlink kept as a symlink (`localtime`, `os-release`, `alternatives/*` resolve inside the sandbox's /usr),
plus three files of the pod's own: `resolv.conf` (slirp4netns's resolver on an isolated network, the
host's file otherwise) and a `passwd` and `group` that name root, nobody and the job's uid.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

ETC = "/etc"
ENTRIES = (
    # names, addresses and services (nsswitch picks `files` and `dns`; the NSS modules are in /usr/lib)
    "hosts", "host.conf", "nsswitch.conf", "gai.conf", "networks", "protocols", "services",
    # TLS roots and OpenSSL's config (Debian and Red Hat layouts), never /etc/ssl/private
    "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "pki/tls/certs",
    "pki/tls/cert.pem", "pki/tls/openssl.cnf", "pki/ca-trust/extracted", "crypto-policies/back-ends",
    # the dynamic loader
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    # what Python, pip and pool images read
    "alternatives", "localtime", "timezone", "os-release", "lsb-release", "debian_version", "redhat-release",
    "mime.types", "inputrc", "terminfo", "fonts", "pip.conf", "python3", "xdg/pip",
    # GPU user-space loaders (ICDs)
    "OpenCL/vendors", "vulkan", "glvnd",
)
"""Paths under /etc a sandbox sees; everything else of the host's /etc is absent."""
GLOBS = ("python3.*",)
"""Per-version Python config directories (Debian's /etc/python3.11)."""
NOBODY = 65534


def users(uid: int, gid: int) -> tuple[str, str]:
    """`passwd` and `group` for a sandbox whose jobs run as uid:gid (HOME is the workspace)."""
    name = "nobody" if uid == NOBODY else "sandbox"
    group = "nogroup" if gid == NOBODY else "sandbox"
    people = ["root:x:0:0:root:/root:/usr/sbin/nologin"]
    groups = ["root:x:0:"]
    if uid != NOBODY:
        people.append(f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin")
    if gid != NOBODY:
        groups.append(f"nogroup:x:{NOBODY}:")
    if uid != 0:
        people.append(f"{name}:x:{uid}:{gid}:{name}:/workspace:/bin/sh")
    if gid != 0:
        groups.append(f"{group}:x:{gid}:")
    return "\n".join(people) + "\n", "\n".join(groups) + "\n"


def write_users(passwd: Path, group: Path, uid: int, gid: int) -> None:
    """Write the pod's `passwd` and `group` (broker-private files, bound read-only into its sandbox)."""
    for path, text in zip((passwd, group), users(uid, gid), strict=True):
        path.write_text(text)
        path.chmod(0o644)


def host_entries(etc: str = ETC) -> Iterator[str]:
    """The host paths of ENTRIES and GLOBS that exist here, in mount order (a parent before its children)."""
    seen: set[str] = set()
    found = [os.path.join(etc, e) for e in ENTRIES] + sorted(p for g in GLOBS for p in glob.glob(os.path.join(etc, g)))
    for path in found:
        if os.path.lexists(path) and path not in seen:
            seen.add(path)
            yield path


def mounts(own_resolv: Path | None, passwd: Path, group: Path, host_resolv: str = f"{ETC}/resolv.conf",
           etc: str = ETC) -> list[tuple[str, list[str]]]:
    """(sandbox path, bwrap arguments) for every entry of the sandbox's /etc.

    `own_resolv` is the pod's resolver file (an isolated network); otherwise the host's resolv.conf is
    shown, read through its symlink (systemd-resolved's stub lives under /run, absent in a sandbox).
    """
    out: list[tuple[str, list[str]]] = []
    for path in host_entries(etc):
        dst = ETC + path[len(etc):]
        if os.path.islink(path):
            out.append((dst, ["--symlink", os.readlink(path), dst]))
        else:
            out.append((dst, ["--ro-bind", path, dst]))
    resolv = str(own_resolv) if own_resolv is not None else os.path.realpath(host_resolv)
    if own_resolv is not None or os.path.isfile(resolv):
        out.append((f"{ETC}/resolv.conf", ["--ro-bind", resolv, f"{ETC}/resolv.conf"]))
    out += [(f"{ETC}/passwd", ["--ro-bind", str(passwd), f"{ETC}/passwd"]),
            (f"{ETC}/group", ["--ro-bind", str(group), f"{ETC}/group"])]
    return out
