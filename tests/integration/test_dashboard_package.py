"""A non-editable install ships the dashboard: its templates and static assets are package data of the wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_every_template_and_static_asset(tmp_path: Path) -> None:
    had_build = (ROOT / "build").exists()
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], check=True, cwd=tmp_path, timeout=300)
    finally:
        if not had_build:  # setuptools builds in the checkout: leave it as it was
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    wheel = next(tmp_path.glob("firepool-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"broker/ui/{p.relative_to(ROOT / 'broker' / 'ui').as_posix()}"
              for sub in ("templates", "static") for p in (ROOT / "broker" / "ui" / sub).iterdir()}
    assert wanted and wanted <= names, sorted(wanted - names)
    assert "broker/ui/static/uPlot.LICENSE" in names and "broker/store/migrations/versions/0004_ui_indexes.py" in names
