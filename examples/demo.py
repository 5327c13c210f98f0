"""`make demo`: start a broker on the embedded defaults, run the agent loop and the RL loop through it,
print their tables, stop the broker.

The broker uses SQLite and the local backend in the default state dir ($XDG_DATA_HOME/firepool) and
listens on 127.0.0.1 (port 8321, or a free one if that is taken).
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


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return int(s.getsockname()[1])
            except OSError:
                continue
    raise SystemExit("no free port")


def main() -> int:
    from broker.locations import DEFAULT_PORT, default_state_dir

    state_dir = default_state_dir()
    port = free_port(DEFAULT_PORT)
    url = f"http://127.0.0.1:{port}"
    log_path = state_dir / "demo-broker.log"
    state_dir.mkdir(parents=True, exist_ok=True)
    print(f"starting broker: state dir {state_dir}, {url} (log: {log_path})")
    with open(log_path, "ab") as log:
        broker = subprocess.Popen([sys.executable, "-m", "broker.cli", "serve", "--port", str(port),
                                   "--state-dir", str(state_dir)], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if broker.poll() is not None:
                print(log_path.read_text()[-2000:])
                raise SystemExit("the broker exited during start")
            try:
                health = httpx.get(url + "/healthz", timeout=1).json()
                if health.get("ok"):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the broker did not answer /healthz within 60 s")
            time.sleep(0.2)
        print(f"broker ready: backend {health['backend']}, isolated {health['isolated']}, pools {health['pools']}")
        env = {**os.environ, "FIREPOOL_URL": url, "FIREPOOL_TOKEN": (state_dir / "token").read_text().strip()}
        rc = 0
        for example in ("agent_loop.py", "rl_loop.py"):
            rc |= subprocess.call([sys.executable, str(HERE / example)], env=env)
        subprocess.call([sys.executable, "-m", "broker.cli", "pools"], env=env)
        return rc
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        try:
            broker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(broker.pid, signal.SIGKILL)
        print("broker stopped")


if __name__ == "__main__":
    sys.exit(main())
