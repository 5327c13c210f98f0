"""Building a code package on the caller's side: a deterministic zip of a directory tree.

The same tree always gives the same bytes, hence the same digest (sorted entries, fixed timestamps
and modes), so an unchanged tree is never uploaded twice. Paths matched by `.gitignore`-style
patterns (the tree's own `.gitignore` and `.firepoolignore`, plus any given) are left out, and so is
`.git/`. Symlinks and special files are refused here, as the broker would refuse them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.errors import UnsafePackage

IGNORE_FILES = (".gitignore", ".firepoolignore")
EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _compile(line: str) -> _Pattern | None:
    line = line.rstrip("\n").rstrip()
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line  # a slash anywhere but the end anchors the pattern at the tree's root
    line = line.lstrip("/")
    parts = []
    for piece in re.split(r"(\*\*/|/\*\*|\*\*)", line):
        if piece == "**/":
            parts.append(r"(?:.*/)?")
        elif piece in ("/**", "**"):
            parts.append(r"(?:/.*)?" if piece == "/**" else r".*")
        else:
            # fnmatch's `*` crosses "/"; gitignore's stays inside one path component.
            parts.append(fnmatch.translate(piece).removeprefix("(?s:").removesuffix(r")\Z").replace(".*", "[^/]*"))
    body = "".join(parts)
    regex = rf"^{body}$" if anchored else rf"^(?:.*/)?{body}$"
    return _Pattern(re.compile(regex, re.S), negate, dir_only)


def _patterns(lines: Iterable[str]) -> list[_Pattern]:
    return [p for p in (_compile(line) for line in lines) if p is not None]


def _ignored(rel: str, is_dir: bool, patterns: Sequence[_Pattern]) -> bool:
    verdict = False
    for p in patterns:
        if (is_dir or not p.dir_only) and p.regex.match(rel):
            verdict = not p.negate
    return verdict


def files_of(root: Path, excludes: Sequence[str] = ()) -> list[tuple[str, Path, bool]]:
    """(relative path, file, executable) of every file to pack, sorted; UnsafePackage on links or devices."""
    lines = list(excludes)
    for name in IGNORE_FILES:
        ignore = root / name
        if ignore.is_file():
            lines += ignore.read_text(errors="replace").splitlines()
    patterns = _patterns([".git/", *lines])
    found: list[tuple[str, Path, bool]] = []

    def walk(directory: Path, prefix: str) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if _ignored(rel, is_dir, patterns):
                continue
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePackage(f"{rel} is a symlink; packages hold only files and directories", {"entry": rel})
            if is_dir:
                walk(Path(entry.path), rel + "/")
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, Path(entry.path), bool(st.st_mode & 0o111)))
            else:
                raise UnsafePackage(f"{rel} is a special file", {"entry": rel})

    walk(root, "")
    return found


def build(root: str | os.PathLike[str], excludes: Sequence[str] = ()) -> tuple[bytes, str]:
    """The zip of the tree under `root` and its SHA-256; the same tree gives the same bytes."""
    base = Path(root)
    if not base.is_dir():
        raise UnsafePackage(f"{root} is not a directory")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for rel, path, executable in files_of(base, excludes):
            info = zipfile.ZipInfo(rel, date_time=EPOCH)
            info.create_system = 3
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()
