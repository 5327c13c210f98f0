"""The package builder leaves out what git would: gitignore patterns from every level, .firepoolignore, --exclude."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.errors import UnsafePackage
from broker.packaging import files_of


def packed(tree: Path, files: Sequence[str], ignores: dict[str, str], excludes: Sequence[str] = ()) -> list[str]:
    for rel in files:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    for rel, text in ignores.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return [rel for rel, _, _ in files_of(tree, excludes) if not rel.endswith(("/.gitignore", ".firepoolignore"))
            and rel != ".gitignore"]


def test_negation_re_includes_a_file_an_earlier_pattern_left_out(tmp_path: Path) -> None:
    names = packed(tmp_path, ["a.log", "keep.log", "sub/keep.log", "main.py"], {".gitignore": "*.log\n!keep.log\n"})
    assert names == ["keep.log", "main.py", "sub/keep.log"]


def test_a_file_inside_an_ignored_directory_cannot_be_re_included(tmp_path: Path) -> None:
    names = packed(tmp_path, ["out/x.bin", "out/keep.txt", "main.py"], {".gitignore": "out/\n!out/keep.txt\n"})
    assert names == ["main.py"]


def test_double_star_matches_any_depth(tmp_path: Path) -> None:
    files = ["a/b.txt", "a/x/b.txt", "a/x/y/b.txt", "b.txt", "c/cache/z", "c/d/cache/z", "e/f.tmp", "e/g/h.tmp"]
    names = packed(tmp_path, files, {".gitignore": "a/**/b.txt\n**/cache\ne/**\n"})
    assert names == ["b.txt"]


def test_a_trailing_slash_matches_directories_only(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    names = packed(tmp_path, ["build", "src/build/o.o", "src/main.c"], {".gitignore": "build/\n"})
    assert names == ["build", "src/main.c"]  # the file named build stays, every directory named build goes


def test_a_leading_or_middle_slash_anchors_the_pattern_at_its_directory(tmp_path: Path) -> None:
    files = ["top.txt", "sub/top.txt", "doc/x.txt", "doc/deep/x.txt", "sub/doc/x.txt"]
    names = packed(tmp_path, files, {".gitignore": "/top.txt\ndoc/*.txt\n"})
    assert names == ["doc/deep/x.txt", "sub/doc/x.txt", "sub/top.txt"]


def test_a_star_does_not_cross_a_slash(tmp_path: Path) -> None:
    names = packed(tmp_path, ["src/a.py", "src/pkg/b.py", "c.py"], {".gitignore": "src/*.py\n"})
    assert names == ["c.py", "src/pkg/b.py"]


def test_a_nested_gitignore_applies_below_its_directory_and_overrides_the_root(tmp_path: Path) -> None:
    files = ["x.dat", "lib/x.dat", "lib/tmp.txt", "tmp.txt", "lib/sub/tmp.txt", "other/y.dat"]
    names = packed(tmp_path, files, {".gitignore": "*.dat\n", "lib/.gitignore": "!x.dat\n/tmp.txt\n"})
    assert names == ["lib/sub/tmp.txt", "lib/x.dat", "tmp.txt"]


def test_firepoolignore_adds_to_gitignore(tmp_path: Path) -> None:
    names = packed(tmp_path, ["data/a.bin", "a.pyc", "main.py", "pkg/data/b.bin"],
                   {".gitignore": "*.pyc\n", ".firepoolignore": "/data/\n"})
    assert names == ["main.py", "pkg/data/b.bin"]


def test_excludes_win_over_a_negation_in_an_ignore_file(tmp_path: Path) -> None:
    names = packed(tmp_path, ["keep.log", "main.py", "notes/a.md"], {".gitignore": "*.log\n!keep.log\n"},
                   excludes=["keep.log", "notes/"])
    assert names == ["main.py"]


def test_comments_blank_lines_and_escaped_hash_follow_git(tmp_path: Path) -> None:
    names = packed(tmp_path, ["#file", "a.txt", "b.txt"], {".gitignore": "# a comment\n\n\\#file\n   \nb.txt\n"})
    assert names == ["a.txt"]


def test_git_metadata_is_never_packed_and_cannot_be_re_included(tmp_path: Path) -> None:
    names = packed(tmp_path, [".git/HEAD", "sub/.git/config", "main.py"], {".gitignore": "!.git/\n"})
    assert names == ["main.py"]


def test_an_ignored_symlink_is_not_refused_but_a_packed_one_is(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "python").symlink_to("/usr/bin/python3")
    assert packed(tmp_path, ["main.py"], {".gitignore": "venv/\n"}) == ["main.py"]
    (tmp_path / ".gitignore").write_text("")
    with pytest.raises(UnsafePackage, match="venv/python is a symlink"):
        files_of(tmp_path)
