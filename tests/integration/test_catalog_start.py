"""A catalog value that cannot work stops `firepool serve` at once, and a SIGHUP reload keeps the old catalog.

Before, `template: {memory: 256Potatoes}` let the broker start and every pod create of the pool fail,
its jobs QUEUED for ever with a warning every 2 s as the only sign.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import free_port, run_job

pytestmark = pytest.mark.integration

GOOD = "pools:\n  - name: cpu\n    max_count: 1\n    template: {memory: 512Mi, workspace_size: 64Mi}\n"


@pytest.mark.parametrize(("template", "names"), [
    ("{memory: 256Potatoes}", ("cpu", "template.memory", "256Potatoes")),
    ("{workspace_size: 1Mi}", ("cpu", "template.workspace_size", "1Mi")),
    ("{tmp_size: -5}", ("cpu", "template.tmp_size", "-5")),
    ("{binds: [{src: /srv, dst: /proc}]}", ("cpu", "template.binds", "/proc")),
])
def test_serve_with_an_impossible_template_value_exits_at_once_with_one_line(tmp_path: Path, template: str,
                                                                            names: tuple[str, ...]) -> None:
    pools = tmp_path / "bad.yaml"
    pools.write_text(f"pools: [{{name: cpu, template: {template}}}]\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--pools", str(pools), "--port",
                           str(free_port()), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=40)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode != 0 and time.monotonic() - began < 40
    assert "Traceback" not in output and len(output.splitlines()) == 1, output
    assert all(name in output for name in names), output


def test_a_sighup_with_a_bad_catalog_keeps_the_running_one_and_logs_one_line(broker_factory) -> None:
    b = broker_factory(pools=GOOD)
    pools_file = b.state_dir.parent / f"{b.state_dir.name}-pools.yaml"
    pools_file.write_text(GOOD.replace("512Mi", "256Potatoes"))
    assert b.proc is not None
    b.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "catalog reload failed" not in b.log():
        assert time.monotonic() < deadline, b.log()[-2000:]
        time.sleep(0.1)
    failed = [line for line in b.log().splitlines() if "catalog reload failed" in line]
    assert len(failed) == 1 and "template.memory" in failed[0] and "256Potatoes" in failed[0], failed
    assert "Traceback" not in b.log()
    job = run_job(b.client(), {"pool": "cpu", "command": ["python3", "-c", "print('still here')"]}, wait=120)
    assert job["state"] == "SUCCEEDED", job
