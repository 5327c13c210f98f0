"""The agent's requirement markers against a stand-in `uv` on PATH that logs its calls (no real installs)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from firepool_agent import requirements


@pytest.fixture
def fake_uv(tmp_path: Path) -> dict[str, str]:
    """A `uv` that appends its argv to calls.log and fails when the requirements name `broken`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "uv"
    script.write_text("#!/bin/sh\n"
                      f"echo \"$@\" >> {tmp_path}/calls.log\n"
                      "req=\"$(eval echo \\${$#})\"\n"
                      "if grep -q broken \"$req\"; then echo 'resolving...'; echo 'error: no version of broken'; exit 2; fi\n"
                      "if grep -q slow \"$req\"; then sleep 5; fi\n")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def markers(deps: Path) -> list[str]:
    return sorted(os.path.basename(m) for m in glob.glob(f"{deps}/site/{requirements.MARKER_PREFIX}*"))


def test_same_pins_hit_the_marker_and_a_changed_pin_installs_again_with_one_marker(tmp_path, fake_uv) -> None:
    deps = tmp_path / "deps"
    first = requirements.ensure("alpha==1.0\n", str(deps), fake_uv)
    assert (first.marker_hit, first.installer) == (False, "uv") and len(calls(tmp_path)) == 1
    assert "--target" in calls(tmp_path)[0] and f"{deps}/site" in calls(tmp_path)[0]
    again = requirements.ensure("alpha==1.0\n", str(deps), fake_uv)
    assert again.marker_hit and again.installer is None and len(calls(tmp_path)) == 1
    changed = requirements.ensure("alpha==2.0\n", str(deps), fake_uv)
    assert not changed.marker_hit and len(calls(tmp_path)) == 2
    assert markers(deps) == [os.path.basename(requirements.marker_path(str(deps), "alpha==2.0\n"))]


def test_a_failed_install_reports_the_last_lines_and_leaves_no_marker(tmp_path, fake_uv) -> None:
    deps = tmp_path / "deps"
    requirements.ensure("alpha==1.0\n", str(deps), fake_uv)
    with pytest.raises(requirements.InstallFailed) as failed:
        requirements.ensure("alpha==1.0\nbroken==9\n", str(deps), fake_uv)
    assert "uv exited 2" in failed.value.message and "no version of broken" in failed.value.message
    assert markers(deps) == []
    assert not requirements.ensure("alpha==1.0\n", str(deps), fake_uv).marker_hit  # the old pins install again


def test_an_install_past_its_timeout_is_killed_and_fails(tmp_path, fake_uv) -> None:
    with pytest.raises(requirements.InstallFailed) as failed:
        requirements.ensure("slow==1\n", str(tmp_path / "deps"), fake_uv, timeout_s=0.2)
    assert "did not finish" in failed.value.message and failed.value.duration_s < 3
