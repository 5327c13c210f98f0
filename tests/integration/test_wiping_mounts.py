"""The wipe keeps mount points, and learns of a mount or unmount made after it first read the table."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from firepool_agent.wiping import empty_dir, mounts_under

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]


def test_a_mount_made_after_the_table_was_read_is_kept_and_an_unmount_is_noticed(tmp_path: Path) -> None:
    point = tmp_path / "bound"
    point.mkdir()
    assert mounts_under(str(tmp_path)) == ()  # read (and remembered) before the mount
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], check=True)
    try:
        (point / "kept").write_text("the pod's")
        (tmp_path / "job-file").write_text("the job's")
        assert mounts_under(str(tmp_path)) == (str(point),)
        assert empty_dir(str(tmp_path)) == []
        assert sorted(os.listdir(tmp_path)) == ["bound"] and (point / "kept").exists()
    finally:
        subprocess.run(["umount", "-l", str(point)], check=True)
    assert mounts_under(str(tmp_path)) == ()
    assert empty_dir(str(tmp_path)) == [] and os.listdir(tmp_path) == []
