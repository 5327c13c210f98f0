"""Jobs and attempts: the caller's intent, each execution of it, and their one transition table each.

A job is what the caller asked for; an attempt is one execution, named `<job-id>:<n>` so the pod agent
never confuses a re-queued attempt with an earlier one. `transition` is the only way a job changes state:
it checks the table, bumps the row version the store will compare against, and stamps the time.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({
        JobState.QUEUED,     # admitted: the pool exists and the request fits it
        JobState.CANCELLED,  # cancelled before admission
    }),
    JobState.QUEUED: frozenset({
        JobState.RUNNING,    # its full pod set was claimed and the binding committed
        JobState.CANCELLED,  # cancelled while waiting
        JobState.FAILED,     # can never be placed (pool gone, larger than its ceiling)
    }),
    JobState.RUNNING: frozenset({
        JobState.SUCCEEDED,  # rank 0 exited 0
        JobState.FAILED,     # the final attempt failed and no retry is left
        JobState.CANCELLED,  # the caller cancelled; the attempt was killed
        JobState.QUEUED,     # a retry, or recovery found the attempt never launched / its pods gone
    }),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)


class AttemptState(enum.StrEnum):
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


ATTEMPT_TRANSITIONS: Mapping[AttemptState, frozenset[AttemptState]] = {
    AttemptState.LAUNCHING: frozenset({
        AttemptState.RUNNING,    # the agent started rank 0's process
        AttemptState.FAILED,     # the launch failed after the commit (an attempt failure)
        AttemptState.LOST,       # recovery: the agent never heard of it
        AttemptState.CANCELLED,  # cancelled before the process started
    }),
    AttemptState.RUNNING: frozenset({
        AttemptState.SUCCEEDED,  # exit 0
        AttemptState.FAILED,     # non-zero exit, timeout, OutOfMemory
        AttemptState.CANCELLED,  # killed on the caller's request
        AttemptState.LOST,       # its pod vanished or stayed unreachable
    }),
    AttemptState.SUCCEEDED: frozenset(),
    AttemptState.FAILED: frozenset(),
    AttemptState.CANCELLED: frozenset(),
    AttemptState.LOST: frozenset(),
}

ATTEMPT_TERMINAL: frozenset[AttemptState] = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)


class ErrorClass(enum.StrEnum):
    """Why a job or attempt failed; callers switch on these names."""

    NON_ZERO_EXIT = "NonZeroExit"
    TIMEOUT = "Timeout"
    OOM = "OutOfMemory"
    """The pod's memory limit was hit (the kernel's OOM killer ended a process of the job)."""
    DISK_FULL = "DiskFull"
    """A capped disk of the pod (workspace, /tmp, /dev/shm, wipe paths) was full."""
    TOO_MANY_PROCESSES = "TooManyProcesses"
    """The pod's pids limit refused a fork."""
    KILLED = "Killed"
    CANCELLED = "Cancelled"
    POD_LOST = "PodLost"
    LAUNCH_ERROR = "LaunchError"
    PACKAGE_ERROR = "PackageError"
    DEPENDENCY_ERROR = "DependencyError"
    UNSCHEDULABLE = "Unschedulable"
    PREEMPTED = "Preempted"
    """An attempt the broker stopped (SIGTERM, SIGKILL after the grace) so a job within its quota could run."""
    HARDWARE_FAULT = "HardwareFault"
    """The GPU failed (Xid, ECC, NVML health): the job is re-queued elsewhere without spending a retry."""


SIGNALS = ("INT", "TERM", "HUP", "USR1", "USR2", "QUIT", "KILL")
"""What a caller may send a running job (the agent's signal endpoint takes these names)."""
PREEMPT_AGING = 1
"""Priority a job gains per preemption (design §4: preempt_count aging, so it climbs out of the danger zone)."""


TIMING_FIELDS = (
    "submitted_at", "queued_at", "claimed_at", "committed_at",
    "handed_off_at", "first_instruction_at", "finished_at",
)


class IllegalTransition(Exception):
    """A state change the transition table does not allow; a bug, never a caller error."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """The caller's request, validated; never changes after submit."""

    pool: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    lease_tag: str = ""
    queue: str = "default"
    pods: int = 1
    single_use: bool = False
    timeout_s: float | None = None
    max_retries: int = 0
    priority: int = 0
    idempotency_key: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields later features add (package, requirements, kernel); stored with the spec."""
    recycle: bool = True
    """In a `retire` or `hint` pool, may a new session take the caller's idle pod of another session (emptying
    that session's workspace) before a standby or a new pod? False protects sessions that live side by side
    (MCP conversations): only at the pool's ceiling does the caller's least recently used session hand its pod
    over, which is a `boundary` pool's rule for every job. Claim.recycle (broker.claiming.tracking) says more."""
    image: str = ""
    """A custom container image from the pool's allowlist (broker.images); empty: the pool's own."""
    topology: str = ""
    """Where a gang's pods may be: `node` (all on one node), `domain` (within one topology domain), `any`;
    empty: the pool's `topology` (broker.fleet.placement). Stored in the spec JSON, like every field."""

    @property
    def own_pods(self) -> bool:
        """The job's pods are made for it (single-use, or a custom image's), never taken from the pool."""
        return self.single_use or bool(self.image)

    def to_json(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies every value, which cost more than the rest of a job's
        # row encoding. Only `extra` can nest (package, requirements, kernel): it alone is deep-copied.
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["command"] = list(self.command)
        data["env"] = dict(self.env)
        data["extra"] = copy.deepcopy(dict(self.extra)) if self.extra else {}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        return cls(**{**data, "command": tuple(data["command"]), "env": dict(data.get("env") or {}),
                      "extra": dict(data.get("extra") or {})})


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))


@dataclass(frozen=True, slots=True)
class Acquisition:
    """How one pod of a job was obtained, and why a warmer path was not used."""

    pod: str
    path: str
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "path": self.path, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One execution of a job on its pod set."""

    id: str
    job_id: str
    n: int
    pods: tuple[str, ...]
    state: AttemptState = AttemptState.LAUNCHING
    launched_at: float | None = None
    first_instruction_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    error_class: str | None = None
    message: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    """Phase durations the agent and executor measured (package push and unpack, dependency install), s."""

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["pods"] = list(self.pods)
        data["timings"] = dict(self.timings)
        data["state"] = str(self.state)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        return cls(**{**data, "pods": tuple(data["pods"]), "state": AttemptState(data["state"]),
                      "timings": dict(data.get("timings") or {})})

    def move(self, to: AttemptState, **changes: Any) -> Attempt:
        """The one way an attempt changes state."""
        if to not in ATTEMPT_TRANSITIONS[self.state]:
            raise IllegalTransition(f"attempt {self.id}: {self.state} -> {to}")
        return _copy_attempt(self, state=to, **changes)


def attempt_id(job_id: str, n: int) -> str:
    return f"{job_id}:{n}"


@dataclass(frozen=True, slots=True)
class Job:
    """A job row: the spec, its lifecycle, and what each attempt did. `version` guards every write."""

    id: str
    caller: str
    spec: JobSpec
    state: JobState = JobState.PENDING
    version: int = 0
    retries: int = 0
    exit_code: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    pods: tuple[str, ...] = ()
    acquisition: tuple[Acquisition, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    dropped_env: tuple[Mapping[str, str], ...] = ()
    cancel_requested: bool = False
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def preempt_count(self) -> int:
        """How often the job was preempted, derived from its attempts' history."""
        return sum(1 for a in self.attempts if a.error_class == ErrorClass.PREEMPTED)

    @property
    def priority(self) -> int:
        """The priority it is dispatched at: the caller's, aged by each preemption."""
        return self.spec.priority + PREEMPT_AGING * self.preempt_count

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def with_attempt(self, attempt: Attempt) -> Job:
        """Replace (by id) or append `attempt`; attempts are not versioned on their own."""
        return _copy_job(self, attempts=self.attempts_with(attempt))

    def attempts_with(self, attempt: Attempt) -> tuple[Attempt, ...]:
        """The attempts, `attempt` replacing the one of its id or added, in order of `n` (a transition's
        `attempts=`: one row copy where with_attempt and then transition would make two)."""
        attempts = self.attempts
        if not attempts:  # a job's first attempt
            return (attempt,)
        kept = tuple(a for a in attempts if a.id != attempt.id)
        return tuple(sorted((*kept, attempt), key=lambda a: a.n))

    def stamp(self, **times: float) -> Job:
        """Record timing fields without a state change (still a versioned write)."""
        for name in times:
            if name not in TIMING_FIELDS:
                raise ValueError(f"unknown timing field {name}")
        return _copy_job(self, timings={**self.timings, **times}, version=self.version + 1)


_Row = TypeVar("_Row")


def _slot_copier(cls: type[_Row]) -> Callable[..., _Row]:
    """`dataclasses.replace` for a frozen slots dataclass with no `__post_init__`, ~3x faster: the copy's slots are
    filled directly instead of through keyword arguments to `__init__` (a job's row is copied several times a job)."""
    slots = tuple((f.name, cls.__dict__[f.name]) for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    names = frozenset(name for name, _ in slots)

    def copy_with(row: _Row, /, **changes: Any) -> _Row:
        if not names.issuperset(changes):
            raise TypeError(f"{cls.__name__} has no field {min(set(changes) - names)!r}")
        new = object.__new__(cls)
        for name, slot in slots:
            slot.__set__(new, changes[name] if name in changes else slot.__get__(row))
        return new

    return copy_with


_copy_job = _slot_copier(Job)
_copy_attempt = _slot_copier(Attempt)


def transition(job: Job, to: JobState, at: float, **changes: Any) -> Job:
    """Move `job` to `to` if the table allows it; returns the next row version to write.

    The returned job's `version` is one more than the input's: the store writes it only if the row
    still holds the input's version, so a stale or concurrent writer loses instead of overwriting.
    """
    if to not in JOB_TRANSITIONS[job.state]:
        raise IllegalTransition(f"job {job.id}: {job.state} -> {to}")
    timings = dict(job.timings)
    timings.update(changes.pop("timings", {}))
    if to is JobState.QUEUED:
        timings["queued_at"] = at
    elif to in TERMINAL:
        timings["finished_at"] = at
    return _copy_job(job, state=to, version=job.version + 1, timings=timings, **changes)


_ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def new_job_id(now: float | None = None) -> str:
    """A sortable id: 48 bits of milliseconds and 40 random bits in Crockford base32, `j` prefixed."""
    ms = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    value = (ms << 40) | int.from_bytes(os.urandom(5), "big")
    chars = []
    for _ in range(18):
        chars.append(_ID_ALPHABET[value & 31])
        value >>= 5
    return "j" + "".join(reversed(chars))


def job_sort_key(job: Job) -> tuple[int, float, str]:
    """Dispatch order: higher (aged) priority first, then earlier submit, then id (a total order)."""
    return (-job.priority, job.timings.get("submitted_at", 0.0), job.id)


def describe_exit(exit_code: int | None, *, timed_out: bool = False, cancelled: bool = False,
                  oom: bool = False, signal: int | None = None) -> str | None:
    """The error class of a finished attempt, or None when it succeeded."""
    if cancelled:
        return ErrorClass.CANCELLED
    if timed_out:
        return ErrorClass.TIMEOUT
    if oom:
        return ErrorClass.OOM
    if signal is not None:
        return ErrorClass.KILLED
    if exit_code is None:
        return ErrorClass.POD_LOST
    return None if exit_code == 0 else ErrorClass.NON_ZERO_EXIT
