"""The fake kubelet (and scheduler): binds new pods to fake nodes and runs a real pod agent for each.

A pod's life: bound to a node `scheduling` chooses (PodScheduled, HAMi's GPU annotations), its image
pulled (`pull_s` the first time on a node; an image containing `:does-not-exist` fails with ErrImagePull then
ImagePullBackOff), its agent's secret read from its Secret volume, the agent started (Running,
podIP, container running), then Ready once the agent answers /v1/health. Deleting the pod marks it
Terminating (deletionTimestamp, deletionGracePeriodSeconds); the kubelet sends the agent SIGTERM, then
SIGKILL at the end of the grace, waits until no process of it is left, and only then removes the object;
until then the pod keeps its node's resources (the scheduler counts every pod bound there).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import AgentError
from broker.running.agent_http import HttpAgentClient
from broker.tasks import Supervisor
from k8s_emulator import gangs
from k8s_emulator import nodes as hami
from k8s_emulator import podfields as fields
from k8s_emulator.agents import AgentProcess, Agents, ContainerError
from k8s_emulator.objects import ApiError, Event, Obj, Store, now_iso

log = logging.getLogger(__name__)

MISSING_IMAGE = ":does-not-exist"


@dataclass
class KubeletConfig:
    start_delay_s: float = 0.0
    """Between binding and the image pull, for every pod (a slow node, a slow sandbox)."""
    pull_s: float = 0.0
    """The first pull of an image on a node (IfNotPresent); later pods there find it present, as after a
    pre-pull DaemonSet. `Emulator.prepull` marks an image present; imagePullPolicy Always always pulls."""
    pull_backoff_s: float = 0.2
    """How long a failed pull shows ErrImagePull before it turns into ImagePullBackOff."""
    agent_port: int = 8471
    """The agent's port when the pod's container declares no port named `agent`."""
    sandbox: str = "auto"
    """auto, bwrap or none, as the local backend: a bubblewrap sandbox per pod, or unisolated."""
    python_prefix: str = sys.prefix
    """The pods' "image": the Python environment the agent and jobs run in."""
    sandbox_uid: int | None = None
    ready_timeout_s: float = 30.0
    agents: bool = True
    """False: pods go Running and Ready without any process (scale tests, the simulator); nothing
    answers at their pod IPs."""
    retry_s: float = 0.05
    """How often an unschedulable pod or one waiting for its Secret is looked at again."""


class _Gone(Exception):
    """The pod was deleted (or replaced under its name) while the kubelet worked on it."""


class Kubelet:
    def __init__(self, store: Store, state_dir: Path, config: KubeletConfig | None = None) -> None:
        self.store = store
        self.config = config or KubeletConfig()
        self.agents = Agents(state_dir, sandbox=self.config.sandbox, python_prefix=self.config.python_prefix,
                             sandbox_uid=self.config.sandbox_uid)
        self._lives: dict[str, asyncio.Task[Any]] = {}
        self._ending: dict[str, asyncio.Task[Any]] = {}
        self._running: dict[str, AgentProcess] = {}
        self._ended: set[str] = set()
        self.hurried = False
        """Set (from any thread): graceful deletes, those under way too, end their pods at once (no grace)."""
        # Pod IPs walk 127.1.x.y from a random start, so two emulators on one host (parallel test runs)
        # do not hand the same IP, and so the same agent port, to two live pods.
        start = secrets.randbelow(250 * 250)
        self._ips = (f"127.1.{n // 250}.{n % 250 + 1}"
                     for n in itertools.islice(itertools.cycle(range(250 * 250)), start, None))
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._images: set[tuple[str, str]] = set()
        """(node, image) pairs already pulled."""
        self._unsubscribe: Callable[[], None] | None = None
        self._main: asyncio.Task[Any] | None = None
        self._tasks = Supervisor()  # names every task and logs any failure

    @property
    def running(self) -> dict[str, AgentProcess]:
        """The live agents by pod uid (for tests: their pids and endpoints)."""
        return dict(self._running)

    def prepull(self, image: str, node: str) -> None:
        """Mark `image` present on `node` (what a pre-pull DaemonSet achieves)."""
        self._images.add((node, image))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def listener(event: Event) -> None:
            if event.resource == "pods":
                loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self.store.graceful_pods = True
        self._unsubscribe = self.store.subscribe(listener)
        for pod in self.store.list("pods", None)[0]:
            self._observe("ADDED", pod)
        self._main = self._tasks.spawn("emulator-kubelet", self._run())

    async def stop(self) -> None:
        """Stop every pod's work and kill every agent (pod objects stay, as on a node that went away)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        self.store.graceful_pods = False
        tasks = [t for t in (self._main, *self._lives.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Pods being deleted finish their kill: cancelled midway, they would leave a directory behind.
        await asyncio.gather(*self._ending.values(), return_exceptions=True)
        await asyncio.gather(*(self.agents.kill(a) for a in self._running.values()))
        self._running.clear()

    async def evict(self, ns: str, name: str, message: str) -> bool:
        """Node-pressure eviction: kill the pod's agent and fail the pod (phase Failed, reason Evicted);
        the object stays until someone deletes it. False when the pod has no running agent here."""
        pod = self._get(ns, name)
        uid = pod["metadata"]["uid"] if pod is not None else ""
        agent = self._running.pop(uid, None)
        if agent is None:
            return False
        life = self._lives.get(uid)
        if life is not None:
            life.cancel()
            await asyncio.gather(life, return_exceptions=True)
        await self.agents.kill(agent)
        self._fail(ns, name, uid, "Evicted", message, 137)
        self._event(ns, name, uid, "Evicted", message, pod["spec"].get("nodeName", "") if pod else "", "Warning")
        return True

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            self._observe(event.type, event.obj)

    def _observe(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if uid not in self._ending and (uid in self._lives or uid in self._running):
                self._ending[uid] = self._tasks.spawn(f"emulator-kill-{meta['name']}",
                                                      self._end(pod, remove=kind != "DELETED"))
            elif kind != "DELETED" and uid not in self._ending:
                self.store.remove("pods", meta.get("namespace", ""), meta["name"])
            return
        pending = pod.get("status", {}).get("phase", "Pending") == "Pending"
        if pending and uid not in self._lives and uid not in self._ended:
            self._lives[uid] = self._tasks.spawn(f"emulator-pod-{meta['name']}",
                                                 self._life(meta.get("namespace", ""), meta["name"], uid))

    async def _end(self, pod: Obj, *, remove: bool) -> None:
        meta = pod["metadata"]
        life = self._lives.pop(meta["uid"], None)
        if life is not None:
            life.cancel()
            await asyncio.gather(life, return_exceptions=True)
        agent = self._running.pop(meta["uid"], None)
        if agent is not None:  # a graceful delete: SIGTERM, SIGKILL at the grace's end; DELETED already: at once
            grace = float(meta.get("deletionGracePeriodSeconds") or 0) if remove else 0.0
            await self.agents.stop(agent, grace, cut=lambda: self.hurried)
        if remove:
            current = self._get(meta.get("namespace", ""), meta["name"])
            if current is not None and current["metadata"]["uid"] == meta["uid"]:
                self.store.remove("pods", meta.get("namespace", ""), meta["name"])
        self._ending.pop(meta["uid"], None)
        self._ended.add(meta["uid"])  # a late event of this pod must not start it again

    # -- one pod's life -------------------------------------------------------------------------

    async def _life(self, ns: str, name: str, uid: str) -> None:
        try:
            await self._live(ns, name, uid)
        except _Gone:
            pass
        except Exception:
            log.exception("emulated kubelet: pod %s/%s failed", ns, name)

    async def _live(self, ns: str, name: str, uid: str) -> None:
        pod = self._mine(ns, name, uid)
        node = pod["spec"].get("nodeName")
        if not node:
            node = await self._schedule(ns, name, uid)
        cfg = self.config
        if cfg.start_delay_s > 0:
            await asyncio.sleep(cfg.start_delay_s)
        image = fields.image(pod)
        if MISSING_IMAGE in image:
            self._event(ns, name, uid, "Pulling", f"Pulling image {image!r}", node)
            message = f"rpc error: code = NotFound desc = failed to pull and unpack image {image!r}: not found"
            self._containers(ns, name, uid, {"waiting": {"reason": "ErrImagePull", "message": message}})
            self._event(ns, name, uid, "Failed", f"Failed to pull image {image!r}: {message}", node, "Warning")
            await asyncio.sleep(cfg.pull_backoff_s)
            self._containers(ns, name, uid, {"waiting": {"reason": "ImagePullBackOff",
                                                         "message": f"Back-off pulling image {image!r}"}})
            self._event(ns, name, uid, "BackOff", f"Back-off pulling image {image!r}", node, "Warning")
            return
        policy = pod["spec"]["containers"][0].get("imagePullPolicy") or ("Always" if image.endswith(":latest")
                                                                          or ":" not in image else "IfNotPresent")
        if (node, image) in self._images and policy != "Always":
            self._event(ns, name, uid, "Pulled", f"Container image {image!r} already present on machine", node)
        else:
            self._event(ns, name, uid, "Pulling", f"Pulling image {image!r}", node)
            if cfg.pull_s > 0:
                await asyncio.sleep(cfg.pull_s)
            self._images.add((node, image))
            self._event(ns, name, uid, "Pulled", f"Successfully pulled image {image!r} in {cfg.pull_s:.3f}s", node)
        self._containers(ns, name, uid, {"waiting": {"reason": "ContainerCreating"}}, pulled=True)
        if not cfg.agents:
            self._write(ns, name, uid, fields.running(next(self._ips), now_iso(), ready=True))
            self._event(ns, name, uid, "Started", "Started container (no agent: KubeletConfig.agents is off)", node)
            return
        secret = await self._secret(ns, name, uid)
        pod = self._mine(ns, name, uid)
        gpus = hami.node_gpus(self._get("", node, "nodes") or {})
        cuda = ",".join(str(gpus.index(u)) for u in hami.allocated_uuids(pod) if u in gpus)
        ip = next(self._ips)
        try:
            agent = self.agents.spawn(f"{ns}.{name}.{uid[:8]}", name, ip, fields.agent_port(pod, cfg.agent_port),
                                      secret, cuda=cuda, kernels=fields.kernels(pod),
                                      flags=fields.agent_flags(pod))
            self._running[uid] = agent
            await self.agents.settle(agent)
        except ContainerError as exc:
            self._fail(ns, name, uid, "StartError", str(exc), 128)
            return
        started = now_iso()
        self._write(ns, name, uid, fields.running(ip, started, ready=False))
        self._event(ns, name, uid, "Started", "Started container (firepool agent)", node)
        await self._await_ready(ns, name, uid, agent, secret)
        while True:  # restartPolicy Never: an agent that dies fails its pod
            await asyncio.sleep(0.1)
            if self.agents.exited(agent):
                self._fail(ns, name, uid, "Error", f"agent exited: {self.agents.log_tail(agent)}", 1)
                return

    async def _schedule(self, ns: str, name: str, uid: str) -> str:
        said = ""
        while True:
            pod = self._mine(ns, name, uid)
            node, uuids, why = gangs.place(pod, self.store.list("nodes", "")[0], self.store.list("pods", None)[0],
                                           lambda: self.store.list("podgroups", None)[0])
            if node is not None:
                break
            if why != said:
                said = why
                self._write(ns, name, uid, fields.unschedulable(why))
                self._event(ns, name, uid, "FailedScheduling", why, "", "Warning", "default-scheduler")
            await asyncio.sleep(self.config.retry_s)
        request = hami.gpu_request(pod)

        def bind(p: Obj) -> Obj:
            p["spec"]["nodeName"] = node
            if uuids:
                allocated = hami.allocation(uuids, request)
                p["metadata"].setdefault("annotations", {}).update({
                    hami.ALLOCATED: allocated, hami.ASSIGNED_NODE: node, "hami.io/bind-phase": "success",
                    **({hami.VOLCANO_ALLOCATED: allocated} if request.volcano else {})})
            return fields.with_condition(p, "PodScheduled", "True")

        self._write(ns, name, uid, bind)
        self._event(ns, name, uid, "Scheduled", f"Successfully assigned {ns}/{name} to {node}", node,
                    component="default-scheduler")
        return node

    async def _secret(self, ns: str, name: str, uid: str) -> str:
        """The agent's token from the pod's first Secret volume: the key its `items` name first, else
        `token` or `secret`, else the Secret's only key. A missing Secret keeps the pod waiting in
        CreateContainerConfigError, as a real kubelet does."""
        said = ""
        while True:
            pod = self._mine(ns, name, uid)
            volumes = [v["secret"] for v in pod["spec"].get("volumes") or [] if v.get("secret")]
            why = "the pod mounts no Secret volume for the agent's token"
            if volumes:
                secret_name = volumes[0].get("secretName", "")
                secret = self._get(ns, secret_name, "secrets")
                data = (secret or {}).get("data") or {}
                key = fields.secret_key(volumes[0], data)
                if key is not None:
                    return base64.b64decode(data[key]).decode()
                why = f'secret "{secret_name}" not found' if secret is None else \
                    f"couldn't find the agent's key in Secret {ns}/{secret_name}"
            if why != said:
                said = why
                self._containers(ns, name, uid, {"waiting": {"reason": "CreateContainerConfigError", "message": why}},
                                 pulled=True)
            await asyncio.sleep(self.config.retry_s)

    async def _await_ready(self, ns: str, name: str, uid: str, agent: AgentProcess, secret: str) -> None:
        client = HttpAgentClient(agent.endpoint, secret, pod=name, timeout_s=2.0)
        deadline = asyncio.get_running_loop().time() + self.config.ready_timeout_s
        try:
            while True:
                try:
                    await client.health()
                    break
                except AgentError:
                    if self.agents.exited(agent) or asyncio.get_running_loop().time() > deadline:
                        self._fail(ns, name, uid, "Error", f"agent never answered: {self.agents.log_tail(agent)}", 1)
                        raise _Gone from None
                await asyncio.sleep(0.005)
        finally:
            await client.close()

        def ready(p: Obj) -> Obj:
            for kind in ("ContainersReady", "Ready"):
                fields.condition(p["status"], kind, "True")
            for status in p["status"].get("containerStatuses", []):
                status["ready"] = True
            return p

        self._write(ns, name, uid, ready)

    # -- writes ---------------------------------------------------------------------------------

    def _get(self, ns: str, name: str, resource: str = "pods") -> Obj | None:
        try:
            return self.store.get(resource, ns, name)
        except ApiError:
            return None

    def _mine(self, ns: str, name: str, uid: str) -> Obj:
        pod = self._get(ns, name)
        if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get("deletionTimestamp"):
            raise _Gone
        return pod

    def _write(self, ns: str, name: str, uid: str, change: Callable[[Obj], Obj]) -> None:
        def checked(p: Obj) -> Obj:
            if p["metadata"]["uid"] != uid:
                raise _Gone
            return change(p)

        try:
            self.store.update("pods", ns, name, checked)
        except ApiError as exc:
            raise _Gone from exc

    def _containers(self, ns: str, name: str, uid: str, state: Obj, *, pulled: bool = False) -> None:
        def change(p: Obj) -> Obj:
            p["status"]["containerStatuses"] = fields.container_statuses(p, state, ready=False, pulled=pulled)
            return p

        self._write(ns, name, uid, change)

    def _fail(self, ns: str, name: str, uid: str, reason: str, message: str, code: int) -> None:
        finished = now_iso()

        def change(p: Obj) -> Obj:
            p["status"].update(phase="Failed", reason=reason, message=message[-300:])
            for kind in ("ContainersReady", "Ready"):
                fields.condition(p["status"], kind, "False", "PodFailed")
            p["status"]["containerStatuses"] = fields.container_statuses(
                p, {"terminated": {"exitCode": code, "reason": reason, "message": message[-300:],
                                   "finishedAt": finished}}, ready=False)
            return p

        with contextlib.suppress(_Gone):
            self._write(ns, name, uid, change)

    def _event(self, ns: str, name: str, uid: str, reason: str, message: str, node: str, kind: str = "Normal",
               component: str = "kubelet") -> None:
        stamp = now_iso()
        self.store.create("events", ns, {
            "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name, "uid": uid, "apiVersion": "v1"},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "source": {"component": component, **({"host": node} if node else {})},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "eventTime": stamp,
            "reportingComponent": component, "reportingInstance": node or component, "action": reason})
