"""API fuzzing: schemathesis against the OpenAPI a real broker serves (local backend, its own state dir).

Every generated request, valid or not, must get a documented status, a documented content type and a
body matching its schema, and never a 5xx. The short run here is bounded (FIREPOOL_FUZZ_EXAMPLES per
operation, a fixed seed); `make fuzz` runs the long one with FIREPOOL_FUZZ_EXAMPLES and _PHASES raised.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
# A ceiling of one pod per pool: generated jobs queue instead of filling the machine with sandboxes.
POOLS = """
pools:
  - {name: cpu, min_count: 0, max_count: 1, idle_timeout: 5}
"""


def schemathesis() -> str:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    assert found, "schemathesis is not installed (pip install -e '.[dev]')"
    return found


@pytest.mark.timeout(600)
def test_generated_requests_get_no_5xx_and_match_the_served_schema(broker_factory, tmp_path: Path) -> None:
    # One gateway kernel at a time, culled when idle: a generated `POST /api/kernels` gets its kernel or a
    # quick 429, never a wait behind the pool's one pod.
    broker = broker_factory(pools=POOLS, extra=("--gateway-max-kernels", "1", "--gateway-cull-idle", "5"))
    examples = os.environ.get("FIREPOOL_FUZZ_EXAMPLES", "8")
    phases = os.environ.get("FIREPOOL_FUZZ_PHASES", "coverage,fuzzing")
    max_time = os.environ.get("FIREPOOL_FUZZ_MAX_TIME")
    cmd = [schemathesis(), "run", f"{broker.url}/openapi.json", "--checks", CHECKS,
           "-H", f"Authorization: Bearer {broker.tokens['alice']}", "--max-examples", examples,
           "--seed", os.environ.get("FIREPOOL_FUZZ_SEED", "20261130"), "--phases", phases,
           "--request-timeout", "30", "--no-color", "--workers", "1", "--generation-database", "none",
           "--report", "ndjson", "--report-dir", str(tmp_path / "report"),
           *(["--max-time", max_time] if max_time else [])]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=590)
    summary = run.stdout[-6000:]
    print(summary)
    assert run.returncode == 0, f"schemathesis found failures:\n{summary}\nbroker log:\n{broker.log()[-3000:]}"
    health = broker.client().get("/healthz")
    assert health.status_code == 200 and health.json()["ok"]
    assert "Traceback" not in broker.log(), broker.log()[-3000:]
