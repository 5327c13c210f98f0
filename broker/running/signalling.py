"""What the broker sends a running attempt's ranks: a caller's signal or cancel, a preemption, a kill.

The executor (broker.running.executing) launches and watches attempts; this is its half that reaches into one
that runs, through each rank's agent. A cancel and a preemption ask the agent to TERM the ranks and KILL them
after a grace (the agent keeps the deadline); the watch then ends the attempt `Cancelled` or `Preempted`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.tracker import Tracker
from broker.errors import AgentError, FirepoolError
from broker.jobs import Job, JobState
from broker.pods import Pod
from broker.ports.backend import Backend
from broker.running.outcome import PREEMPTING

log = logging.getLogger("firepool.executing")



class Signalling:
    """The signalling half of broker.running.executing.Executor (a mixin: its state lives there)."""

    book: JobBook
    tracker: Tracker
    backend: Backend
    kill_grace_s: float
    launched: dict[str, str]
    preempting: dict[str, str]

    async def _kill(self, aid: str, pods: Sequence[Pod]) -> None:
        for pod in pods:
            try:
                await self.backend.agent(pod.name).signal(aid, "KILL")
            except FirepoolError:
                pass

    async def signal(self, job_id: str, name: str) -> bool:
        """Send `name` to every rank of the running attempt; False when none is launched."""
        aid = self.launched.get(job_id)
        pods = self.tracker.pods_of(job_id)
        if aid is None or not pods:
            return False
        for pod in pods:
            try:
                await self.backend.agent(pod.name).signal(aid, name)
            except AgentError as exc:
                if exc.details.get("status") != 404:
                    raise
                return False  # the agent refused the launch or already forgot it: nothing runs to signal
        return True

    async def cancel(self, job_id: str) -> None:
        """Kill a running attempt on the caller's request; the watch then finishes the job CANCELLED."""
        aid = self.launched.get(job_id)
        if aid is None:
            return  # not launched yet: start() checks the flag after the gate
        for pod in self.tracker.pods_of(job_id):
            try:
                await self.backend.agent(pod.name).cancel(aid, self.kill_grace_s)
            except FirepoolError as exc:
                log.warning("cancelling %s on %s failed: %s", aid, pod.name, exc)

    async def preempt(self, job_id: str, why: str, grace_s: float) -> bool:
        """SIGTERM every rank now (so the job can checkpoint) and SIGKILL it after `grace_s` (the agent keeps the
        deadline); the attempt then ends `Preempted` and the job re-queues unless `max_retries` says no."""
        aid = self.launched.get(job_id)
        if aid is None:
            return False
        self.preempting[job_id] = why

        def mark(job: Job) -> Job:  # durable: a broker restarted meanwhile still records `Preempted`
            attempt = job.current_attempt
            if job.state is not JobState.RUNNING or attempt is None or attempt.id != aid:
                raise Abort
            marked = dataclasses.replace(attempt, message=PREEMPTING + why)
            return dataclasses.replace(job.with_attempt(marked), version=job.version + 1)

        try:
            await self.book.write(job_id, mark)
        except FirepoolError as exc:
            log.warning("recording the preemption of %s failed (this broker still remembers it): %s", aid, exc)
        for pod in self.tracker.pods_of(job_id):
            try:
                await self.backend.agent(pod.name).cancel(aid, grace_s)
            except FirepoolError as exc:
                log.warning("preempting %s on %s failed: %s", aid, pod.name, exc)
        return True
