"""Building a code package on the caller's side: a deterministic zip of a directory tree.

The same tree always gives the same bytes, hence the same digest (sorted entries, fixed timestamps
and modes), so an unchanged tree is never uploaded twice. Paths matched by gitignore patterns (git's
own rules through pathspec: the `.gitignore` and `.firepoolignore` of the tree and of each directory
in it, plus any given) are left out, and so is `.git/`. Symlinks and special files are refused here,
as the broker would refuse them.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from broker.errors import UnsafePackage

IGNORE_FILES = (".gitignore", ".firepoolignore")
EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class _Level:
    """The ignore files of one directory, matched against paths relative to it (as git does)."""

    prefix: str
    spec: pathspec.GitIgnoreSpec


def _level(directory: Path, prefix: str) -> _Level | None:
    lines: list[str] = []
    for name in IGNORE_FILES:
        ignore = directory / name
        if ignore.is_file() and not ignore.is_symlink():
            lines += ignore.read_text(errors="replace").splitlines()
    return _Level(prefix, pathspec.GitIgnoreSpec.from_lines(lines)) if lines else None


def _ignored(rel: str, is_dir: bool, excludes: pathspec.GitIgnoreSpec, levels: Sequence[_Level]) -> bool:
    """Git's precedence: the given excludes first, then the deepest ignore file with a matching pattern,
    whose last matching pattern decides (a `!` pattern re-includes)."""
    path = rel + "/" if is_dir else rel  # so that `dir/` patterns match directories only
    verdict = excludes.check_file(path).include
    for level in reversed(levels):
        if verdict is not None:
            break
        verdict = level.spec.check_file(path[len(level.prefix):]).include
    return bool(verdict)


def files_of(root: Path, excludes: Sequence[str] = ()) -> list[tuple[str, Path, bool]]:
    """(relative path, file, executable) of every file to pack, sorted; UnsafePackage on links or devices.

    Left out: `.git/`, whatever `excludes` (gitignore patterns, relative to `root`) match, and whatever
    the `.gitignore` and `.firepoolignore` files of `root` and of every directory under it match."""
    given = pathspec.GitIgnoreSpec.from_lines(excludes)
    found: list[tuple[str, Path, bool]] = []

    def walk(directory: Path, prefix: str, levels: tuple[_Level, ...]) -> None:
        here = _level(directory, prefix)
        if here is not None:
            levels = (*levels, here)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if (is_dir and entry.name == ".git") or _ignored(rel, is_dir, given, levels):
                continue
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePackage(f"{rel} is a symlink; packages hold only files and directories", {"entry": rel})
            if is_dir:
                walk(Path(entry.path), rel + "/", levels)
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, Path(entry.path), bool(st.st_mode & 0o111)))
            else:
                raise UnsafePackage(f"{rel} is a special file", {"entry": rel})

    walk(root, "", ())
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
