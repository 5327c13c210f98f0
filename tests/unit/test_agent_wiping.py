"""Emptying a directory: everything goes except kept paths, links are removed and never followed."""

from __future__ import annotations

import os
from pathlib import Path

from firepool_agent.wiping import empty_dir, leftovers


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_everything_inside_goes_and_the_directory_stays(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "a" / "b").mkdir(parents=True)
    (work / "a" / "b" / "f").write_text("x")
    (work / "top").write_text("y")
    (work / ".hidden").write_text("z")
    assert empty_dir(str(work)) == []
    assert work.is_dir() and tree(work) == []
    assert leftovers(str(work)) == []


def test_symlinks_are_removed_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(outside, work / "link-to-dir")
    os.symlink(outside / "precious", work / "link-to-file")
    assert empty_dir(str(work)) == []
    assert tree(work) == [] and (outside / "precious").read_text() == "keep me"


def test_keep_paths_and_their_parents_survive(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "cache" / "models").mkdir(parents=True)
    (work / "cache" / "models" / "m").write_text("weights")
    (work / "cache" / "junk").write_text("x")
    (work / "scratch").write_text("x")
    keep = (str(work / "cache" / "models"),)
    assert empty_dir(str(work), keep) == []
    assert tree(work) == ["cache", "cache/models", "cache/models/m"]
    assert leftovers(str(work), keep) == []
    assert leftovers(str(work)) == [str(work / "cache")]


def test_a_missing_directory_is_already_empty(tmp_path: Path) -> None:
    assert empty_dir(str(tmp_path / "never-made")) == []
    assert leftovers(str(tmp_path / "never-made")) == []
