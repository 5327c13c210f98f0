"""What the control plane does with hardware faults: count them, drain quarantined pods, re-queue for free.

The executor reports every finished attempt (`attempt_ended`); the pool controller reports every pod the
backend started (`created`, for its node) and asks which devices to avoid (`Quarantine.blocked_devices`).
A pod whose attempt failed on hardware is not reused (it retires at release); the job it ran goes back
to the queue without spending its retry budget, up to the catalog's `free_requeues`, and lands elsewhere
(the pod that failed is gone, and its device too once quarantined).

Node epochs (R5, broker.health.nodeepochs): `check_nodes` reads the nodes the backend reports; a node
whose boot epoch changed voids every pod on it. Idle pods retire (their holds go with them), busy ones are
fenced (the backend fails their agent calls, so the attempt ends lost) and retire at release, and the job
goes back to the queue without spending a retry (`requeues_free`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from broker.claiming.tracker import Tracker
from broker.errors import FirepoolError
from broker.fleet.nodes import Node
from broker.health.decisions import EPOCH_INVALIDATED, decided
from broker.health.epochs import Epoch, Verdict, judge
from broker.health.gpuhealth import GpuHealth, HealthReader, worse
from broker.health.nodeepochs import NodeEpochs, voided
from broker.health.quarantine import Quarantine
from broker.jobs import ErrorClass, Job
from broker.pods import Pod, PodState
from broker.ports.agent import AttemptStatus
from broker.ports.backend import AVOID_NODE, PodInfo
from broker.warmth.pooling import PoolController

log = logging.getLogger("firepool.health")

LAUNCH_REFUSED = "the pod's agent refused the launch"
"""The executor's message for a rank whose agent would not start the attempt (a launch failure)."""


class HealthMonitor:
    def __init__(self, quarantine: Quarantine, tracker: Tracker, controller: PoolController,
                 reader: HealthReader | None = None) -> None:
        self.quarantine = quarantine
        self.tracker = tracker
        self.controller = controller
        self.reader = reader
        """Reads NVML health of device keys on the host (the local backend's `gpu_health`); None: not read."""
        self.baseline: dict[str, GpuHealth] = {}
        """The last NVML reading of each device: a fault is a change for the worse since."""
        self.nodes: dict[str, str] = {}
        """pod name -> the node the backend placed it on ("" when it does not say)."""
        self.node_epochs = NodeEpochs()
        self.voided: dict[str, str] = {}
        """pod name -> why its node epoch voided it (until the pod is gone)."""
        controller.avoid = self.avoid
        controller.created = self.created
        quarantine.on_change = self.drain

    def created(self, pod: Pod, info: PodInfo) -> None:
        node = str(info.details.get("node") or "")
        if node:
            self.nodes[pod.name] = node
            if len(self.nodes) > 2 * len(self.tracker.pods) + 64:  # forget pods long gone
                self.nodes = {n: v for n, v in self.nodes.items() if n in self.tracker.pods}

    def avoid(self) -> frozenset[str]:
        """Devices no new pod gets: quarantined ones, and every card of a quarantined node (so placement counts
        the node full, and a cluster backend keeps the node out of the pod's node affinity)."""
        devices = self.quarantine.blocked_devices()
        nodes = self.quarantine.blocked_nodes()
        if not nodes:
            return devices
        # The node's own key too: a node without GPUs the backend lists (CPU pods' nodes) is kept out as well.
        return devices | {g for n in self.controller.backend.nodes() if n.id in nodes for g in n.gpus} | \
            {AVOID_NODE + n for n in nodes}

    def node_of(self, pod: str) -> str:
        return self.nodes.get(pod, "")

    def requeues_free(self, job: Job, error: str | None) -> bool:
        """Does a failed attempt go back to the queue without spending a retry? A hardware fault, within the
        catalog's `free_requeues`; a pod lost because its node's epoch changed under it (R5), always: the
        work died with the node's old incarnation, not through the job."""
        if error == ErrorClass.HARDWARE_FAULT:
            return self.free_requeue(job)
        return error == ErrorClass.POD_LOST and any(p in self.voided for p in job.pods)

    def free_requeue(self, job: Job) -> bool:
        """May a job whose attempt failed on hardware go back to the queue without spending a retry?"""
        used = sum(1 for a in job.attempts[:-1] if a.error_class == ErrorClass.HARDWARE_FAULT)
        return used < self.quarantine.settings.free_requeues

    async def prime(self, keys: Sequence[str]) -> None:
        """Take the first NVML reading of these devices (at start), so a later rise is a fault."""
        if self.reader is not None and keys:
            self.baseline.update(await self.reader(keys))

    async def _nvml_faults(self, pod: Pod) -> list[tuple[str, str]]:
        """(device key, why) for each device of the pod whose NVML health got worse since the last reading."""
        if self.reader is None or not pod.gpus:
            return []
        try:
            now = await self.reader(pod.gpus)
        except Exception as exc:  # noqa: BLE001 - a failing NVML read must not fail the attempt's outcome
            log.warning("reading NVML health of %s failed: %s", pod.name, exc)
            return []
        found = [(key, why) for key, health in now.items() if (why := worse(self.baseline.get(key), health))]
        self.baseline.update(now)
        return found

    async def attempt_ended(self, job_id: str, caller: str, pods: Sequence[Pod],
                            statuses: Sequence[AttemptStatus | None]) -> list[AttemptStatus | None]:
        """Count the hardware-class failures of a finished attempt; the statuses, a failure NVML explains
        marked as a hardware fault like one the agent classified."""
        hardware = False
        statuses = list(statuses)
        for rank, (pod, status) in enumerate(zip(pods, statuses, strict=True)):
            if status is None:
                continue
            failed = not status.cancelled and (status.exit_code not in (0, None) or status.error_class is not None)
            nvml = await self._nvml_faults(pod) if failed and not status.hardware_fault else []
            if nvml:  # NVML names the card(s): only those are counted
                hardware = True
                statuses[rank] = dataclasses.replace(status, hardware_fault="; ".join(why for _, why in nvml))
                self.tracker.retire_at_release(pod.name)
                for key, why in nvml:
                    await self._count((key,), pod.name, why, job_id, caller)
                continue
            if status.hardware_fault and not status.cancelled:
                hardware = True
                why = status.hardware_fault
                self.tracker.retire_at_release(pod.name)  # never reused: its card may be the culprit
            elif status.error_class == ErrorClass.LAUNCH_ERROR and status.message == LAUNCH_REFUSED:
                why = "the agent refused a launch"
            else:
                continue
            await self._count(pod.gpus, pod.name, why, job_id, caller)
        if hardware:
            log.info("attempt of %s failed on hardware", job_id)
        return statuses

    async def _count(self, gpus: Sequence[str], pod: str, why: str, job_id: str, caller: str) -> None:
        try:
            await self.quarantine.fault(gpus, self.node_of(pod), why, subject=job_id, caller=caller)
        except FirepoolError as exc:  # the store is down: the count is lost, the job's outcome is not
            log.error("counting a hardware fault of pod %s failed: %s", pod, exc)

    def epoch_holds(self, pod: Pod, incarnation: int | None) -> bool:
        """After a reset: does the pod's agent still answer with the epoch its work was bound under (R5)?

        `incarnation` is the one the agent's reset answer carried. A changed one (the agent restarted
        under the pod's name) invalidates the pod: it is not returned, so no hold is given on it and it is
        never reused. A pod whose epoch was never recorded, or an agent that does not say, is judged at
        the next restart's recovery instead."""
        if pod.name in self.voided:
            return False  # its node's epoch changed under it (check_nodes said so when it happened)
        recorded = Epoch.parse(pod.epoch)
        if recorded is None or incarnation is None:
            return True
        reported = Epoch(recorded.identity, incarnation)
        if judge(recorded, reported) is not Verdict.CHANGED:
            return True
        decided(EPOCH_INVALIDATED, f"pod/{pod.name}", "its agent answers with another incarnation than the one "
                "its work was bound under: the pod is not reused", caller=pod.caller,
                detail={"recorded": str(recorded), "reported": str(reported)}, events=self.quarantine.events)
        return False

    def check_nodes(self, nodes: Sequence[Node]) -> list[str]:
        """Judge the nodes as reported now (R5); the pods voided by a changed node epoch."""
        changes = self.node_epochs.observe(nodes)
        changed = {c.node for c in changes}
        current = self.node_epochs.recorded
        hit = [pod for pod in self.tracker.snapshot() if pod.name not in self.voided
               and voided(pod.epoch, pod.node or self.node_of(pod.name), current, changed)]
        for change in changes:
            pods = [p.name for p in hit if (p.node or self.node_of(p.name)) == change.node]
            decided(EPOCH_INVALIDATED, f"node/{change.node}", "its boot epoch changed (rebooted, or replaced under "
                    "the same name): nothing bound to the old epoch is trusted",
                    detail={"recorded": change.recorded, "reported": change.reported, "pods": pods},
                    events=self.quarantine.events)
        fence = getattr(self.controller.backend, "fence", None)
        for pod in hit:
            node = pod.node or self.node_of(pod.name)
            why = f"its node {node} has another boot epoch ({current.get(node, '')}) than the one it was bound under"
            self.voided[pod.name] = why
            if node not in changed:  # a changed node's pods were named in its own announcement
                decided(EPOCH_INVALIDATED, f"pod/{pod.name}", why, caller=pod.caller,
                        detail={"recorded": pod.epoch, "node": node}, events=self.quarantine.events)
            if pod.state in (PodState.IDLE, PodState.STARTING):
                self.controller.retire(pod.name)  # its hold goes with it; never reused
            elif pod.state is not PodState.GONE:
                self.tracker.retire_at_release(pod.name)
                if fence is not None:
                    fence(pod.name, why)  # its agent calls fail: the attempt ends lost and is re-queued
        if len(self.voided) > 2 * len(self.tracker.pods) + 64:  # forget pods long gone
            self.voided = {n: w for n, w in self.voided.items() if n in self.tracker.pods}
        if hit:
            self.controller.wake()
        return [p.name for p in hit]

    def drain(self) -> None:
        """Quarantined devices and nodes take no new work: idle pods on them retire, busy ones at release."""
        blocks = self.quarantine.blocks
        for pod in self.tracker.snapshot():
            if not blocks(pod.gpus, self.node_of(pod.name)):
                continue
            if pod.state in (PodState.IDLE, PodState.STARTING):
                self.controller.retire(pod.name)
            elif pod.state in (PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING):
                self.tracker.retire_at_release(pod.name)
        self.controller.wake()
