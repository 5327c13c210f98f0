"""Pods back to the pool after an attempt: the reset with proof, and the owner record a restarted broker reads.

A clean pod goes back held for its owner; anything else is deleted (a single-use pod at once, with no reset).
The owner record (the pod's annotations, `broker.pods.owner_annotations`) is split by what a change means:

- **identity** (caller, queue, lease tag, used, origin, role, image, epoch): written at once, so recovery
  never reads a used pod as fresh or gives one caller's pod to another;
- **ageing** (`hold-until`, `idle-since`, `job`): a warm loop of one session changes only these, at every
  job. They are coalesced per pod and written `AGEING_DEFER_S` after the first unwritten change, the latest
  values winning (as the Kubernetes backend does for its PATCHes). A broker killed inside that window restores
  a hold or keep-alive that ends at most that much earlier: warmth lost, never a pod given to the wrong caller.
  A clean stop writes every pending record first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from broker.claiming.jobbook import JobBook
from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import AgentError, FirepoolError
from broker.health.monitor import HealthMonitor
from broker.pods import Origin, Pod, owner_annotations
from broker.pools import PoolSpec
from broker.ports.agent import ResetRequest, ResetResult
from broker.ports.backend import Backend
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth.pooling import PoolController

log = logging.getLogger("firepool.executing")

AGEING_DEFER_S = 1.0
"""How long an ageing-only change of a pod's record waits, to be written once for all the jobs meanwhile."""
_OWNERS_KEPT = 10_000


def owner_identity(pod: Pod) -> tuple[object, ...]:
    """What the owner annotations say (`owner_annotations`) but the ageing ones (`job`, `hold-until`, `idle-since`,
    which change with every job: recovery takes a busy pod's job and owner from the job row), compared at every
    job's start and reset without building the annotations."""
    return pod.caller or "", pod.key or ("", "", ""), pod.used, pod.origin, pod.standby, pod.image, pod.epoch


def reset_request(pool: PoolSpec) -> ResetRequest:
    """The reset every pod of `pool` gets between jobs."""
    return ResetRequest(wipe_paths=pool.wipe_paths, keep_paths=pool.keep_paths)


class PodReturn:
    def __init__(
        self,
        *,
        clock: Clock,
        book: JobBook,
        tracker: Tracker,
        backend: Backend,
        controller: PoolController,
        tasks: Supervisor,
        stats: Stats,
        health: HealthMonitor | None,
    ) -> None:
        self.clock = clock
        self.book = book
        self.tracker = tracker
        self.backend = backend
        self.controller = controller
        self.tasks = tasks
        self.stats = stats
        self.health = health
        self._owners: dict[str, tuple[object, ...]] = {}
        """pod -> the identity last written for it (`owner_identity`)."""
        self._ageing: set[str] = set()
        """Pods whose ageing-only change waits to be written."""

    def started(self, pod: Pod) -> None:
        """A job starts on `pod`: its record changes at once only when the owner does (the job row names the job)."""
        if self._owner_changed(pod):
            self.tasks.spawn(f"annotate {pod.name}", self._annotate(pod))

    def _owner_changed(self, pod: Pod) -> bool:
        return self._owners.get(pod.name) != owner_identity(pod)

    async def _annotate(self, pod: Pod) -> None:
        annotations = owner_annotations(pod)
        if len(self._owners) > _OWNERS_KEPT:  # names of deleted pods; forgetting costs one extra write each
            self._owners.clear()
        self._owners[pod.name] = owner_identity(pod)
        self._ageing.discard(pod.name)  # the latest ageing values go with this write
        try:
            await self.backend.annotate(pod.name, annotations)
        except FirepoolError as exc:
            log.debug("annotating %s failed: %s", pod.name, exc)

    async def _annotate_later(self, pod: Pod) -> None:
        try:
            await self.clock.sleep(AGEING_DEFER_S)
        finally:  # a stop cancels the wait: write now, so a clean stop leaves every hold on record
            if pod.name in self._ageing and self.tracker.pods.get(pod.name) is pod:
                await self._annotate(pod)

    def _held(self, pod: Pod) -> None:
        """A new hold on `pod`: recorded so it survives a broker kill (ageing-only changes coalesced)."""
        if self._owner_changed(pod):
            self.tasks.spawn(f"annotate {pod.name}", self._annotate(pod))
        elif pod.name not in self._ageing:
            self._ageing.add(pod.name)
            self.tasks.spawn(f"annotate {pod.name} later", self._annotate_later(pod))

    async def reset(self, job_id: str, pods: Sequence[Pod], lost: set[str],
                    done: Mapping[str, ResetResult] | None = None, after: asyncio.Event | None = None) -> None:
        """Reset every pod with proof; clean ones go back to the pool held for the owner (not before `after` is
        set), lost ones are deleted. `done`: pods whose agent already reset them as the attempt ended (the
        launch's `reset_after`)."""
        job = self.book.live.get(job_id) or await self.book.get(job_id)
        assert job is not None
        spec = self.tracker.pool(job.spec.pool)
        assert spec is not None
        key = (job.caller, job.spec.queue, job.spec.lease_tag)
        self.tracker.begin_reset(job_id, key)
        request = reset_request(spec)
        done = done or {}
        pending = {p.name for p in pods}
        """Pods still RESETTING for this job."""

        async def reset_one(pod: Pod) -> None:
            if pod.origin is Origin.SINGLE_USE:
                # Never reused: deleting it is the proof, so it retires at once (cancelled, failed or done),
                # and its card's gate stays closed until the deletion.
                self.tracker.finish_reset(pod.name, False, self.clock.now(), spec.hold_seconds)
                pending.discard(pod.name)
                self.controller.delete_retiring(pod.name)
                return
            clean = False
            started = self.clock.now()
            if pod.name not in lost:
                try:
                    result = done.get(pod.name) or await self.backend.agent(pod.name).reset(request)
                    clean = result.clean
                    self.stats.observe_reset(
                        pod.name, started, clean, result.duration_s, result.killed, tuple(result.problems)
                    )
                    if not clean:
                        log.warning(
                            "reset of %s unclean (%s): deleting it", pod.name, "; ".join(result.problems)
                        )
                    elif self.health is not None:
                        clean = self.health.epoch_holds(pod, result.incarnation)  # R5: still the same agent
                except AgentError as exc:
                    log.warning("reset of %s failed: %s", pod.name, exc)
                    self.stats.observe_reset(pod.name, started, False, problems=(f"reset failed: {exc}",))
            self.stats.resets[(pod.pool, clean)] += 1
            if after is not None:
                await after.wait()
            returned = self.tracker.finish_reset(pod.name, clean, self.clock.now(), spec.hold_seconds)
            pending.discard(pod.name)
            if returned:
                self._held(pod)
                self.controller.nudge()  # a new hold: the controller re-plans its next expiry wake-up
            else:
                self.controller.delete_retiring(pod.name)

        try:
            if len(pods) == 1:  # awaited inline: gather would wrap the one reset in a task of its own
                await reset_one(pods[0])
            else:
                ended = await asyncio.gather(*(reset_one(p) for p in pods), return_exceptions=True)
                for failure in ended:
                    if isinstance(failure, BaseException):
                        raise failure
        except Exception:
            # A bug on this path (not an agent's refusal: that makes the pod unclean above). The pods it left
            # RESETTING were never proven clean: they retire, and the finish that raised ends the attempt alone.
            for name in pending:
                self.tracker.finish_reset(name, False, self.clock.now(), 0.0)
                self.controller.delete_retiring(name)
            raise
