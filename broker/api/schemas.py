"""Request models (strict: unknown fields and wrong types are rejected) and the JSON views of jobs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from broker.jobs import TIMING_FIELDS, Attempt, Job, JobSpec
from firepool_agent.limits import MAX_ARGV_ITEMS, MAX_ENV_ENTRIES, MAX_NAME_CHARS


class Strict(BaseModel):
    # NaN and Infinity are not JSON, though Python's parser reads them: a number must be finite everywhere.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class JobRequest(Strict):
    """POST /v1/jobs."""

    pool: str = Field(default="cpu", min_length=1, max_length=63, description="Hardware pool (SKU) to run on.")
    command: list[str] = Field(min_length=1, max_length=MAX_ARGV_ITEMS,
                               description="argv of rank 0's process: no NUL, at most 131071 bytes an argument, "
                               "1 MiB with env as execve counts it (docs/limits.md).")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ENTRIES,
                                description="Extra environment; steering variables are dropped (`dropped_env`).")
    lease_tag: str = Field(default="", max_length=MAX_NAME_CHARS,
                           description="Session (reuse) tag; same caller+queue+tag reuses a warm pod. Printable "
                           "text: no control characters.")
    queue: str = Field(default="default", min_length=1, max_length=64)
    pods: int = Field(default=1, ge=1, le=1024, description="Gang size: all pods are claimed at once or none.")
    recycle: bool = Field(default=True, description="In a `retire` or `hint` pool, a new session may take the "
                                                    "caller's idle pod of another session (its workspace is "
                                                    "emptied); false leaves other sessions' pods alone until the "
                                                    "pool is at its ceiling, which a `boundary` pool (the "
                                                    "default) always does.")
    single_use: bool = Field(default=False, description="A pod created for this job and deleted at release.")
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    max_retries: int = Field(default=0, ge=0, le=20)
    priority: int = Field(default=0, ge=-1000, le=1000)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128)
    package: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                                description="SHA-256 of an uploaded code package, unpacked into the job's cwd.")
    requirements: str | None = Field(default=None, max_length=65536,
                                     description="Text of a requirements file, installed on the pod before the job.")
    kernel: bool = Field(default=False, description="Agent kernel mode: the command may run the agent's "
                         "Jupyter kernel launcher (`python3 -m firepool_agent.kernel`).")
    preemptible: bool = Field(default=False, description="May run beyond its team's guaranteed quota on quota "
                              "borrowed from other teams, and be preempted (SIGTERM, SIGKILL after the grace) and "
                              "re-queued when an owner reclaims it (docs/quotas.md).")
    image: str | None = Field(default=None, min_length=1, max_length=512,
                              description="A custom container image from the pool's `images` allowlist (kubernetes "
                              "backend only): a mutable tag runs on a single-use pod; a digest-pinned one "
                              "(`@sha256:`) on a pod only this caller's jobs of that image reuse.")
    topology: Literal["node", "domain", "any"] | None = Field(
        default=None, description="Where a gang's pods may be: `node` all on one node, `domain` within one "
        "topology domain, `any` wherever they fit; absent: the pool's `topology` (docs/fleet.md). A `node` or "
        "`domain` gang waits for a whole set rather than run split.")
    mode: Literal["plain", "ray"] = Field(default="plain", description="`ray`: the job's pods form an ephemeral "
                                          "Ray cluster (head on rank 0, a worker node on each other pod) and the "
                                          "command runs as the driver with RAY_ADDRESS; the reset tears it down.")

    def to_spec(self) -> JobSpec:
        return JobSpec(pool=self.pool, recycle=self.recycle, command=tuple(self.command), env=dict(self.env), lease_tag=self.lease_tag,
                       queue=self.queue, pods=self.pods, single_use=self.single_use, timeout_s=self.timeout_s,
                       max_retries=self.max_retries, priority=self.priority, idempotency_key=self.idempotency_key,
                       image=self.image or "", topology=self.topology or "", extra={**late_binding_extra(self.package, self.requirements),
                              **({"kernel": True} if self.kernel else {}),
                              **({"preemptible": True} if self.preemptible else {}),
                              **({"mode": self.mode} if self.mode != "plain" else {})})


def late_binding_extra(package: str | None, requirements: str | None) -> dict[str, Any]:
    """The spec's `extra` entries for a code package and a requirements text (absent when not asked)."""
    return {k: v for k, v in (("package", package), ("requirements", requirements)) if v is not None}


SignalName = Literal["INT", "TERM", "HUP", "USR1", "USR2", "QUIT", "KILL",
                     "SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "SIGKILL"]


class SignalRequest(Strict):
    """POST /v1/jobs/{id}/signal."""

    signal: SignalName = Field(description="INT, TERM, HUP, USR1, USR2, QUIT to rank 0's process group; KILL takes "
                        "every process of the attempt.")


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """Drop absent values: an exit code that never happened is absent, not 0 and not null."""
    return {k: v for k, v in d.items() if v is not None}


def attempt_view(a: Attempt) -> dict[str, Any]:
    return _clean({"id": a.id, "n": a.n, "pods": list(a.pods), "state": str(a.state), "launched_at": a.launched_at,
                   "first_instruction_at": a.first_instruction_at, "finished_at": a.finished_at,
                   "exit_code": a.exit_code, "error_class": a.error_class, "message": a.message,
                   "timings": dict(a.timings) or None})


def job_view(job: Job, waiting_reason: str | None = None) -> dict[str, Any]:
    spec = job.spec
    view = {
        "id": job.id, "state": str(job.state), "caller": job.caller, "pool": spec.pool,
        "command": list(spec.command), "env": dict(spec.env), "lease_tag": spec.lease_tag, "queue": spec.queue,
        "pods": spec.pods, "single_use": spec.single_use, "recycle": spec.recycle, "timeout_s": spec.timeout_s,
        "max_retries": spec.max_retries, "priority": spec.priority, "idempotency_key": spec.idempotency_key,
        "bound_pods": list(job.pods), "retries": job.retries,
        "exit_code": job.exit_code, "error_class": job.error_class, "error_message": job.error_message,
        "acquisition": [a.to_json() for a in job.acquisition],
        "attempts": [attempt_view(a) for a in job.attempts],
        "timings": {k: job.timings[k] for k in TIMING_FIELDS if k in job.timings},
        "dropped_env": [dict(d) for d in job.dropped_env],
        "cancel_requested": job.cancel_requested or None,
        "waiting_reason": waiting_reason,
        "package": spec.extra.get("package"), "requirements": spec.extra.get("requirements"),
        "kernel": True if spec.extra.get("kernel") else None,
        "preemptible": True if spec.extra.get("preemptible") else None,
        "preempt_count": job.preempt_count or None,
        "effective_priority": job.priority if job.priority != spec.priority else None,
        "image": spec.image or None,
        "mode": spec.extra.get("mode"),
        "topology": spec.topology or None,
    }
    return _clean(view)


class AcquisitionView(BaseModel):
    pod: str
    path: str = Field(description="warm | recycled | standby | new | custom_image")
    reason: str | None = Field(default=None, description="Why a warmer path was not used.")


class JobView(BaseModel):
    """A job as the API returns it (documentation model; absent fields are omitted)."""

    id: str
    state: str
    caller: str
    pool: str
    lease_tag: str
    queue: str
    pods: int
    retries: int
    exit_code: int | None = Field(default=None, description="Rank 0's exit code; absent when no process exited.")
    error_class: str | None = None
    acquisition: list[AcquisitionView] = []
    attempts: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    dropped_env: list[dict[str, str]] = []
    preemptible: bool | None = Field(default=None, description="May borrow other teams' quota and be preempted.")
    preempt_count: int | None = Field(default=None, description="Times the job was preempted (attempts ending "
                                      "`Preempted`); each adds one to its dispatch priority.")
    effective_priority: int | None = Field(default=None, description="Priority aged by preemptions, when it differs.")


class KernelView(BaseModel):
    """A kernel job's connection info (documentation model): what jupyter_client loads, keys included."""

    job: str
    connection: dict[str, Any] = Field(description="ip, transport, the five ports, key, signature_scheme and, "
                                       "when the kernel encrypts, curve_publickey and curve_secretkey: the "
                                       "owner's secret, never logged")


class ErrorBody(BaseModel):
    class_: str = Field(alias="class")
    message: str
    retryable: bool
    details: dict[str, Any]


class ErrorView(BaseModel):
    error: ErrorBody
