"""Late binding on the pod: receive the job's code package, install its requirements, adjust its launch.

A package arrives over the agent's own connection (`PUT /v1/packages/{sha256}`, the sandbox may have
no network) right before the launch: it streams to the run dir while it is hashed, and is unpacked
into the emptied package directory at once, with the real bytes counted (`archives`). The launch that
names it then runs in the package directory. Requirements are installed into the pod's dependency
directory, which survives resets for the pod's life (`requirements`). Either failing fails the
attempt before any user process starts: `PackageError` or `DependencyError`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from firepool_agent import archives, raymode, requirements, wiping
from firepool_agent.attempt import Attempt, Conflict, LaunchSpec
from firepool_agent.attempts import Attempts
from firepool_agent.wire import HttpError

DIGEST = re.compile(r"^[0-9a-f]{64}$")
MAX_PACKAGE = 8 << 30
"""A sanity bound on one pushed archive; the broker enforces its configured (smaller) limit."""
CHUNK = 1 << 20


@dataclass(frozen=True)
class Delivered:
    digest: str
    unpack_s: float
    receive_s: float
    extracted: int


def receive_package(attempts: Attempts, digest: str, body: BinaryIO, length: int, max_extracted: int) -> Delivered:
    """Take a pushed package and unpack it into the package dir; HttpError when it is refused."""
    if not DIGEST.match(digest):
        raise HttpError(400, "a package is named by the 64 lower-case hex digits of its SHA-256")
    if length > MAX_PACKAGE:
        raise HttpError(413, f"the package is larger than {MAX_PACKAGE} bytes")
    config = attempts.config
    with attempts.launch_lock:
        with attempts.cond:
            if attempts.current is not None:
                raise Conflict(f"attempt {attempts.current.attempt_id} is running; packages arrive before a launch",
                               retryable=True)
        attempts.delivered = None
        began = time.perf_counter()
        staging = os.path.join(config.run_dir, f".package-{digest}.zip")
        hasher, left = hashlib.sha256(), length
        try:
            with open(staging, "wb") as out:
                while left > 0:
                    chunk = body.read(min(CHUNK, left))
                    if not chunk:
                        raise HttpError(400, f"the body ended {left} bytes early")
                    hasher.update(chunk)
                    out.write(chunk)
                    left -= len(chunk)
            if hasher.hexdigest() != digest:
                raise HttpError(400, f"the body's SHA-256 is {hasher.hexdigest()}, not {digest}")
            received = time.perf_counter()
            problems = wiping.empty_dir(config.package_dir)
            if problems:
                raise HttpError(500, "the package directory could not be emptied: " + "; ".join(problems[:3]))
            try:
                extracted = archives.extract(staging, config.package_dir,
                                             archives.ArchiveLimits(max_extracted=max_extracted))
            except archives.ArchiveRefused as exc:
                wiping.empty_dir(config.package_dir)
                raise HttpError(413 if exc.too_large else 400, exc.message) from None
        finally:
            try:
                os.unlink(staging)
            except FileNotFoundError:
                pass
        done = time.perf_counter()
        delivered = Delivered(digest, unpack_s=done - received, receive_s=received - began, extracted=extracted)
        attempts.delivered = delivered
        return delivered


def prepare(attempts: Attempts, attempt: Attempt, spec: LaunchSpec) -> LaunchSpec | tuple[str, str]:
    """The launch as it should run (cwd, PYTHONPATH), or (error class, message) when it must not.

    Only `package`, `requirements` and `mode` (Ray, `raymode`) are read here; other launch extras belong
    to other features.
    """
    extra: dict[str, Any] = dict(spec.extra)
    config = attempts.config
    env = dict(spec.env)
    cwd = spec.cwd
    package = extra.get("package")
    if package is not None:
        delivered = attempts.delivered
        if not isinstance(package, str) or delivered is None or delivered.digest != package:
            return "PackageError", f"package {package} was not delivered to this pod before the launch"
        attempt.timings["package_receive_s"] = delivered.receive_s
        attempt.timings["package_unpack_s"] = delivered.unpack_s
        cwd = cwd or config.package_dir
    text = extra.get("requirements")
    if text is not None:
        if not isinstance(text, str):
            return "LaunchError", "requirements must be the text of a requirements file"
        if not config.deps_dir:
            return "DependencyError", "this pod has no dependency directory to install requirements into"
        try:
            result = requirements.ensure(text, config.deps_dir, attempts.job_env(spec.env, spec.attempt_id))
        except requirements.InstallFailed as exc:
            attempt.timings["deps_install_s"] = exc.duration_s
            return "DependencyError", exc.message
        attempt.timings["deps_install_s"] = result.duration_s
        attempt.timings["deps_marker_hit"] = 1.0 if result.marker_hit else 0.0
        site = requirements.site_dir(config.deps_dir)
        env["PYTHONPATH"] = site + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PATH"] = os.path.join(site, "bin") + ":" + env.get("PATH", config.job_path)
    return raymode.wrapped(dataclasses.replace(spec, env=env, cwd=cwd), config.run_dir)  # `mode: ray`: head or worker node
