"""Code packages as zip archives: which entries are safe, and extraction that counts real bytes.

Shared by the broker (checking an upload before it is stored) and the pod agent (unpacking it at job
start), so both refuse the same archives. Only the standard library: the agent runs in any image.
An entry is refused when it could leave the package directory or be something other than a plain
file or directory: absolute names, `..` components, symlinks, devices, FIFOs and sockets. Sizes are
counted from the decompressed bytes themselves, never from the headers, which a zip bomb can fake.
"""

from __future__ import annotations

import os
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

CHUNK = 1 << 20
_COMPRESSIONS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


class ArchiveRefused(Exception):
    """The archive is not a safe package; `reason` is `unsafe` (an entry), `too_large` or `corrupt`."""

    def __init__(self, message: str, *, entry: str | None = None, reason: str = "unsafe") -> None:
        super().__init__(message)
        self.message = message
        self.entry = entry
        self.reason = reason

    @property
    def too_large(self) -> bool:
        return self.reason == "too_large"


@dataclass(frozen=True)
class ArchiveLimits:
    max_extracted: int = 2_000_000_000
    """Bytes written during extraction (decompressed bytes, counted while streaming)."""
    max_entries: int = 100_000
    """Files and directories in one archive."""


def safe_name(name: str) -> str:
    """The entry's relative path, or ArchiveRefused when it is absolute or escapes with `..`."""
    if not name or "\0" in name:
        raise ArchiveRefused("an entry has an empty name or a NUL byte", entry=name)
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(parts[0]) == 2 and parts[0][1] == ":"):
        raise ArchiveRefused(f"entry {name!r} is an absolute path", entry=name)
    if ".." in parts:
        raise ArchiveRefused(f"entry {name!r} escapes the package directory with '..'", entry=name)
    clean = [p for p in parts if p not in ("", ".")]
    if not clean:
        raise ArchiveRefused(f"entry {name!r} names the package directory itself", entry=name)
    return "/".join(clean)


def _kind(info: zipfile.ZipInfo) -> str:
    """`file` or `dir`; ArchiveRefused for symlinks, devices, FIFOs, sockets and encrypted entries."""
    mode = info.external_attr >> 16
    if info.flag_bits & 0x1:
        raise ArchiveRefused(f"entry {info.filename!r} is encrypted", entry=info.filename)
    if info.compress_type not in _COMPRESSIONS:
        raise ArchiveRefused(f"entry {info.filename!r} uses compression method {info.compress_type} "
                             "(only stored and deflated are accepted)", entry=info.filename)
    if info.create_system == 3 and stat.S_IFMT(mode):
        if stat.S_ISLNK(mode):
            raise ArchiveRefused(f"entry {info.filename!r} is a symlink", entry=info.filename)
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ArchiveRefused(f"entry {info.filename!r} is a special file (mode {oct(mode)})",
                                 entry=info.filename)
    return "dir" if info.is_dir() else "file"


def entries(archive: zipfile.ZipFile, limits: ArchiveLimits) -> list[tuple[zipfile.ZipInfo, str, str]]:
    """Every entry as (info, relative path, kind), after the name and type checks."""
    infos = archive.infolist()
    if len(infos) > limits.max_entries:
        raise ArchiveRefused(f"the archive has {len(infos)} entries (limit {limits.max_entries})", reason="too_large")
    seen: dict[str, str] = {}
    out = []
    for info in infos:
        path, kind = safe_name(info.filename), _kind(info)
        if seen.get(path, kind) != kind or (path in seen and kind == "file"):
            raise ArchiveRefused(f"entry {info.filename!r} appears twice", entry=info.filename)
        seen[path] = kind
        out.append((info, path, kind))
    files = {p for p, k in seen.items() if k == "file"}
    for path in seen:
        parent = path.rpartition("/")[0]
        while parent:
            if parent in files:
                raise ArchiveRefused(f"entry {path!r} lies under the file {parent!r}", entry=path)
            parent = parent.rpartition("/")[0]
    return out


class _Budget:
    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit

    def take(self, n: int, entry: str) -> None:
        self.left -= n
        if self.left < 0:
            raise ArchiveRefused(f"extracting writes more than {self.limit} bytes (a zip bomb?); "
                                 f"stopped in {entry!r}", entry=entry, reason="too_large")


def _chunks(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: _Budget) -> Iterator[bytes]:
    try:
        with archive.open(info) as src:
            while chunk := src.read(CHUNK):
                budget.take(len(chunk), info.filename)
                yield chunk
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        raise ArchiveRefused(f"entry {info.filename!r} is corrupt: {exc}", entry=info.filename,
                             reason="corrupt") from exc


def _open_zip(path: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveRefused(f"not a zip archive: {exc}", reason="corrupt") from exc


def check(path: str, limits: ArchiveLimits) -> int:
    """Refuse an unsafe archive (ArchiveRefused); returns the bytes it extracts to."""
    with _open_zip(path) as archive:
        budget = _Budget(limits.max_extracted)
        for info, _, kind in entries(archive, limits):
            if kind == "file":
                for _ in _chunks(archive, info, budget):
                    pass
        return budget.limit - budget.left


def extract(path: str, dest: str, limits: ArchiveLimits) -> int:
    """Unpack a checked-again archive into the (empty) directory `dest`; returns the bytes written."""
    with _open_zip(path) as archive:
        budget = _Budget(limits.max_extracted)
        for info, rel, kind in entries(archive, limits):
            target = os.path.join(dest, rel)
            if kind == "dir":
                os.makedirs(target, mode=0o755, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            executable = (info.external_attr >> 16) & 0o111
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o755 if executable else 0o644)
            with os.fdopen(fd, "wb") as out:
                for chunk in _chunks(archive, info, budget):
                    out.write(chunk)
        return budget.limit - budget.left
