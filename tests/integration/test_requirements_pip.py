"""The pip fallback of requirement installs, for images without uv: real pip, local wheels, no network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.wheels import write_wheel
from firepool_agent import requirements

pytestmark = pytest.mark.integration


def test_without_uv_pip_installs_the_pins_and_the_marker_rules_hold(tmp_path: Path, monkeypatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        write_wheel(wheels, "alpha", version)
        write_wheel(wheels, "beta", version)
    monkeypatch.setattr(requirements.shutil, "which", lambda *a, **k: None)
    deps = tmp_path / "deps"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    pins = f"--no-index\n--find-links {wheels}\nalpha==1.0\nbeta==1.0\n"
    first = requirements.ensure(pins, str(deps), env)
    assert first.installer == "pip" and not first.marker_hit
    assert requirements.ensure(pins, str(deps), env).marker_hit
    changed = requirements.ensure(pins.replace("beta==1.0", "beta==2.0"), str(deps), env)
    assert changed.installer == "pip"
    out = subprocess.run([sys.executable, "-S", "-c", "import alpha, beta; print(alpha.VERSION, beta.VERSION)"],
                         env={"PYTHONPATH": requirements.site_dir(str(deps))}, capture_output=True, text=True)
    assert out.stdout.strip() == "1.0 2.0", out.stderr
    with pytest.raises(requirements.InstallFailed) as failed:
        requirements.ensure(pins.replace("beta==1.0", "beta==7.0"), str(deps), env)
    assert failed.value.message.startswith("pip exited") and "beta" in failed.value.message
