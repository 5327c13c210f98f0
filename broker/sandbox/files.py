"""`sandbox.files`: the session workspace's files (paths relative to it; none may lead outside it), through
the file helper (`broker.sandbox.wrappers.FILES`): a job of the session, or a subprocess of its live kernel."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

from broker.errors import FirepoolError, InvalidRequest, NotFound
from broker.sandbox.calls import Calls
from broker.sandbox.paths import OutsideWorkspace, inside_workspace

WRITE_CHUNK = 512 << 10
"""Bytes one helper call carries (they travel as job arguments, which execve caps near 1 MiB in all)."""
READ_CHUNK = 8 << 20
"""Bytes one helper call reads back (its answer is one base64 line of stdout)."""


class FileError(FirepoolError):
    """The file helper refused or failed (`details["kind"]`: OutsideWorkspace, IsADirectory, WriteFailed...)."""

    status = 400


@dataclass(frozen=True)
class Entry:
    path: str
    """Relative to the workspace."""
    type: Literal["file", "dir", "link"]
    size: int
    mtime: float

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _path(path: str) -> str:
    try:
        return inside_workspace(path, "path")
    except OutsideWorkspace as exc:
        raise InvalidRequest(str(exc), {"field": "path"}) from None


class AsyncFiles:
    def __init__(self, calls: Calls, tag: str) -> None:
        self.calls, self.tag = calls, tag

    async def _op(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        answer, _ = await self.calls.helper(op, args, self.tag)
        if "error" in answer:
            kind = str(answer["error"])
            cls = NotFound if kind == "FileNotFound" else FileError
            raise cls(str(answer.get("message", kind)), {"kind": kind})
        return answer

    async def write(self, path: str, data: str | bytes) -> int:
        """Write a file (parent directories made as needed); the bytes written."""
        return await self.write_files({path: data})

    async def write_files(self, files: dict[str, str | bytes]) -> int:
        """Write several files, a few helper calls for all of them; the bytes written."""
        batch: list[dict[str, Any]] = []
        size = total = 0
        for path, data in files.items():
            raw = data.encode() if isinstance(data, str) else bytes(data)
            total += len(raw)
            for at in range(0, max(len(raw), 1), WRITE_CHUNK):  # a large file goes as appended chunks
                piece = raw[at:at + WRITE_CHUNK]
                if batch and size + len(piece) > WRITE_CHUNK:
                    await self._op("write", {"files": batch})
                    batch, size = [], 0
                batch.append({"path": _path(path), "base64": base64.b64encode(piece).decode(), "append": at > 0})
                size += len(piece)
        if batch:
            await self._op("write", {"files": batch})
        return total

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    async def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """A file's content: text (UTF-8, invalid bytes replaced) or, with format="bytes", bytes."""
        parts: list[bytes] = []
        offset = 0
        while True:
            got = (await self._op("read", {"files": [{"path": _path(path), "offset": offset,
                                                      "max_bytes": READ_CHUNK}]}))["files"][0]
            data = base64.b64decode(got["base64"])
            parts.append(data)
            offset += len(data)
            if not data or offset >= got["size"]:
                break
        raw = b"".join(parts)
        return raw if format == "bytes" else raw.decode(errors="replace")

    async def list(self, path: str = ".", depth: int = 1, limit: int = 1000) -> list[Entry]:
        """What is under `path`, `depth` levels down (1: its entries), at most `limit` entries."""
        answer = await self._op("list", {"path": _path(path), "depth": depth, "limit": limit})
        return [Entry(str(e["path"]), e["type"], int(e["size"]), float(e["mtime"])) for e in answer["entries"]]

    async def exists(self, path: str) -> bool:
        try:
            await self._op("list", {"path": _path(path), "depth": 1, "limit": 1})
        except NotFound:
            return False
        return True

    async def remove(self, *paths: str) -> None:
        """Remove files or whole directories (NotFound when one is missing)."""
        await self._op("remove", {"paths": [_path(p) for p in paths]})

    async def upload(self, local: str | os.PathLike[str], to: str = ".") -> int:
        """Copy a local file or directory tree into the workspace under `to`; the bytes copied."""
        src = Path(local)
        if src.is_file():
            return await self.write_files({_join(to, src.name): src.read_bytes()})
        files: dict[str, str | bytes] = {}
        for p in sorted(src.rglob("*")):
            if p.is_file() and not p.is_symlink():
                files[_join(to, p.relative_to(src).as_posix())] = p.read_bytes()
        return await self.write_files(files)

    async def download(self, path: str, local: str | os.PathLike[str], depth: int = 64) -> int:
        """Copy a workspace file or tree to `local` (a directory: created); the bytes copied."""
        dest = Path(local)
        dest.mkdir(parents=True, exist_ok=True)
        entries = await self.list(path, depth=depth, limit=100_000)
        top = _path(path).rstrip("/")
        total = 0
        for e in entries:
            if e.type != "file":
                continue
            rel = os.path.relpath(e.path, top) if e.path != top else os.path.basename(e.path)
            target = (dest / rel).resolve()
            if not target.is_relative_to(dest.resolve()):
                raise FileError(f"{e.path} would land outside {dest}", {"kind": "OutsideDestination"})
            target.parent.mkdir(parents=True, exist_ok=True)
            data = await self.read(e.path, format="bytes")
            target.write_bytes(data)
            total += len(data)
        return total


def _join(base: str, rel: str) -> str:
    return rel if base in ("", ".") else f"{base.rstrip('/')}/{rel}"
