"""The brokers of `bench failover` and of tests/integration/test_ha.py: several `firepool serve` on one store
and one state dir, each on its own fixed port (a restarted broker comes back at the URL clients know), the
local backend and a cpu pool whose pods bind a host dir, so every job can leave a line there that no broker
writes (the execution count). Plus a scratch database per run on MariaDB or PostgreSQL, dropped after.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.broker_proc import free_port
from broker.backends.sandboxing import PodDirs
from broker.backends.volumes import unmount_disk

TERM_TAKEN = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*leading the store at term (\d+) ")
"""The election's log line (broker.store.leadership), under `firepool serve`'s log format."""
SERVERS = {"mariadb": "mysql+pymysql://root@127.0.0.1:3306", "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432"}
"""Where the scratch databases go: root with no password, postgres with trust auth (docs/benchmarks.md)."""


class ScratchDatabase:
    """A fresh database on a server, made for one run and dropped after it (with whoever still holds it)."""

    def __init__(self, kind: str, server: str | None = None) -> None:
        self.kind = kind
        self.server = sa.engine.make_url(server or SERVERS[kind])
        self.name = f"fp_failover_{secrets.token_hex(4)}"
        admin = self.server.set(database="postgres" if kind == "postgresql" else None)
        self._admin = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        self.url = ""

    def __enter__(self) -> ScratchDatabase:
        try:
            with self._admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"' if self.kind == "postgresql" else
                                     f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
        except sa.exc.DBAPIError as exc:
            self._admin.dispose()
            raise SystemExit(f"cannot create a database on {self.server.render_as_string()} ({exc.orig}); "
                             f"start {self.kind} there") from None
        self.url = self.server.set(database=self.name).render_as_string(hide_password=False)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._admin.connect() as conn:
            if self.kind == "postgresql":
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{self.name}`")
        self._admin.dispose()


def pools_yaml(shared: Path, max_count: int = 8) -> str:
    """A cpu pool whose pods bind `shared` at /shared (read-write); holds outlast any run."""
    return (f"pools:\n  - name: cpu\n    gpus: 0\n    min_count: 0\n    max_count: {max_count}\n"
            f"    max_idle_count: {max_count}\n    idle_timeout: 900\n    caller_hold_seconds: 900\n    step: 2\n"
            f"    template: {{binds: [{{src: {shared}, dst: /shared, ro: false}}]}}\n")


@dataclass
class Life:
    """One broker process: its index, pid, when it started and how it ended."""

    index: int
    pid: int
    spawned_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    how: str = ""
    """"killed", "paused", "stopped", or "" while it runs or when it exited on its own."""


@dataclass
class Brokers:
    """`count` brokers on `db_url`, one state dir under `root`; index i keeps port `ports[i]`."""

    root: Path
    db_url: str
    count: int = 3
    callers: tuple[str, ...] = ("bench",)
    lease_s: float | None = None
    extra: tuple[str, ...] = ()
    db_urls: dict[int, str] = field(default_factory=dict)
    """Per broker, a store URL other than `db_url` (the same database through a proxy that can cut it). Such a
    broker gets a state dir of its own: a broker refuses a state dir that a live broker leads from a store of
    another URL (`firepool serve`'s check that two stores never drive the same pods)."""
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    lives: list[Life] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.shared = self.root / "shared"
        self.shared.mkdir(exist_ok=True)
        (self.shared / "log").touch()
        self.shared.chmod(0o777)  # jobs run as an unprivileged user of the sandbox, not as this one
        (self.shared / "log").chmod(0o666)
        self.state_dir = self.root / "state"
        self.tokens = {c: secrets.token_hex(16) for c in self.callers}
        (self.root / "tokens.json").write_text(json.dumps({t: c for c, t in self.tokens.items()}))
        (self.root / "tokens.json").chmod(0o600)
        (self.root / "pools.yaml").write_text(pools_yaml(self.shared))
        self.ports = self.ports or [free_port() for _ in range(self.count)]
        self._http = httpx.Client(timeout=httpx.Timeout(0.5, connect=0.2))

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def state_of(self, i: int) -> Path:
        return self.root / f"state-{i}" if i in self.db_urls else self.state_dir

    def log_path(self, i: int) -> Path:
        return self.root / f"broker-{i}.log"

    def command(self, i: int) -> list[str]:
        cmd = [sys.executable, "-m", "broker.cli", "serve", "--host", "127.0.0.1", "--port", str(self.ports[i]),
               "--state-dir", str(self.state_of(i)), "--tokens", str(self.root / "tokens.json"),
               "--pools", str(self.root / "pools.yaml"), "--db", self.db_urls.get(i, self.db_url),
               "--log-level", "info"]
        if self.lease_s is not None:
            cmd += ["--lease-s", str(self.lease_s)]
        return cmd + list(self.extra)

    def spawn(self, i: int) -> Life:
        """Start broker i (its log appended to), without waiting for it."""
        with open(self.log_path(i), "ab") as log:
            proc = subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[i] = proc
        life = Life(i, proc.pid, time.monotonic())
        self.lives.append(life)
        return life

    def start(self, timeout_s: float = 90.0) -> None:
        for i in range(self.count):
            self.spawn(i)
        for i in range(self.count):
            self.wait_up(i, timeout_s)

    def life(self, i: int) -> Life:
        return next(x for x in reversed(self.lives) if x.index == i)

    def health(self, i: int) -> dict[str, Any] | None:
        """Broker i's /healthz body, or None when it does not answer in time."""
        try:
            body = self._http.get(self.urls[i] + "/healthz").json()
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def wait_up(self, i: int, timeout_s: float = 90.0) -> None:
        """Until broker i answers /healthz (as leader or standby); raises if it exits first."""
        deadline = time.monotonic() + timeout_s
        while self.health(i) is None:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"broker {i} exited {self.procs[i].returncode}: {self.tail(i)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker {i} did not answer within {timeout_s} s: {self.tail(i)}")
            time.sleep(0.02)

    def roles(self) -> dict[int, tuple[str, int]]:
        """(role, term) of every broker that answers now."""
        out = {}
        for i in range(self.count):
            body = self.health(i)
            if body is not None and "role" in body:
                out[i] = (str(body["role"]), int(body.get("term", 0)))
        return out

    def leaders(self) -> list[int]:
        return [i for i, (role, _term) in self.roles().items() if role == "leader"]

    def wait_leader(self, among: list[int] | None = None, timeout_s: float = 30.0, poll_s: float = 0.005,
                    after_term: int = 0) -> tuple[int, int, float]:
        """Poll /healthz of `among` (default all) every `poll_s` until one says leader with a term above
        `after_term`: (index, term, seconds waited)."""
        among = list(range(self.count)) if among is None else among
        started = time.monotonic()
        while True:
            for i in among:
                body = self.health(i)
                if body is not None and body.get("role") == "leader" and int(body.get("term", 0)) > after_term:
                    return i, int(body["term"]), time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"no leader among {among} after {timeout_s} s: {self.roles()}")
            time.sleep(poll_s)

    def kill(self, i: int, how: str = "killed") -> None:
        """SIGKILL broker i alone (its pods are sessions of their own and keep running)."""
        proc = self.procs[i]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        self._ended(i, proc.wait(30), how)

    def pause(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGCONT)

    def wait_exit(self, i: int, timeout_s: float) -> int | None:
        """Broker i's exit status once it ends by itself within `timeout_s`; None if it still runs."""
        try:
            code = self.procs[i].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._ended(i, code, "")
        return code

    def _ended(self, i: int, code: int, how: str) -> None:
        life = self.life(i)
        if life.ended_at is None:
            life.ended_at, life.exit_code, life.how = time.monotonic(), code, how

    def tail(self, i: int, chars: int = 2000) -> str:
        path = self.log_path(i)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def log_lines(self, needle: str) -> list[str]:
        """Lines of every broker log that contain `needle`."""
        return [line for i in range(self.count) if self.log_path(i).exists()
                for line in self.log_path(i).read_text(errors="replace").splitlines() if needle in line]

    def terms_taken(self) -> dict[int, float]:
        """term -> when (epoch seconds, from the log line's millisecond timestamp) a broker took it."""
        out = {}
        for line in self.log_lines("leading the store at term"):
            m = TERM_TAKEN.match(line)
            if m:
                stamp = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
                out[int(m[2])] = stamp.timestamp()
        return out

    def agent_log_lines(self, needle: str) -> list[str]:
        """Lines of the pods' agent logs (under the state dir) that contain `needle`."""
        out = []
        for path in sorted(self.state_dir.glob("pods/*/*.log")):
            out += [line for line in path.read_text(errors="replace").splitlines() if needle in line]
        return out

    def executions(self) -> list[str]:
        """The job ids the jobs themselves wrote to the bound log, one per execution."""
        return [line.split()[1] for line in (self.shared / "log").read_text().splitlines()
                if line.startswith("S ") and len(line.split()) == 2]

    def stop(self) -> None:
        """SIGCONT then SIGTERM every broker still running (SIGKILL after 20 s), then end any pod left and
        unmount its disk."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for i, proc in self.procs.items():
            try:
                self._ended(i, proc.wait(20), "stopped")
            except subprocess.TimeoutExpired:
                proc.kill()
                self._ended(i, proc.wait(10), "stopped")
        for state in {self.state_of(i) for i in range(self.count)}:  # pods outlive their brokers by design
            for record in state.glob("pods/*/pod.json"):
                try:
                    pid = json.loads(record.read_text()).get("pid")
                    if pid:
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                with contextlib.suppress(OSError):  # the broker's loop mount would outlive the directory
                    unmount_disk(PodDirs(record.parent))
        self._http.close()
