"""What the emulated kubelet reads from a pod's spec and writes into its status.

Conditions move their lastTransitionTime only when their status changes; container statuses carry
an imageID once the image is present, so a watcher can tell pulled, started and ready apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k8s_emulator.objects import Obj, now_iso

AGENT_PORT_NAME = "agent"
SECRET_KEYS = ("token", "secret")


def running(ip: str, started: str, *, ready: bool) -> Callable[[Obj], Obj]:
    """Phase Running on `ip` with every container running since `started`; Ready only when `ready`."""

    def change(p: Obj) -> Obj:
        status = p["status"]
        status.update(phase="Running", podIP=ip, podIPs=[{"ip": ip}], hostIP="127.0.0.1",
                      hostIPs=[{"ip": "127.0.0.1"}], startTime=started)
        for kind in ("PodReadyToStartContainers", "Initialized"):
            condition(status, kind, "True")
        for kind in ("ContainersReady", "Ready"):
            if ready:
                condition(status, kind, "True")
            else:
                condition(status, kind, "False", "ContainersNotReady", "containers with unready status")
        status["containerStatuses"] = container_statuses(p, {"running": {"startedAt": started}}, ready=ready)
        return p

    return change


def secret_key(volume: Obj, data: Obj) -> str | None:
    items = volume.get("items") or []
    if items:
        return str(items[0]["key"]) if items[0].get("key") in data else None
    for key in SECRET_KEYS:
        if key in data:
            return key
    return next(iter(data)) if len(data) == 1 else None


def image(pod: Obj) -> str:
    return str(pod["spec"]["containers"][0].get("image", ""))


def agent_port(pod: Obj, default: int) -> int:
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == AGENT_PORT_NAME:
                return int(port["containerPort"])
    return default


def kernels(pod: Obj) -> str:
    """The agent's `--kernels` mode from the first container's command line, if it names one."""
    container = pod["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if "--kernels" in argv[:-1]:
        mode = str(argv[argv.index("--kernels") + 1])
        if mode in ("cold", "learned", "prestart"):
            return mode
    return "cold"


def agent_flags(pod: Obj) -> list[str]:
    """The agent's own flags the kubelet passes through from the container's command line (`--incarnation`)."""
    container = pod["spec"]["containers"][0]
    argv = [str(a) for a in (*(container.get("command") or []), *(container.get("args") or []))]
    if "--incarnation" in argv[:-1] and argv[argv.index("--incarnation") + 1].isdigit():
        return ["--incarnation", argv[argv.index("--incarnation") + 1]]
    return []


def condition(status: Obj, kind: str, value: str, reason: str | None = None, message: str | None = None) -> None:
    """Set a condition; its lastTransitionTime moves only when its status changes."""
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition["type"] == kind:
            if condition["status"] != value:
                condition["lastTransitionTime"] = now_iso()
            condition.update(status=value, reason=reason, message=message)
            return
    conditions.append({"type": kind, "status": value, "lastProbeTime": None, "lastTransitionTime": now_iso(),
                       "reason": reason, "message": message})


def unschedulable(why: str) -> Callable[[Obj], Obj]:
    return lambda pod: with_condition(pod, "PodScheduled", "False", "Unschedulable", why)


def with_condition(pod: Obj, kind: str, value: str, reason: str | None = None, message: str | None = None) -> Obj:
    condition(pod.setdefault("status", {}), kind, value, reason, message)
    return pod


def container_statuses(pod: Obj, state: Obj, *, ready: bool, pulled: bool = False) -> list[Any]:
    """Every container in `state`; imageID is set once the image is present (ready records read it)."""
    running = "running" in state
    container_id = f"firepool://{pod['metadata']['uid'][:12]}" if running else ""
    return [{"name": c["name"], "image": c.get("image", ""),
             "imageID": f"{c.get('image', '')}@sha256:emulated" if running or pulled else "",
             "containerID": container_id, "ready": ready, "started": running, "restartCount": 0, "state": state,
             "lastState": {}}
            for c in pod["spec"]["containers"]]
