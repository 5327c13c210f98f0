"""Incremental dependencies: install a job's requirements into the pod's own site directory, once.

The sandbox's interpreter is read-only, so packages go to `<deps>/site` (on the jobs' PYTHONPATH),
which lives as long as the pod, through every reset. uv installs them (pip when uv is missing), with
the machine's configured indexes (pip/uv config files, or the job's env). A marker named by the
SHA-256 of the requirements text is written only after the installer exits cleanly, and every marker
is removed before any install, so at most one exists: that of the last pin set installed completely.
Same pins again: a marker hit, nothing runs. Changed pins: an incremental install over what is there.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

MARKER_PREFIX = ".firepool-requirements-"
INSTALL_TIMEOUT_S = 600.0
TAIL_LINES = 25


class InstallFailed(Exception):
    def __init__(self, message: str, duration_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.duration_s = duration_s


@dataclass(frozen=True)
class Installed:
    duration_s: float
    marker_hit: bool
    installer: str | None
    """`uv` or `pip`; None on a marker hit."""


def site_dir(deps_dir: str) -> str:
    return os.path.join(deps_dir, "site")


def marker_path(deps_dir: str, text: str) -> str:
    return os.path.join(site_dir(deps_dir), MARKER_PREFIX + hashlib.sha256(text.encode()).hexdigest())


def installer(site: str, requirements_file: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """uv when it is on the jobs' PATH or beside this interpreter, else pip of this interpreter."""
    uv = shutil.which("uv", path=env.get("PATH")) or shutil.which("uv", path=os.path.dirname(sys.executable))
    if uv:
        return "uv", [uv, "pip", "install", "--target", site, "--python", sys.executable, "-r", requirements_file]
    return "pip", [sys.executable, "-m", "pip", "install", "--target", site, "--upgrade", "--no-input",
                   "--disable-pip-version-check", "-r", requirements_file]


def _tail(output: bytes) -> str:
    lines = output.decode(errors="replace").strip().splitlines()
    return "\n".join(lines[-TAIL_LINES:])[-4000:]


def ensure(text: str, deps_dir: str, env: Mapping[str, str], timeout_s: float = INSTALL_TIMEOUT_S) -> Installed:
    """Make the pins of `text` installed in the pod's site dir; InstallFailed with the installer's last lines."""
    began = time.perf_counter()
    site = site_dir(deps_dir)
    os.makedirs(site, exist_ok=True)
    marker = marker_path(deps_dir, text)
    if os.path.exists(marker):
        return Installed(time.perf_counter() - began, True, None)
    for stale in glob.glob(os.path.join(glob.escape(site), MARKER_PREFIX + "*")):
        os.unlink(stale)
    requirements_file = os.path.join(deps_dir, "requirements.txt")
    with open(requirements_file, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    run_env = dict(env)
    run_env.setdefault("UV_CACHE_DIR", os.path.join(deps_dir, "cache", "uv"))
    run_env.setdefault("PIP_CACHE_DIR", os.path.join(deps_dir, "cache", "pip"))
    run_env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    run_env.setdefault("UV_NO_PROGRESS", "1")
    name, argv = installer(site, requirements_file, run_env)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=run_env, cwd=deps_dir, start_new_session=True, close_fds=True)
    except OSError as exc:
        raise InstallFailed(f"cannot start {name}: {exc}", time.perf_counter() - began) from None
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise InstallFailed(f"{name} did not finish within {timeout_s:.0f} s:\n{_tail(output)}",
                            time.perf_counter() - began) from None
    if proc.returncode != 0:
        raise InstallFailed(f"{name} exited {proc.returncode}:\n{_tail(output)}", time.perf_counter() - began)
    with open(marker, "w") as f:
        f.write(text)
    return Installed(time.perf_counter() - began, False, name)
