"""The load of `bench failover`: W-Agent (3 callers, each a loop of short jobs in its own session, a think
time between them during which its pod is held) and W-RL (a trainer fanning batches out), at once, through
the SDK with every broker's URL in one list (FIREPOOL_URL form), so the SDK finds the leader by itself.

A job counts from the moment a broker acknowledged it (a submit that returned an id); a submit that fails
through a fail-over is sent again with the same idempotency key, so a job stored just before a kill is
found again rather than created twice. Each job appends `S <its job id>` to the pool's bound host file:
a line per execution, written by the job itself, which no broker can fake or forget.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from broker.client import Client
from broker.errors import FirepoolError
from broker.retrying import RetryPolicy

COMMAND = ["sh", "-c", 'echo "S $FIREPOOL_JOB_ID" >> /shared/log; sleep 0.2']
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
AGENTS = ("agent-1", "agent-2", "agent-3")
TRAINER = "trainer"
RIDE_THROUGH = RetryPolicy(attempts=12, base=0.05, cap=1.0)
"""The SDK's own retries: enough to cross a fail-over (about 0.1 s) and a restart of the leader's URL."""


@dataclass
class Load:
    urls: list[str]
    tokens: dict[str, str]
    batch: int = 6
    think_s: tuple[float, float] = (0.3, 1.2)
    stop: threading.Event = field(default_factory=threading.Event)
    acknowledged: dict[str, str] = field(default_factory=dict)
    """job id -> caller, from the broker's answer on."""
    refusals: list[str] = field(default_factory=list)
    """Non-retryable answers the callers got (none is expected)."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def client(self, caller: str) -> Client:
        return Client(",".join(self.urls), self.tokens[caller], timeout=30.0, retry=RIDE_THROUGH)

    def submit(self, fp: Client, caller: str, tag: str, limit_s: float = 120.0) -> str | None:
        key = f"failover-{secrets.token_hex(12)}"
        give_up = time.monotonic() + limit_s
        while time.monotonic() < give_up:
            try:
                job = fp.submit(COMMAND, "cpu", lease_tag=tag, max_retries=0, idempotency_key=key)
            except FirepoolError as exc:
                if not exc.retryable:
                    self.refusals.append(f"{caller}: {type(exc).__name__}: {exc}")
                    return None
                time.sleep(0.05)
                continue
            with self.lock:
                self.acknowledged[job.id] = caller
            return job.id
        return None

    def wait(self, fp: Client, job_id: str, limit_s: float = 120.0) -> str | None:
        """The job's terminal state (with its error class unless it succeeded), asked through fail-overs;
        None if it never got there."""
        give_up = time.monotonic() + limit_s
        while time.monotonic() < give_up:
            try:
                job = fp.get(job_id, wait_s=min(5.0, max(0.0, give_up - time.monotonic())))
            except FirepoolError as exc:
                if not exc.retryable:
                    self.refusals.append(f"wait {job_id}: {type(exc).__name__}: {exc}")
                    return None
                time.sleep(0.05)
                continue
            if job.state in TERMINAL:  # a failure names its class (PodLost, ...): the audit counts them apart
                return str(job.state) if job.state == "SUCCEEDED" else f"{job.state} {job.error_class}"
        return None

    def agent(self, caller: str) -> None:
        rng = random.Random(caller)
        with self.client(caller) as fp:
            while not self.stop.is_set():
                job_id = self.submit(fp, caller, f"{caller}-session")
                if job_id is not None:
                    self.wait(fp, job_id)
                self.stop.wait(rng.uniform(*self.think_s))

    def trainer(self) -> None:
        with self.client(TRAINER) as fp:
            while not self.stop.is_set():
                ids = [self.submit(fp, TRAINER, "rollouts") for _ in range(self.batch)]
                for job_id in ids:
                    if job_id is not None:
                        self.wait(fp, job_id)

    def start(self) -> None:
        loops: list[tuple[str, Any]] = [(c, lambda c=c: self.agent(c)) for c in AGENTS]
        loops.append((TRAINER, self.trainer))
        for name, loop in loops:
            thread = threading.Thread(target=loop, name=f"failover load {name}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self, timeout_s: float = 150.0) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def audit(self, drain_s: float = 60.0) -> dict[str, Any]:
        """Every acknowledged job's end state (asked again, through whichever broker leads now)."""
        states: dict[str, str] = {}
        clients = {c: self.client(c) for c in self.tokens}
        try:
            for job_id, caller in sorted(self.acknowledged.items()):
                states[job_id] = self.wait(clients[caller], job_id, limit_s=drain_s) or "LOST"
        finally:
            for fp in clients.values():
                fp.close()
        return states


def pods(urls: list[str], tokens: dict[str, str]) -> list[dict[str, Any]]:
    """Every pod, asked of each caller in turn (a caller may see only its own), through the SDK."""
    seen: dict[str, dict[str, Any]] = {}
    for token in tokens.values():
        with Client(",".join(urls), token, timeout=10.0, retry=RIDE_THROUGH) as fp:
            for pod in fp.pods():
                seen[pod["name"]] = pod
    return list(seen.values())
