"""`make demo`: start a broker on the embedded defaults, run the agent loop and the RL loop through it,
print their tables, stop the broker.

The broker uses SQLite and the local backend in the default state dir ($XDG_DATA_HOME/firepool) and
listens on 127.0.0.1 (port 8321, or a free one if that is taken). When a broker is already running for
that state dir (or FIREPOOL_URL names one), the demo uses it and leaves it running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent


def say(line: str) -> None:
    print(f"==> {line}", flush=True)


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return int(s.getsockname()[1])
            except OSError:
                continue
    raise SystemExit("no free port")


def healthy(url: str) -> dict[str, object] | None:
    try:
        health = httpx.get(url + "/healthz", timeout=1).json()
    except (httpx.HTTPError, ValueError):
        return None
    return health if isinstance(health, dict) and health.get("ok") else None


def start_broker(state_dir: Path, port: int) -> tuple[subprocess.Popen[bytes], str, dict[str, object]]:
    url = f"http://127.0.0.1:{port}"
    log_path = state_dir / "demo-broker.log"
    state_dir.mkdir(parents=True, exist_ok=True)
    say(f"starting a broker: state dir {state_dir}, {url} (log: {log_path})")
    with open(log_path, "ab") as log:
        broker = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", "--port", str(port),
                                   "--state-dir", str(state_dir)], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    started = time.monotonic()
    last_note = 0.0
    while True:
        if broker.poll() is not None:
            print(log_path.read_text()[-2000:])
            raise SystemExit("the broker exited during start (its log is above)")
        health = healthy(url)
        if health is not None:
            return broker, url, health
        elapsed = time.monotonic() - started
        if elapsed > 60:
            raise SystemExit("the broker did not answer /healthz within 60 s")
        if elapsed - last_note >= 2:
            say(f"waiting for the broker ({elapsed:.0f} s)")
            last_note = elapsed
        time.sleep(0.2)


def stop_broker(broker: subprocess.Popen[bytes]) -> None:
    os.killpg(broker.pid, signal.SIGTERM)
    try:
        broker.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(broker.pid, signal.SIGKILL)
    say("broker stopped")


def main() -> int:
    from broker.locations import DEFAULT_PORT, discover, state_dir_for

    state_dir = state_dir_for()
    found = discover()
    broker = None
    health = healthy(found.url) if found.source in ("environment", "broker.json") else None
    if health is not None:
        url, token = found.url, found.token
        say(f"using the broker already running at {url}")
    else:
        broker, url, health = start_broker(state_dir, free_port(DEFAULT_PORT))
        token = (state_dir / "token").read_text().strip()
    try:
        say(f"broker ready: backend {health['backend']}, isolated {health['isolated']}, pools {health['pools']}")
        env = {**os.environ, "FIREPOOL_URL": url, "FIREPOOL_TOKEN": token}
        rc = 0
        for example in ("agent_loop.py", "rl_loop.py"):
            say(f"running examples/{example}")
            rc |= subprocess.call([sys.executable, str(HERE / example)], env=env)
        say("pools after the loops (firepool pools)")
        subprocess.call([sys.executable, "-m", "broker.cli", "pools"], env=env)
        return rc
    finally:
        if broker is not None:
            stop_broker(broker)


if __name__ == "__main__":
    sys.exit(main())
