"""The load and the victim of `bench recovery` (B13): a `firepool serve` that can be SIGKILLed and
restarted over the same store and state dir, and W-Agent / W-RL callers that ride through the outages.

Callers count a job as theirs from the moment the broker acknowledged it (a 2xx with an id): a submit
that fails on a dead broker is retried with the same idempotency key, so a job stored just before a
kill is found again rather than submitted twice.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

POOLS = ("pools:\n  - {name: cpu, gpus: 0, min_count: 0, max_count: 6, max_idle_count: 6, idle_timeout: 900, "
         "caller_hold_seconds: 900, step: 2}\n")
"""Holds far longer than a repeat: every hold seen before a kill must still be there after it."""
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
READY_LINE = re.compile(r"dispatching at ([0-9.]+): ([0-9.?]+) s after process start, ([0-9.]+) s after "
                        r"control-plane start")


@dataclass
class Incarnation:
    """One broker process: when it was spawned, answered, and (from its log) began dispatching."""

    spawned_at: float
    killed_at: float | None = None
    healthy_at: float | None = None
    dispatching_at: float | None = None
    dispatch_after_process_s: float | None = None
    dispatch_after_control_s: float | None = None


class CrashBroker:
    """`firepool serve` on MariaDB/SQLite and the local backend, restartable over the same state."""

    def __init__(self, root: Path, db_url: str, callers: tuple[str, ...]) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.tokens = {c: secrets.token_hex(16) for c in callers}
        (root / "tokens.json").write_text(json.dumps({t: c for c, t in self.tokens.items()}))
        (root / "pools.yaml").write_text(POOLS)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "broker.log"
        self.cmd = [sys.executable, "-m", "broker.cli", "serve", "--port", str(self.port), "--state-dir",
                    str(self.state_dir), "--tokens", str(root / "tokens.json"), "--pools", str(root / "pools.yaml"),
                    "--db", db_url, "--log-level", "info"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives: list[Incarnation] = []

    def spawn(self) -> Incarnation:
        """Start a broker process without waiting for it (a kill may land while it recovers)."""
        with open(self.log_path, "ab") as log:
            life = Incarnation(spawned_at=time.time())
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.lives.append(life)
        return life

    def start(self, timeout_s: float = 90.0) -> Incarnation:
        """Start a broker process and wait until it dispatches (its /healthz says ok)."""
        life = self.spawn()
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).json().get("ok"):
                    life.healthy_at = time.time()
                    return life
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the broker did not come up")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the broker process alone: its pods are sessions of their own and keep running."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.lives[-1].killed_at = time.time()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for record in (self.state_dir / "pods").glob("*/pod.json"):  # pods a failed stop left behind
            try:
                pid = json.loads(record.read_text()).get("pid")
                if pid:
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def read_ready_lines(self) -> None:
        """Match each incarnation to its `dispatching at` log line by time (one killed while it was
        still recovering has none)."""
        for at, after_process, after_control in READY_LINE.findall(self.log_path.read_text(errors="replace")):
            when = float(at)
            for life in self.lives:
                if life.spawned_at <= when and (life.killed_at is None or when <= life.killed_at):
                    life.dispatching_at = when
                    life.dispatch_after_process_s = None if after_process == "?" else float(after_process)
                    life.dispatch_after_control_s = float(after_control)

    def client(self, caller: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[caller]}"},
                            timeout=httpx.Timeout(15.0, connect=2.0))

    def pods(self) -> list[dict[str, Any]]:
        """Every pod, asked of each caller in turn (a caller may see only its own)."""
        seen: dict[str, dict[str, Any]] = {}
        for caller in self.tokens:
            with self.client(caller) as c:
                for pod in c.get("/v1/pods").raise_for_status().json()["pods"]:
                    seen[pod["name"]] = pod
        return list(seen.values())


@dataclass
class Load:
    """What the callers did: every acknowledged job id, and errors they could not ride through."""

    stop: threading.Event = field(default_factory=threading.Event)
    acknowledged: dict[str, str] = field(default_factory=dict)
    """job id -> caller, from the broker's 2xx answer on."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    body_s: float = 0.3
    think_s: tuple[float, float] = (0.3, 1.5)
    """W-Agent's pause between a result and the next call, drawn uniformly."""
    threads: list[threading.Thread] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def job(self, tag: str) -> dict[str, Any]:
        return {"pool": "cpu", "lease_tag": tag, "max_retries": 0, "idempotency_key": secrets.token_hex(12),
                "command": ["/bin/sh", "-c", f"sleep {self.body_s}; echo $FIREPOOL_ATTEMPT_ID"]}

    def submit(self, c: httpx.Client, caller: str, body: dict[str, Any]) -> str | None:
        """The job's id once the broker acknowledged it; retried (same key) through outages."""
        give_up = time.monotonic() + 120
        while time.monotonic() < give_up:
            try:
                r = c.post("/v1/jobs", json=body)
                if r.status_code in (200, 201):
                    job_id = str(r.json()["id"])
                    with self.lock:
                        self.acknowledged[job_id] = caller
                    return job_id
                if r.status_code < 500:
                    self.refusals.append(f"{r.status_code} {r.text[:200]}")
                    return None
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        return None

    def wait(self, c: httpx.Client, job_id: str, limit_s: float = 120.0) -> str | None:
        """The job's terminal state, polling through outages; None if it never got there."""
        give_up = time.monotonic() + limit_s
        while time.monotonic() < give_up:
            try:
                r = c.get(f"/v1/jobs/{job_id}", params={"wait_s": 5})
                if r.status_code == 200 and r.json()["state"] in TERMINAL:
                    return str(r.json()["state"])
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        return None

    def agent(self, broker: CrashBroker, caller: str) -> None:
        """W-Agent: one caller's loop of short jobs in one session, each waited for, then a think time
        (during which its pod is held for it: the holds a kill must not lose)."""
        rng = random.Random(caller)
        with broker.client(caller) as c:
            while not self.stop.is_set():
                job_id = self.submit(c, caller, self.job(f"{caller}-session"))
                if job_id is not None:
                    self.wait(c, job_id)
                self.stop.wait(rng.uniform(*self.think_s))

    def trainer(self, broker: CrashBroker, caller: str, batch: int) -> None:
        """W-RL: a trainer fanning a batch of short jobs out and waiting for all before the next step."""
        with broker.client(caller) as c:
            while not self.stop.is_set():
                ids = [self.submit(c, caller, self.job("rollouts")) for _ in range(batch)]
                for job_id in ids:
                    if job_id is not None:
                        self.wait(c, job_id)

    def start(self, broker: CrashBroker, workload: str, callers: tuple[str, ...], batch: int) -> None:
        for caller in callers:
            loop = partial(self.agent, broker, caller) if workload == "agent" else \
                partial(self.trainer, broker, caller, batch)
            thread = threading.Thread(target=loop, name=f"{workload} {caller}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self, timeout_s: float = 180.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
