"""Kept paths (`keep_paths`: a uv/pip cache, a model or compile cache) kept per caller, never shared.

A pod's kept path is a bind of a directory private to the pod (`pods/<name>/kept/<slug>`), because
bubblewrap's mounts are fixed when the pod starts and a warm, never-used pod has no caller yet. The
caller's cache lives on the host in `caches/<pool>/callers/<digest of the caller>/<slug>`, which no
sandbox ever binds. The broker moves content between the two only while none of the job's processes
run:

- check-in, at the pod's first launch (the moment its caller becomes known; pods never change callers):
  the caller's store is merged into the pod's kept dirs;
- check-out, after each clean reset and when the pod is deleted (its processes killed first): the pod's
  kept dirs are merged back into the caller's store.

A merge adds what is missing (hard links, a copy across filesystems) and never overwrites or deletes,
so two pods of one caller add to one cache; it never follows a symlink a job planted (symlinks are
copied as symlinks, resolved later only inside that caller's sandboxes) and skips special files. One
caller's writes can therefore only ever reach that caller's later pods.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger("firepool.kept")

"""Under a pod's root: the host side of its kept paths."""


def caller_store(state_dir: Path, pool: str, caller: str) -> Path:
    """The caller's own cache root for a pool (a digest: caller names may hold any character)."""
    digest = hashlib.sha256(caller.encode()).hexdigest()[:32]
    return state_dir / "caches" / pool / "callers" / digest


def _same_owner(dst: Path, st: os.stat_result) -> None:
    """A created entry keeps its source's owner and mode: a broker running as root merges files of the
    sandbox uid, which must stay usable by that uid in the caller's next pod."""
    try:
        os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    except PermissionError:
        pass  # an unprivileged broker: it and the sandbox share one uid already
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def _place(src: Path, dst: Path, mode: int) -> None:
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst, follow_symlinks=False)  # another filesystem, or protected hard links
        _same_owner(dst, os.lstat(src))


def merge_tree(src: Path, dst: Path) -> int:
    """Add to `dst` every file, symlink and directory of `src` that `dst` lacks; returns the entries added.

    Walks without following symlinks and without recursion (a hostile tree may be deep); entry types come
    from the directory listing and each target directory is listed once, so a merge with nothing to add
    costs two listings per directory, not a stat per file."""
    added = 0
    if not src.is_dir() or src.is_symlink():
        return 0
    dst.mkdir(parents=True, exist_ok=True, mode=0o700)
    stack = [(src, dst)]
    while stack:
        s, d = stack.pop()
        try:
            entries = list(os.scandir(s))
            present = {e.name: e.is_dir(follow_symlinks=False) for e in os.scandir(d)}
        except OSError as exc:
            log.warning("kept cache: cannot read %s: %s", s, exc)
            continue
        for entry in entries:
            target = d / entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in present:
                        target.mkdir(mode=0o700)
                        _same_owner(target, entry.stat(follow_symlinks=False))
                        added += 1
                    elif not present[entry.name]:
                        continue  # a file or a link stands there: never descend through it
                    stack.append((Path(entry.path), target))
                elif entry.name not in present and (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
                    _place(Path(entry.path), target, entry.stat(follow_symlinks=False).st_mode)
                    added += 1
            except FileExistsError:
                pass  # another pod of the same caller merged the same entry first
            except OSError as exc:  # one bad entry (a full disk, an unreadable file) skips that entry
                log.warning("kept cache: skipped %s: %s", entry.path, exc)
    return added


def check_in(store: Path, pod_kept: Path, slugs: list[str]) -> int:
    """The caller's cache into a pod that just got its caller."""
    return sum(merge_tree(store / slug, pod_kept / slug) for slug in slugs)


def check_out(pod_kept: Path, store: Path) -> int:
    """A pod's kept content back into its caller's store (no job process of the pod alive)."""
    if not pod_kept.is_dir():
        return 0
    return sum(merge_tree(Path(e.path), store / e.name) for e in os.scandir(pod_kept)
               if e.is_dir(follow_symlinks=False))
