"""The official TypeScript `e2b` package from npm (tests/integration/e2b_ts, `npm ci` by `make test-setup`)
drives one flow against the broker's E2B layer: the same wire as the Python SDK's, through undici."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerProcess, node_client

pytestmark = pytest.mark.integration
CLIENT_DIR = Path(__file__).parent / "e2b_ts"


def test_the_typescript_sdk_creates_runs_streams_and_reconnects(broker: BrokerProcess) -> None:
    node = node_client(CLIENT_DIR, "e2b")
    env = {**os.environ, "E2B_API_URL": broker.url + "/e2b", "E2B_SANDBOX_URL": broker.url + "/e2b/sandbox",
           "E2B_API_KEY": broker.tokens["alice"]}
    done = subprocess.run([node, str(CLIENT_DIR / "drive.mjs")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["exitCode"] == 0 and seen["runStdout"] == "line1\nline2\n"
    assert "".join(seen["stdout"]) == "line1\nline2\n"
    assert seen["read"] == "from ts" and "ts.txt" in seen["listed"]
    assert seen["killed"] is True and seen["againRead"] == "from ts"
    assert seen["running"] is True and seen["kill"] is True and seen["afterKill"] is False
