"""The pod-agent port: what the broker asks of the agent inside every pod, and the answers' shapes.

The HTTP implementation lives in `broker.running.agent_http`; `FakeAgent` runs attempts in the injected
clock's time for unit tests and the simulator. Attempt ids are `<job-id>:<n>`; an agent remembers the
attempts it ran, so a restarted broker can tell "finished while I was away" from "never launched".
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.clock import Clock
from broker.errors import AgentError


@dataclass(frozen=True)
class LaunchRequest:
    attempt_id: str
    argv: Sequence[str]
    env: Mapping[str, str]
    """Caller env (already filtered) plus what the broker injects; the agent adds its base env."""
    session: str
    """Opaque session key; when it differs from the previous attempt's, the agent empties the workspace first."""
    cwd: str | None = None
    timeout_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Later features (package, requirements, kernel mode) ride here."""
    wait_s: float = 0.0
    """Answer once the attempt ended or this long after its start: a short job's launch, wait and logs then
    cost one round trip (an agent that ignores it answers at the start, and the broker waits as usual)."""
    reset_after: ResetRequest | None = None
    """When the attempt ends within `wait_s` and its logs come inline, the agent resets the pod before it
    answers, keeping those logs in memory for a broker that takes over (`AttemptStatus.reset`): the reset
    costs no request of its own. An agent that ignores it answers without a reset, and the broker sends one."""


@dataclass(frozen=True)
class AttemptStatus:
    attempt_id: str
    running: bool
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    oom: bool = False
    started_at: float | None = None
    first_instruction_at: float | None = None
    finished_at: float | None = None
    error_class: str | None = None
    """Set by the agent for failures before the user process ran (e.g. PackageError)."""
    message: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    """Agent-side phase durations (e.g. package unpack), seconds."""
    logs: Mapping[str, bytes] | None = None
    """A finished attempt's whole logs by stream, when the agent sent them with its status."""
    hardware_fault: str | None = None
    """Why the attempt failed on the GPU's hardware (Xid, ECC, NVML health), as the agent classified it."""
    reset: ResetResult | None = None
    """The reset the launch asked for (`LaunchRequest.reset_after`), done as the attempt ended."""


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    next_offset: int
    complete: bool
    """True when the attempt has exited and `next_offset` is the end of the stream."""


@dataclass(frozen=True)
class KernelReport:
    running: bool
    """False once the attempt ended (its kernel is gone)."""
    connection: Mapping[str, Any] | None = field(default=None, repr=False)
    """The kernel's connection info as it reported it (caller-reachable address and ports, keys); None until
    then. `repr=False`: a report in a traceback or a debug line shows no key."""


@dataclass(frozen=True)
class ResetRequest:
    wipe_workspace: bool = False
    wipe_paths: Sequence[str] = ()
    keep_paths: Sequence[str] = ()


@dataclass(frozen=True)
class ResetResult:
    clean: bool
    duration_s: float
    killed: int = 0
    problems: Sequence[str] = ()
    incarnation: int | None = None
    """The agent's incarnation when it answered (R5); None from an agent that does not say."""


@dataclass(frozen=True)
class PackageDelivered:
    digest: str
    unpack_s: float
    """How long the agent took to unpack it into the package directory."""
    receive_s: float = 0.0
    extracted: int = 0


@dataclass(frozen=True)
class AgentHealth:
    pod: str
    isolated: bool
    attempt: str | None
    """The attempt running now, if any."""
    uptime_s: float = 0.0
    info: Mapping[str, Any] = field(default_factory=dict)
    incarnation: int | None = None
    """The agent's start counter (R5): another value than the one recorded means another agent."""


class AgentClient(Protocol):
    async def health(self) -> AgentHealth: ...

    async def launch(self, request: LaunchRequest) -> AttemptStatus:
        """Start an attempt; returns once rank 0's process has exec'd (first instruction), or with
        `request.wait_s`, once it ended or that long passed."""
        ...

    async def wait(self, attempt_id: str, timeout_s: float) -> AttemptStatus:
        """Long-poll until the attempt exits or `timeout_s` passes; `running` tells which."""
        ...

    async def status(self, attempt_id: str) -> AttemptStatus | None:
        """None when the agent never ran this attempt."""
        ...

    async def read_log(self, attempt_id: str, stream: str = "combined", offset: int = 0,
                       max_bytes: int = 1 << 20, wait_s: float = 0.0) -> LogChunk:
        """`stream` is `combined`, `stdout` or `stderr`."""
        ...

    async def kernel(self, attempt_id: str, wait_s: float = 0.0) -> KernelReport:
        """A kernel attempt's connection info (keys included) once its kernel reported it, waiting up to
        `wait_s`. It is a secret of the job's owner: never log it, store it or put it in an event."""
        ...

    async def signal(self, attempt_id: str, signal: str) -> None:
        """`TERM`, `INT`, `HUP`, `USR1` to rank 0's process group; `KILL` takes the whole tree.

        An attempt the agent does not know (it refused the launch) is an AgentError with status 404."""
        ...

    async def cancel(self, attempt_id: str, grace_s: float) -> None:
        """TERM the attempt's tree, KILL it after `grace_s`; its status then says `cancelled`."""
        ...

    async def reset(self, request: ResetRequest) -> ResetResult: ...

    async def keep_kernels(self, keep: bool) -> None:
        """Tell the agent whether its pool serves kernels: an idle `learned` pod keeps a pre-started one while so."""
        ...

    async def put_package(self, digest: str, path: str, max_extracted: int, timeout_s: float) -> PackageDelivered:
        """Push a code package (a checked zip on local disk) for the next launch; the agent unpacks it."""
        ...

    async def upgrade(self, path: str, params: dict[str, Any], protocol: str
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream the agent switched to `protocol` at `path` (`/v1/tunnel`: a sandbox port)."""
        ...

    async def close(self) -> None: ...


@dataclass
class _FakeRun:
    status: AttemptStatus
    done: asyncio.Event
    output: bytes


class FakeAgent:
    """An agent whose commands run in clock time: `sleep S`, `exit N`, `echo ...`, `hang` (never ends),
    `fault WHY` (fails with a hardware fault, as the agent reports an Xid or ECC error).

    Tests steer it: `unclean_next_reset` makes the next reset report unclean; `fail_launch` makes
    launches raise `AgentError`; `reachable = False` makes every call raise.
    """

    def __init__(self, pod: str, clock: Clock) -> None:
        self.pod = pod
        self.clock = clock
        self.runs: dict[str, _FakeRun] = {}
        self.current: str | None = None
        self.session: str | None = None
        self.workspace_wiped = 0
        self.unclean_next_reset = False
        self.fail_launch = False
        self.fail_push = False
        self.delivered: str | None = None
        self.reachable = True
        self.launches: list[LaunchRequest] = []
        self.resets: list[ResetRequest] = []
        self.kernels_told: list[bool] = []
        self.kernel_info: dict[str, dict[str, Any]] = {}
        """Attempt id -> the connection info its (fake) kernel reports; a test sets it."""
        self.incarnation: int | None = 1
        """Reported by health; a test bumps it to play an agent that restarted under the same pod name."""

    def _check(self) -> None:
        if not self.reachable:
            raise AgentError(f"agent of {self.pod} unreachable")

    async def health(self) -> AgentHealth:
        self._check()
        return AgentHealth(pod=self.pod, isolated=True, attempt=self.current, incarnation=self.incarnation)

    async def launch(self, request: LaunchRequest) -> AttemptStatus:
        self._check()
        if self.fail_launch:
            raise AgentError(f"launch refused on {self.pod}")
        if self.current is not None:
            raise AgentError(f"{self.pod} already runs {self.current}")
        if request.session != self.session:
            if self.session is not None:
                self.workspace_wiped += 1
            self.session = request.session
        self.launches.append(request)
        if request.extra.get("package") is not None and request.extra["package"] != self.delivered:
            raise AgentError(f"package {request.extra['package']} was not delivered to {self.pod}")
        now = self.clock.now()
        status = AttemptStatus(attempt_id=request.attempt_id, running=True, pid=1000 + len(self.launches),
                               started_at=now, first_instruction_at=now)
        run = _FakeRun(status=status, done=asyncio.Event(), output=b"")
        self.runs[request.attempt_id] = run
        self.current = request.attempt_id
        if not request.argv or request.argv[0] != "hang":  # a hang only ends by kill, cancel or reset: no task waits
            asyncio.get_running_loop().create_task(self._run(request, run))
        if request.wait_s > 0:
            await self.clock.wait(run.done, request.wait_s)
            if request.reset_after is not None and run.done.is_set():  # as the real agent: logs inline, then reset
                logs = dict.fromkeys(("stdout", "stderr", "combined"), run.output)  # as read_log serves them
                return dataclasses.replace(run.status, logs=logs, reset=await self.reset(request.reset_after))
            return run.status
        return status

    async def _run(self, request: LaunchRequest, run: _FakeRun) -> None:
        argv = list(request.argv)
        verb, args = (argv[0], argv[1:]) if argv else ("exit", ["0"])
        code = 0
        if verb == "sleep":
            duration = float(args[0])
            if request.timeout_s is not None and duration > request.timeout_s:
                await self.clock.sleep(request.timeout_s)
                self._finish(run, exit_code=137, signal=9, timed_out=True)
                return
            await self.clock.sleep(duration)
        elif verb == "exit":
            code = int(args[0])
        elif verb == "echo":
            run.output += (" ".join(args) + "\n").encode()
        elif verb == "hang":
            await asyncio.Event().wait()
        elif verb == "fault":  # fails as the agent reports a GPU hardware fault (Xid, ECC)
            self._finish(run, exit_code=1, hardware_fault=" ".join(args) or "Xid 79 (hardware)")
            return
        self._finish(run, exit_code=code)

    def _finish(self, run: _FakeRun, **fields: Any) -> None:
        if run.done.is_set():
            return
        run.status = dataclasses.replace(run.status, running=False, finished_at=self.clock.now(), **fields)
        run.done.set()
        if self.current == run.status.attempt_id:
            self.current = None

    async def wait(self, attempt_id: str, timeout_s: float) -> AttemptStatus:
        self._check()
        run = self.runs.get(attempt_id)
        if run is None:
            raise AgentError(f"{self.pod} never ran {attempt_id}")
        await self.clock.wait(run.done, timeout_s)
        self._check()
        return run.status

    async def status(self, attempt_id: str) -> AttemptStatus | None:
        self._check()
        run = self.runs.get(attempt_id)
        return run.status if run else None

    async def read_log(self, attempt_id: str, stream: str = "combined", offset: int = 0,
                       max_bytes: int = 1 << 20, wait_s: float = 0.0) -> LogChunk:
        self._check()
        run = self.runs.get(attempt_id)
        if run is None:
            raise AgentError(f"{self.pod} never ran {attempt_id}")
        data = run.output[offset:offset + max_bytes]
        return LogChunk(data=data, next_offset=offset + len(data), complete=run.done.is_set())

    async def kernel(self, attempt_id: str, wait_s: float = 0.0) -> KernelReport:
        """A fake kernel reports at once: `connection` is what `kernel_info` says for the attempt."""
        self._check()
        run = self.runs.get(attempt_id)
        if run is None:
            raise AgentError(f"{self.pod} never ran {attempt_id}", {"pod": self.pod, "status": 404})
        running = not run.done.is_set()
        return KernelReport(running=running, connection=self.kernel_info.get(attempt_id) if running else None)

    async def signal(self, attempt_id: str, signal: str) -> None:
        self._check()
        run = self.runs.get(attempt_id)
        if run is None:  # as the real agent answers an attempt it never launched
            raise AgentError(f"{self.pod} never ran {attempt_id}", {"pod": self.pod, "status": 404})
        if signal in ("KILL", "TERM"):
            self._finish(run, exit_code=137 if signal == "KILL" else 143, signal=9 if signal == "KILL" else 15)

    async def cancel(self, attempt_id: str, grace_s: float) -> None:
        self._check()
        run = self.runs.get(attempt_id)
        if run is not None:
            self._finish(run, exit_code=143, signal=15, cancelled=True)

    async def reset(self, request: ResetRequest) -> ResetResult:
        self._check()
        self.resets.append(request)
        if self.current is not None:
            self._finish(self.runs[self.current], exit_code=137, signal=9)
        self.delivered = None
        if request.wipe_workspace:
            self.workspace_wiped += 1
            self.session = None
        if self.unclean_next_reset:
            self.unclean_next_reset = False
            return ResetResult(clean=False, duration_s=0.001, problems=["injected residue"],
                               incarnation=self.incarnation)
        return ResetResult(clean=True, duration_s=0.001, incarnation=self.incarnation)

    async def keep_kernels(self, keep: bool) -> None:
        self._check()
        self.kernels_told.append(keep)

    async def put_package(self, digest: str, path: str, max_extracted: int, timeout_s: float) -> PackageDelivered:
        self._check()
        if self.fail_push:
            raise AgentError(f"{self.pod} refused package {digest}")
        self.delivered = digest
        return PackageDelivered(digest=digest, unpack_s=0.0)

    async def upgrade(self, path: str, params: dict[str, Any], protocol: str
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self._check()
        raise AgentError(f"{self.pod} is simulated: it has no servers to stream to ({path})",
                         {"pod": self.pod, "status": 502})

    async def close(self) -> None:
        pass
