"""Tiny stand-ins for several brokers of one store, to test how clients follow the leader with real processes
and sockets: each is a stdlib HTTP server process (`python -m tests.brokerstub STORE TOKEN`) that prints its
port, and they share a store directory.

The store's `leader` file names the leader's URL (empty while none leads). The broker whose URL it is serves
`GET /v1/whoami`, `POST /v1/jobs` (idempotency key, `wait_s`) and `GET /v1/jobs/{id}` (`wait_s`) in the real
broker's shapes (broker/api/app.py); every other one answers as a standby does: 503 NotLeader naming the
leader, `Retry-After: 0`. A job `["sleep", "N"]` runs N seconds, then SUCCEEDED with exit code 0. Every
request is appended to `requests.log` as `PORT METHOD PATH` when it arrives. `StubBrokers` starts, elects
and SIGKILLs them; an election is the test writing `leader`, as the store's lease would decide it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[1]


class Store:
    """The shared state: who leads, the jobs, the idempotency keys, the request log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        (root / "keys").mkdir(exist_ok=True)

    def leader(self) -> str:
        try:
            return (self.root / "leader").read_text().strip()
        except FileNotFoundError:
            return ""

    def elect(self, url: str) -> None:
        tmp = self.root / "leader.tmp"
        tmp.write_text(url)
        tmp.replace(self.root / "leader")

    def log(self, line: str) -> None:
        with open(self.root / "requests.log", "a") as f:
            f.write(line + "\n")

    def requests(self) -> list[str]:
        try:
            return (self.root / "requests.log").read_text().splitlines()
        except FileNotFoundError:
            return []

    def job(self, job_id: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.root / "jobs" / f"{job_id}.json").read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def submit(self, body: dict[str, Any], caller: str) -> tuple[dict[str, Any], bool]:
        key = str(body.get("idempotency_key") or "")
        if key and (self.root / "keys" / key).exists():
            job = self.job((self.root / "keys" / key).read_text())
            if job is not None:
                return job, False
        command = [str(c) for c in body.get("command", [])]
        run_s = float(command[1]) if len(command) == 2 and command[0] == "sleep" else 0.0
        now = time.time()
        job = {"id": f"j-{uuid.uuid4().hex[:12]}", "caller": caller, "pool": body.get("pool", "cpu"),
               "command": command, "idempotency_key": key or None, "ends_at": now + run_s,
               "timings": {"submitted_at": now}}
        (self.root / "jobs" / f"{job['id']}.json").write_text(json.dumps(job))
        if key:
            (self.root / "keys" / key).write_text(job["id"])
        return job, True


def view(job: dict[str, Any]) -> dict[str, Any]:
    """The job as the broker shows it (the fields clients read)."""
    done = time.time() >= job["ends_at"]
    return {"id": job["id"], "state": "SUCCEEDED" if done else "RUNNING", "caller": job["caller"],
            "pool": job["pool"], "command": job["command"], "idempotency_key": job["idempotency_key"],
            "exit_code": 0 if done else None, "acquisition": [], "attempts": [], "timings": job["timings"]}


def error(cls: str, message: str, retryable: bool, details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"class": cls, "message": message, "retryable": retryable, "details": details}}


def handler(store: Store, token: str, me: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            store.log(f"{me[0].rsplit(':', 1)[1]} {method} {parts.path}")
            leader = store.leader()
            if leader != me[0]:
                self._answer(503, error("NotLeader", f"{me[0]} is a standby", True,
                                        {"leader": leader or None, "term": 1}), {"Retry-After": "0"})
                return
            if self.headers.get("Authorization") != f"Bearer {token}":
                self._answer(401, error("Unauthorized", "bad token", False, {}))
                return
            if method == "GET" and parts.path == "/v1/whoami":
                self._answer(200, {"caller": "alice"})
            elif method == "POST" and parts.path == "/v1/jobs":
                job, created = store.submit(body, "alice")
                self._answer(201 if created else 200, self._wait(job["id"], float(query.get("wait_s", 0))))
            elif method == "GET" and parts.path.startswith("/v1/jobs/") and store.job(parts.path[9:]):
                self._answer(200, self._wait(parts.path[9:], float(query.get("wait_s", 0))))
            else:
                self._answer(404, error("NotFound", f"no {method} {parts.path}", False, {}))

        def _wait(self, job_id: str, wait_s: float) -> dict[str, Any]:
            """A long-poll: the job once terminal or after `wait_s`."""
            deadline = time.monotonic() + wait_s
            while True:
                job = store.job(job_id)
                assert job is not None
                shown = view(job)
                if shown["state"] == "SUCCEEDED" or time.monotonic() >= deadline:
                    return shown
                time.sleep(0.02)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler


def main() -> None:
    store, token = Store(Path(sys.argv[1])), sys.argv[2]
    me = [""]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(store, token, me))
    server.daemon_threads = True
    me[0] = f"http://127.0.0.1:{server.server_address[1]}"
    print(server.server_address[1], flush=True)
    server.serve_forever()


class StubBrokers:
    """Stub broker processes over one store, and a dead URL (a bound port nobody listens on)."""

    def __init__(self, root: Path, token: str = "tok") -> None:
        self.store = Store(root)
        self.token = token
        self.processes: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []
        self._dead = socket.socket()
        self._dead.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused, and no one takes it
        self.dead_url = f"http://127.0.0.1:{self._dead.getsockname()[1]}"

    def start(self) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen([sys.executable, "-m", "tests.brokerstub", str(self.store.root), self.token],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        self.processes.append(proc)
        self.urls.append(f"http://127.0.0.1:{port}")
        return self.urls[-1]

    def kill(self, url: str) -> None:
        """SIGKILL: the OS resets its connections, mid-request ones included."""
        proc = self.processes[self.urls.index(url)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def served(self, url: str, method: str, path: str) -> int:
        """How many `method path` requests `url` received."""
        return self.store.requests().count(f"{url.rsplit(':', 1)[1]} {method} {path}")

    def until(self, url: str, method: str, path: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.served(url, method, path):
            assert time.monotonic() < deadline, f"{url} never received {method} {path}"
            time.sleep(0.01)

    def close(self) -> None:
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        self._dead.close()


@contextlib.contextmanager
def stub_brokers(root: Path, n: int) -> Iterator[StubBrokers]:
    """`n` stub brokers started over a store in `root`, none leading yet."""
    brokers = StubBrokers(root)
    try:
        for _ in range(n):
            brokers.start()
        yield brokers
    finally:
        brokers.close()


if __name__ == "__main__":
    main()
