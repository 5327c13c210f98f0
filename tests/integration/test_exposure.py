"""Exposure and start-up, on real processes: plain HTTP beyond loopback only by request, HTTPS with
`--tls-cert/--tls-key`, one-line refusals of bad tokens files, missing database drivers and open
clear-text token files, and `firepool mcp --http` serving `sha256:` client tokens."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, delete_pods, free_port
from tests.integration.test_cli_messages import assert_one_line, firepool, no_broker_env

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "broker.cli"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def test_serve_beyond_loopback_over_plain_http_exits_with_what_to_do(tmp_path: Path) -> None:
    started = time.monotonic()
    r = firepool("serve", "--host", "0.0.0.0", "--port", str(free_port()), "--state-dir", str(tmp_path / "s"),
                 env=no_broker_env(tmp_path), timeout=20)
    assert time.monotonic() - started < 20
    assert_one_line(r, "--host 0.0.0.0", "--tls-cert", "--insecure-http")


def test_insecure_http_starts_and_says_so_in_the_log_and_healthz(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", extra=("--host", "0.0.0.0", "--insecure-http"))
    try:
        assert httpx.get(broker.url + "/healthz").json()["transport"] == "http-insecure"
        assert "PLAIN HTTP" in broker.log() and "--insecure-http" in broker.log()
        r = httpx.post(broker.url + "/ui/login", data={"token": broker.tokens["alice"]})
        assert "secure" in r.headers["set-cookie"].lower()  # beyond loopback a browser should come through TLS
    finally:
        broker.stop()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_cert_and_key_serve_https(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    cert, key = self_signed(tmp_path)
    trusting = ssl.create_default_context(cafile=str(cert))
    port, state = free_port(), tmp_path / "s"
    log = tmp_path / "broker.log"
    with open(log, "wb") as out:
        spawned.append(subprocess.Popen([*CLI, "serve", "--port", str(port), "--state-dir", str(state),
                                         "--virtual-gpus", "0", "--tls-cert", str(cert), "--tls-key", str(key)],
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                        env=no_broker_env(tmp_path)))
    try:
        deadline, health = time.monotonic() + 40, None
        while time.monotonic() < deadline and health is None:
            assert spawned[0].poll() is None, log.read_text()
            try:
                health = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusting, timeout=2)
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 200, log.read_text()
        assert health.json()["transport"] == "https"
        assert json.loads((state / "broker.json").read_text())["url"].startswith("https://")
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the same port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        delete_pods(state)


def test_a_malformed_tokens_file_is_one_line_naming_where(tmp_path: Path) -> None:
    env = no_broker_env(tmp_path)
    bad_json = tmp_path / "bad-json.json"
    bad_json.write_text('{\n  "sha256:' + "a" * 64 + '": "alice",\n  "oops",\n  "x": "y"\n}\n')
    assert_one_line(firepool("serve", "--tokens", str(bad_json), env=env), str(bad_json), "line 3")
    secret = "plain-secret-token-value"
    bad_entry = tmp_path / "bad-entry.json"
    bad_entry.write_text(json.dumps({"sha256:" + "a" * 64: "alice", secret: {"caller": "bob", "admin": "yes"}},
                                    indent=2))
    line = assert_one_line(firepool("serve", "--tokens", str(bad_entry), env=env), "line 3", "entry 2")
    assert secret not in line


def test_a_db_url_whose_driver_is_missing_names_the_extra(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    for module in ("psycopg", "pymysql"):
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text(f"raise ModuleNotFoundError('No module named {module}')\n")
    env = {**no_broker_env(tmp_path), "PYTHONPATH": f"{shadow}:{os.environ.get('PYTHONPATH', '')}"}
    line = assert_one_line(firepool("serve", "--db", "postgresql://u:hunter2@127.0.0.1/db", env=env),
                           "pip install -e '.[postgres]'")
    assert "hunter2" not in line
    assert_one_line(firepool("serve", "--db", "mysql://root@127.0.0.1/db", env=env), "pip install -e '.[mysql]'")


def _mcp(tmp_path: Path, tokens: dict[str, str], broker_tokens: dict[str, str], mode: int,
         spawned: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], int, Path]:
    tf, bt = tmp_path / "mcp-tokens.json", tmp_path / "broker-tokens.json"
    tf.write_text(json.dumps(tokens))
    tf.chmod(0o600)
    bt.write_text(json.dumps(broker_tokens))
    bt.chmod(mode)
    port, log = free_port(), tmp_path / "mcp.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "mcp", "--http", "--port", str(port), "--tokens", str(tf),
                                 "--broker-tokens", str(bt)], stdout=subprocess.DEVNULL, stderr=out,
                                start_new_session=True, env=no_broker_env(tmp_path))
    spawned.append(proc)
    return proc, port, log


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "0"}}}


def test_mcp_http_serves_a_sha256_client_token(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    digest = hashlib.sha256(b"mcp-alice-token").hexdigest()
    proc, port, log = _mcp(tmp_path, {f"sha256:{digest}": "alice"}, {"broker-alice-token": "alice"}, 0o600, spawned)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    deadline, r = time.monotonic() + 40, None
    while time.monotonic() < deadline and r is None:
        assert proc.poll() is None, log.read_text()
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, timeout=5,
                           headers={**headers, "Authorization": "Bearer mcp-alice-token"})
        except httpx.HTTPError:
            time.sleep(0.1)
    assert r is not None and r.status_code == 200, (r, log.read_text())
    assert "serverInfo" in r.text
    wrong = httpx.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, timeout=5,
                       headers={**headers, "Authorization": f"Bearer sha256:{digest}"})
    assert wrong.status_code == 401


def test_mcp_http_refuses_a_group_readable_broker_tokens_file(tmp_path: Path,
                                                              spawned: list[subprocess.Popen[bytes]]) -> None:
    proc, _, log = _mcp(tmp_path, {"mcp-alice-token": "alice"}, {"broker-alice-token": "alice"}, 0o640, spawned)
    assert proc.wait(30) != 0
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1 and "0640 are too open" in lines[0] and "broker-tokens.json" in lines[0], lines
    assert "broker-alice-token" not in lines[0]
