"""Reading a pod's status: is it up, where, stuck on an image, gone; and its ready record.

Pure functions of the pod JSON the watch delivers, so unit tests feed them hand-written pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PULL_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
STAGES = ("scheduled", "image_pulled", "container_started", "agent_answered")


def meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def uid(pod: Mapping[str, Any]) -> str:
    return str(meta(pod).get("uid", ""))


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def pod_ip(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("podIP") or "")


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def pull_error(pod: Mapping[str, Any]) -> str:
    """`Reason: message` when the agent container cannot get its image, else ""."""
    for status in _containers(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_ERRORS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return ""


def running(pod: Mapping[str, Any]) -> bool:
    """The agent container runs and the pod has an IP: time to ask the agent."""
    if phase(pod) != "Running" or not pod_ip(pod):
        return False
    return any("running" in (s.get("state") or {}) for s in _containers(pod))


def ended(pod: Mapping[str, Any]) -> str:
    """Why a pod can never serve again (terminated, failed, being deleted, evicted), else ""."""
    if meta(pod).get("deletionTimestamp"):
        return "being deleted"
    if phase(pod) in ("Failed", "Succeeded"):
        reason = (pod.get("status") or {}).get("reason") or phase(pod)
        return f"{reason}: {(pod.get('status') or {}).get('message', '')}".rstrip(": ")
    for status in _containers(pod):
        term = (status.get("state") or {}).get("terminated")
        if term:
            return f"agent container terminated ({term.get('reason', 'exit')} {term.get('exitCode', '')})".strip()
    return ""


@dataclass
class ReadyRecord:
    """Seconds from the create call to each stage, as the broker observed them."""

    created: float
    stages: dict[str, float] = field(default_factory=dict)

    def observe(self, pod: Mapping[str, Any], now: float) -> None:
        """Note every stage the pod has reached that was not seen before."""
        spec = pod.get("spec") or {}
        conditions = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        reached = {
            "scheduled": bool(spec.get("nodeName")) or conditions.get("PodScheduled") == "True",
            "image_pulled": any(s.get("imageID") for s in _containers(pod)),
            "container_started": any("running" in (s.get("state") or {}) for s in _containers(pod)),
        }
        for stage in STAGES[:3]:
            if reached[stage] and stage not in self.stages:
                self.stages[stage] = round(now - self.created, 4)
        if self.stages.get("container_started") is not None:  # a stage implies those before it
            for stage in STAGES[:2]:
                self.stages.setdefault(stage, self.stages["container_started"])

    def answered(self, now: float) -> None:
        self.stages["agent_answered"] = round(now - self.created, 4)

    def view(self) -> dict[str, float | None]:
        return {stage: self.stages.get(stage) for stage in STAGES}

    @classmethod
    def loads(cls, created: float, text: str) -> ReadyRecord:
        """A record as `dumps` wrote it into the pod's annotation (a restarted broker's view)."""
        try:
            raw = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        stages = {k: float(v) for k, v in raw.items() if k in STAGES and isinstance(v, int | float)} \
            if isinstance(raw, dict) else {}
        return cls(created, stages)

    def dumps(self) -> str:
        return json.dumps(self.view(), separators=(",", ":"))
