"""Merging a pod's kept directory into its caller's store: adds what is missing, follows no planted symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.backends.kept import caller_store, check_in, check_out, merge_tree
from broker.backends.sandboxing import PodDirs
from broker.backends.volumes import shared_dir, volume_binds
from broker.pools import PoolSpec


def test_merge_adds_missing_entries_and_never_overwrites(tmp_path: Path) -> None:
    src, dst = tmp_path / "pod", tmp_path / "store"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "new").write_text("new")
    (src / "same").write_text("from the pod")
    dst.mkdir()
    (dst / "same").write_text("already stored")
    assert merge_tree(src, dst) == 3  # a, a/b, a/b/new
    assert (dst / "a" / "b" / "new").read_text() == "new"
    assert (dst / "same").read_text() == "already stored"
    assert merge_tree(src, dst) == 0  # idempotent


def test_a_planted_symlink_is_copied_as_a_link_and_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("do not read")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("host dir")
    src, dst = tmp_path / "pod", tmp_path / "store"
    src.mkdir()
    (src / "file-link").symlink_to(secret)
    (src / "dir-link").symlink_to(outside)
    os.mkfifo(src / "fifo")
    merge_tree(src, dst)
    assert (dst / "file-link").is_symlink() and os.readlink(dst / "file-link") == str(secret)
    assert (dst / "dir-link").is_symlink() and not (outside / "file-link").exists()
    assert not os.path.lexists(dst / "fifo")  # special files are not carried


def test_a_symlink_where_the_store_has_a_directory_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    src, dst = tmp_path / "pod", tmp_path / "store"
    (src / "d").mkdir(parents=True)
    (src / "d" / "payload").write_text("x")
    dst.mkdir()
    (dst / "d").symlink_to(victim)  # a store entry that is a link (from an earlier merge) is not descended
    merge_tree(src, dst)
    assert list(victim.iterdir()) == []


def test_callers_get_distinct_stores_and_a_round_trip_through_pods(tmp_path: Path) -> None:
    alice, bob = caller_store(tmp_path, "cpu", "alice"), caller_store(tmp_path, "cpu", "bob")
    assert alice != bob and alice.parent == bob.parent
    assert caller_store(tmp_path, "cpu", "../../etc").parent == alice.parent  # names never make paths
    pod1, pod2 = tmp_path / "pod1" / "kept", tmp_path / "pod2" / "kept"
    (pod1 / "slug").mkdir(parents=True)
    (pod1 / "slug" / "wheel").write_text("w")
    check_out(pod1, alice)
    (pod2 / "slug").mkdir(parents=True)
    check_in(alice, pod2, ["slug"])
    assert (pod2 / "slug" / "wheel").read_text() == "w"
    assert not bob.exists()


def test_shared_paths_bind_read_only_and_keep_paths_per_pod(tmp_path: Path) -> None:
    pool = PoolSpec(name="cpu", keep_paths=("/cache/uv",), shared_paths=("/cache/models",))
    binds = {b.dst: b for b in volume_binds(tmp_path, pool, PodDirs(tmp_path / "pods" / "p1"))}
    assert binds["/cache/models"].ro and binds["/cache/models"].src == str(shared_dir(tmp_path, "cpu", "/cache/models"))
    assert not binds["/cache/uv"].ro and binds["/cache/uv"].src.startswith(str(tmp_path / "pods" / "p1" / "disk" / "kept"))
    twice = PoolSpec(name="cpu", keep_paths=("/cache",), shared_paths=("/cache/",))
    with pytest.raises(ValueError, match="twice"):
        volume_binds(tmp_path, twice, PodDirs(tmp_path / "pods" / "p2"))
