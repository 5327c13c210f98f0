"""Paths the MCP tools take stay inside the session's workspace, as the tools' docs say.

`write_files`, `read_file`, `list_files`, `run_in_sandbox(cwd=)` and the `sandbox://{session}/files/{path}`
resource take paths relative to the workspace. An absolute path, or one whose `..` climbs out of it, is
refused before any job runs, with a message the model can act on. This is the tools' contract, not the
isolation boundary: a command run in the sandbox may read whatever the sandbox holds (docs/security.md);
the file helper in the sandbox also refuses a path that a symlink leads out of the workspace
(broker.sandbox.wrappers).
"""

from __future__ import annotations

import posixpath


class OutsideWorkspace(ValueError):
    """A path that is absolute or leaves the workspace; the message says which and what to give instead."""


def inside_workspace(path: str, what: str = "path") -> str:
    """`path` when it names something inside the workspace; OutsideWorkspace otherwise."""
    if "\x00" in path:
        raise OutsideWorkspace(f"{what} {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise OutsideWorkspace(f"{what} {path!r} is absolute: give a path relative to the workspace "
                               "(the directory every call starts in)")
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise OutsideWorkspace(f"{what} {path!r} leaves the workspace: give a path inside it "
                               "(relative, without climbing above it with '..')")
    return path
