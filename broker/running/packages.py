"""Code packages: a content-addressed store of checked zip archives, named by their SHA-256.

`PackageStore` is the port an object store could implement later; `FilePackageStore` (the embedded
default) keeps `<root>/<aa>/<digest>.zip` under the state dir, with a sidecar listing the callers
that uploaded it. Every answer is per caller, as if only its own uploads existed: HEAD and GET find only
packages it uploaded, and its first upload of bytes another caller stored says `created` (an upload
checks and hashes the whole body either way), so no caller can test whether another stored a file. An
upload streams to a temporary file while it is hashed and measured, is checked entry by entry (see
`firepool_agent.archives`), and only then is renamed into place: a refused upload leaves nothing behind,
identical uploads are stored once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from broker.errors import DigestMismatch, InvalidRequest, PackageError, PayloadTooLarge, UnsafePackage
from firepool_agent.archives import ArchiveLimits, ArchiveRefused, check

DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PackageLimits:
    """What a package may be; defaults are the paper's."""

    max_compressed: int = 512 << 20
    """Bytes of the zip itself (the upload)."""
    max_extracted: int = 2_000_000_000
    """Bytes written when it is unpacked, counted while decompressing (a zip-bomb guard)."""
    max_entries: int = 100_000
    """Files and directories in one archive."""
    push_timeout_s: float = 300.0
    """How long delivering a package to a pod's agent may take before the launch fails."""

    @property
    def archive(self) -> ArchiveLimits:
        return ArchiveLimits(max_extracted=self.max_extracted, max_entries=self.max_entries)


@dataclass(frozen=True)
class StoredPackage:
    digest: str
    size: int
    created: bool
    """False when this caller had already uploaded it. Another caller's identical upload does not count:
    the bytes are stored once, but a caller learns nothing of what others stored."""


def check_digest(digest: str) -> str:
    """The digest, lower-case hex; InvalidRequest when it is not a SHA-256."""
    if not DIGEST.match(digest):
        raise InvalidRequest("a package is named by the 64 lower-case hex digits of its SHA-256",
                             {"field": "digest"})
    return digest


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the package is larger than {limit} bytes", {"limit": limit, "reason": "compressed"})


class Upload:
    """A body streaming into a staging file, cut off at `limit` bytes; the file goes if the upload fails."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.size = 0
        self._out = open(path, "wb")  # noqa: SIM115 - closed in __exit__

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise too_large(self.limit)
        self._out.write(chunk)

    def __enter__(self) -> Upload:
        return self

    def __exit__(self, failed: type[BaseException] | None, *_: object) -> None:
        self._out.close()
        if failed is not None:
            self.path.unlink(missing_ok=True)


class PackageStore(Protocol):
    limits: PackageLimits

    def upload(self) -> Upload:
        """A new upload to stream a body into (then `put_file` its path)."""
        ...

    def put_file(self, caller: str, digest: str, staged: Path) -> StoredPackage:
        """Store a staged archive if it is safe and hashes to `digest`; typed errors otherwise."""
        ...

    def put(self, caller: str, digest: str, chunks: Iterable[bytes]) -> StoredPackage:
        """Store an archive streamed in `chunks` if it is safe and hashes to `digest`; typed errors otherwise."""
        ...

    def exists(self, caller: str, digest: str) -> bool:
        """True when `caller` uploaded this package."""
        ...

    def path(self, caller: str, digest: str) -> Path | None:
        """A local file with the archive, or None when `caller` has no such package."""
        ...


class FilePackageStore:
    """Packages on local disk. Blocking: call it from a worker thread."""

    def __init__(self, root: Path, limits: PackageLimits = PackageLimits()) -> None:
        self.root = root
        self.limits = limits
        self.tmp = root / "incoming"
        self.tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in self.tmp.iterdir():  # uploads a previous broker was receiving when it stopped
            stale.unlink(missing_ok=True)
        self._lock = threading.Lock()

    def _file(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.zip"

    def _owners_file(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest}.callers"

    def _owners(self, digest: str) -> set[str]:
        try:
            return set(json.loads(self._owners_file(digest).read_text()))
        except (OSError, ValueError):
            return set()

    def exists(self, caller: str, digest: str) -> bool:
        return self.path(caller, digest) is not None

    def path(self, caller: str, digest: str) -> Path | None:
        check_digest(digest)
        target = self._file(digest)
        return target if target.is_file() and caller in self._owners(digest) else None

    def upload(self) -> Upload:
        """A new staging file to stream a body into; hand its path to `put_file`, which always removes it."""
        fd, name = tempfile.mkstemp(dir=self.tmp, suffix=".zip")
        os.close(fd)
        return Upload(Path(name), self.limits.max_compressed)

    def put(self, caller: str, digest: str, chunks: Iterable[bytes]) -> StoredPackage:
        check_digest(digest)
        with self.upload() as upload:
            for chunk in chunks:
                upload.write(chunk)
        return self.put_file(caller, digest, upload.path)

    def put_file(self, caller: str, digest: str, staged: Path) -> StoredPackage:
        """Check a staged upload and store it under `digest`; the staged file is gone afterwards."""
        try:
            check_digest(digest)
            size = staged.stat().st_size
            if size > self.limits.max_compressed:
                raise too_large(self.limits.max_compressed)
            hasher = hashlib.sha256()
            with open(staged, "rb") as f:
                while chunk := f.read(1 << 20):
                    hasher.update(chunk)
            actual = hasher.hexdigest()
            if actual != digest:
                raise DigestMismatch(f"the body's SHA-256 is {actual}, not {digest}",
                                     {"expected": digest, "actual": actual})
            try:
                check(str(staged), self.limits.archive)
            except ArchiveRefused as exc:
                details = {"entry": exc.entry, "reason": "extracted" if exc.too_large else exc.reason}
                if exc.too_large:
                    raise PayloadTooLarge(exc.message, details) from exc
                if exc.reason == "corrupt":
                    raise PackageError(exc.message, details) from exc
                raise UnsafePackage(exc.message, details) from exc
            return self._commit(caller, digest, staged, size)
        finally:
            staged.unlink(missing_ok=True)

    def _commit(self, caller: str, digest: str, temp: Path, size: int) -> StoredPackage:
        target = self._file(digest)
        with self._lock:
            target.parent.mkdir(exist_ok=True, mode=0o700)
            if not target.exists():
                os.replace(temp, target)
            owners = self._owners(digest)
            created = caller not in owners
            if created:
                owners_file = self._owners_file(digest)
                staged = owners_file.with_suffix(".tmp")
                staged.write_text(json.dumps(sorted(owners | {caller})))
                os.replace(staged, owners_file)
        return StoredPackage(digest=digest, size=size, created=created)
