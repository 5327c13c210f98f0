"""`KubernetesBackend`: the `Backend` port on a Kubernetes namespace.

Creates a Secret (the agent's bearer secret) and a pod per request, waits on the watch cache for the pod
to run, then for its agent to answer at the pod IP (`starting`; nodes: `nodeview`; settings: `settings`). Every pod and Secret carries `firepool.io/broker`;
the watch selects by it. The Secret records the UID of the pod it was made for: a pod under the same name
with another UID is a different pod, and nothing on it is trusted. A pod deleted or evicted from outside
is marked lost, so its agent calls fail and the attempt ends `PodLost` (and follows the retry policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

from broker.backends.kubernetes import hami, podstatus, volcano
from broker.backends.kubernetes.adopting import NotOurs, create_or_adopt
from broker.backends.kubernetes.annotating import Annotator
from broker.backends.kubernetes.deleting import Deleting
from broker.backends.kubernetes.kubeapi import KubeApi
from broker.backends.kubernetes.manifests import (
    AGENT_INCARNATION,
    ANN_GPUS,
    ANN_NODE_EPOCH,
    ANN_ORIGIN,
    ANN_READY,
    HOSTNAME,
    LABEL_BROKER,
    LABEL_ROLE,
    pod_manifest,
    secret_manifest,
    secret_name,
)
from broker.backends.kubernetes.nodeview import NODES_EVERY_S, NodeView
from broker.backends.kubernetes.podagent import AgentFactory, PodAgent, http_agent
from broker.backends.kubernetes.ratelimit import Retryable, TokenBucket, with_backoff
from broker.backends.kubernetes.records import ANN_POD_UID, PodRecord, adopt
from broker.backends.kubernetes.settings import KubernetesSettings
from broker.backends.kubernetes.starting import LaunchError, Starting
from broker.backends.kubernetes.sweeping import sweep_cards
from broker.backends.kubernetes.templates import PodTemplate, parse_template
from broker.backends.kubernetes.watching import Change, PodCache, Watcher
from broker.backends.local import agent_kernels
from broker.backends.netports import DEFAULT_MASTER_PORT
from broker.clock import Clock
from broker.errors import AgentError, BackendError
from broker.fencing import Term
from broker.fleet.nodes import Node
from broker.health.epochs import Epoch, Verdict, judge
from broker.pools import PoolSpec
from broker.ports.agent import AgentClient
from broker.ports.backend import Device, PodInfo, PodRequest
from broker.running.topology import Rendezvous
from firepool_agent.kernel import POD_IP_ENV

__all__ = ["ANN_POD_UID", "KubernetesBackend", "KubernetesSettings", "LaunchError"]
"""Importable from here as before the split (settings, starting, nodeview)."""

log = logging.getLogger("firepool.k8s")

SYNC_TIMEOUT_S = 30.0


def _started_with_incarnation(pod: Mapping[str, Any]) -> bool:
    """Was the pod's agent given its incarnation (a manifest of this version)? A pod made before epochs
    existed reports none, and the broker then trusts nothing bound to it (broker.health.epochs)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return "--incarnation" in (containers[0].get("args") or [])


class KubernetesBackend(NodeView, Starting, Deleting):
    kind = "kubernetes"
    isolated = True
    runs_images = True
    """A job's custom image replaces the template's in its pod's agent container (broker.images)."""

    def __init__(self, clock: Clock, api: KubeApi, settings: KubernetesSettings = KubernetesSettings(),
                 agent_factory: AgentFactory | None = None, term: Term | None = None) -> None:
        """`agent_factory(endpoint, secret, pod)` makes agent clients (tests: fakes); default HTTP, whose requests
        name `term` (the broker's, `broker.fencing`)."""
        self.clock = clock
        self.api = api
        self.agent_factory: AgentFactory = agent_factory or partial(http_agent, term=term)
        self.settings = settings
        self.selector = f"{LABEL_BROKER}={settings.broker_id}"
        self.cache = PodCache()
        self.watcher = Watcher(self.cache, lambda: self.api.list("Pod", self.selector),
                               lambda rv: self.api.watch(self.selector, rv), self._on_change)
        self._task: asyncio.Task[None] | None = None
        self._pods: dict[str, PodRecord] = {}
        self._deleting: set[str] = set()
        self._vanished: dict[str, asyncio.Event] = {}
        """Pods being deleted -> set when the watch sees the object go."""
        self._clients: dict[str, AgentClient] = {}
        self._templates: dict[str, PodTemplate] = {}
        self._bucket = TokenBucket(clock, settings.rate.qps, settings.rate.burst)
        self._pull_block: dict[str, tuple[float, float, str]] = {}
        """template hash (or custom image) -> (until, pause, reason) after an image pull error."""
        self._port = DEFAULT_MASTER_PORT
        self._devices: dict[str, Device] = {}
        self._nodes: list[Node] = []
        self._nodes_at = -math.inf
        self._nodes_failed = False
        self.annotator = Annotator(clock, self._patch_annotations, settings.annotate_defer_s)
        self.podgroups = volcano.PodGroups(api)

    # -- watch ----------------------------------------------------------------------------------

    async def _ensure(self) -> None:
        if self.clock.now() - self._nodes_at >= NODES_EVERY_S:
            await self.refresh_nodes()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.watcher.run(), name="firepool k8s pod watch")
        if not self.watcher.synced.is_set():
            try:
                await asyncio.wait_for(self.watcher.synced.wait(), SYNC_TIMEOUT_S)
            except TimeoutError:
                raise BackendError(f"no pod list from the API server within {SYNC_TIMEOUT_S:.0f} s") from None

    def _on_change(self, change: Change) -> None:
        """Mirror one observation; runs on the event loop, does no I/O."""
        name = str(podstatus.meta(change.pod).get("name", ""))
        if change.kind == "deleted" and name in self._vanished:
            self._vanished[name].set()
        rec = self._pods.get(name)
        if rec is None:
            return
        pod_uid = podstatus.uid(change.pod)
        if judge(Epoch(rec.uid), Epoch(pod_uid)) is Verdict.CHANGED:
            if not rec.lost:
                rec.lost = f"replaced by another pod (UID {pod_uid}, not {rec.uid}): not trusted"
                log.warning("pod %s %s", name, rec.lost)
        elif change.kind == "deleted":
            if name not in self._deleting and not rec.lost:
                rec.lost = "deleted from outside the broker"
                log.warning("pod %s was %s", name, rec.lost)
        else:
            rec.ready.observe(change.pod, self.clock.now())
            rec.ip = podstatus.pod_ip(change.pod) or rec.ip
            why = podstatus.ended(change.pod) if rec.up else ""
            if why and name not in self._deleting and not rec.lost:
                rec.lost = f"{why} (not by this broker)"
                log.warning("pod %s lost: %s", name, why)
        rec.changed.set()

    # -- create ---------------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        """The cards the broker's active pods got, as HAMi reported them (the job's memory limit needs
        each card's size); the cluster's scheduler binds devices, never the broker."""
        return list(self._devices.values())

    def _learn_devices(self, pod: Mapping[str, Any], standby: bool) -> None:
        if standby:
            return  # a standby's allocation is its 1 MiB share, not the card
        for index, (uuid, memory) in enumerate(hami.allocated_memory_mb(podstatus.meta(pod).get("annotations") or {})
                                               .items()):
            self._devices[uuid] = Device(key=uuid, index=index, model="gpu", memory_mb=memory)

    def template(self, pool: PoolSpec) -> PodTemplate:
        tpl = self._templates.get(pool.template_hash)
        if tpl is None:
            tpl = self._templates[pool.template_hash] = parse_template(pool.name, pool.template)
        return tpl

    async def create(self, request: PodRequest) -> PodInfo:
        name, pool = request.name, request.pool
        await self._ensure()
        tpl = self.template(pool)
        image = request.image or tpl.image
        pull_key = request.image or pool.template_hash  # a caller's broken image never blocks the pool's own
        blocked = self._pull_block.get(pull_key)
        if blocked is not None and blocked[0] > self.clock.now():
            raise LaunchError(f"pool {pool.name}: image {image} failed to pull ({blocked[2]}); "
                              f"not retried for {blocked[0] - self.clock.now():.0f} s",
                              details={"reason": blocked[2], "image": image})
        if name in self._pods or name in self.cache.pods:
            raise BackendError(f"pod {name} already exists")
        now = self.clock.now()
        group = volcano.batch_group(request.gang_batch, tpl.scheduler)
        gang_ann = volcano.pod_annotations(group, tpl.queue) if volcano.uses_volcano(tpl.scheduler) else {}
        manifest = pod_manifest(name, pool, tpl, broker=self.settings.broker_id, kernels=agent_kernels(pool),
                                annotations={**request.annotations, **hami.avoid_annotations(request.avoid),
                                             **gang_ann},
                                standby=bool(request.gpus),
                                pin_uuids=request.gpus, origin=str(request.origin), created_at=now,
                                image=request.image, gang=request.gang, gang_size=request.gang_size,
                                avoid_nodes=self.avoided_nodes(request.avoid), gang_topology=request.gang_topology)
        # The pool's node set (shape segregation), and the node placement chose (broker.fleet): the cluster's
        # scheduler binds the pod there.
        chosen = {**pool.node_selector, **({HOSTNAME: request.node} if request.node else {})}
        if chosen:
            manifest["spec"]["nodeSelector"] = {**manifest["spec"].get("nodeSelector", {}), **chosen}
        rec = PodRecord(name=name, pool=pool.name, secret=secrets.token_urlsafe(32), template=pool.template_hash,
                   created_at=now, ready=podstatus.ReadyRecord(now), gpus=request.gpus,
                   annotations=dict(manifest["metadata"]["annotations"]))
        self._pods[name] = rec
        secret_body = secret_manifest(name, rec.secret, manifest["metadata"]["labels"])
        secret_made = False
        try:
            if group:  # before the pod: Volcano binds none of the batch until minMember of them can start
                await self.podgroups.join(name, volcano.podgroup_manifest(
                    group, request.gang_batch[1], tpl.queue, manifest["metadata"]["labels"]))
            await self._bucket.take()
            rate = self.settings.rate
            # A retried create meets its own first try (adopted); a name taken by others stays theirs.
            await with_backoff(self.clock, rate, lambda: create_or_adopt(self.api, secret_body))
            secret_made = True
            created = await with_backoff(self.clock, rate, lambda: create_or_adopt(self.api, manifest))
            rec.uid = podstatus.uid(created)
            # The Secret names its pod's UID: after a restart, only that incarnation is trusted.
            await with_backoff(self.clock, rate, lambda: self.api.patch(
                "Secret", secret_name(name), {"metadata": {"annotations": {ANN_POD_UID: rec.uid}}}))
            pod = await self._wait_running(rec, image, pull_key, tpl.start_timeout_s)
            node = str((pod.get("spec") or {}).get("nodeName", ""))
            if node and not self._node_epoch(node) and not self._nodes_failed:
                await self.refresh_nodes()  # a node added since the last list: its boot epoch is recorded too
            await self._wait_agent(rec)
            self._learn_devices(pod, standby=bool(request.gpus))
            if not rec.gpus and pool.gpus:
                rec.gpus = hami.allocated_uuids(podstatus.meta(pod).get("annotations") or {}) or \
                    tuple(f"{name}/gpu{i}" for i in range(pool.gpus))  # no HAMi: the pod's own, never shared
            extra = {ANN_READY: rec.ready.dumps(), ANN_GPUS: ",".join(rec.gpus), ANN_NODE_EPOCH: self._node_epoch(node)}
            await with_backoff(self.clock, rate, lambda: self.api.patch("Pod", name, {"metadata": {"annotations": extra}}))
            rec.annotations.update(extra)
        except BaseException as exc:
            kinds: tuple[str, ...] = ("Pod", "Secret")
            if isinstance(exc, NotOurs) and rec.uid == "":  # the clean-up must not delete another's object
                self._pods.pop(name, None)
                kinds = ("Secret",) if secret_made else ()
            await asyncio.shield(self._destroy(name, kinds))
            if isinstance(exc, Retryable):
                raise BackendError(f"creating pod {name} failed: {exc}") from exc
            if isinstance(exc, BackendError) or not isinstance(exc, Exception):
                raise
            raise BackendError(f"creating pod {name} failed: {exc!r}") from exc
        self._pull_block.pop(pull_key, None)
        rec.up = True
        log.info("pod %s up: %s", name, rec.ready.view())
        return self._info(rec)

    # -- delete ---------------------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        await self._destroy(name)

    # -- list (restart recovery), annotate, agents ----------------------------------------------

    async def list_pods(self) -> list[PodInfo]:
        """Every running pod of this broker whose agent answers; adopts the pods of a previous broker
        (their Secret must name their UID) and deletes what cannot be trusted or reached."""
        await self._ensure()
        secret_objs, _ = await self.api.list("Secret", self.selector)
        by_name = {str(podstatus.meta(s).get("name")): s for s in secret_objs}
        live: list[PodInfo] = []
        doomed: list[str] = []
        for name, pod in list(self.cache.pods.items()):
            rec = self._pods.get(name)
            if rec is not None and not rec.up:
                continue  # still being created by this broker
            if rec is None:
                rec = adopt(pod, by_name.get(secret_name(name)))
                if rec is None:
                    doomed.append(name)
                    continue
                self._pods[name] = rec
                group = rec.annotations.get(volcano.GROUP_ANNOTATION)
                if group:
                    self.podgroups.adopt(name, group)
                self._learn_devices(pod, standby=(podstatus.meta(pod).get("labels") or {}).get(LABEL_ROLE) == "standby")
            if rec.lost or judge(Epoch(rec.uid), Epoch(podstatus.uid(pod))) is not Verdict.TRUSTED:
                log.warning("pod %s is not trusted (%s); deleting it", name, rec.lost or "UID changed")
                doomed.append(name)
                continue
            if await self._healthy(name):
                live.append(self._info(rec))
            else:
                log.warning("pod %s does not answer; deleting it", name)
                doomed.append(name)
        # Together: each delete lasts until its pod is gone (its grace), and a restart waits on them all.
        await asyncio.gather(*(self._destroy(name) for name in doomed))
        await sweep_cards(self.api, live)
        await self.podgroups.sweep(self.selector)
        for name in by_name.keys() - {secret_name(n) for n in self.cache.pods}:
            with contextlib.suppress(BackendError, Retryable):
                await self.api.delete("Secret", name)  # a Secret whose pod is gone
        return live

    async def _healthy(self, name: str) -> bool:
        for _ in range(2):
            try:
                await asyncio.wait_for(self.agent(name).health(), 3.0)
                return True
            except (AgentError, BackendError, TimeoutError):
                continue
        return False

    def fence(self, name: str, why: str) -> None:
        """Trust nothing on this pod any more (its node's boot epoch changed under it): agent calls fail, so the
        attempt on it ends lost; the pod is deleted when its job lets go of it."""
        rec = self._pods.get(name)
        if rec is not None and not rec.lost:
            rec.lost = why
            rec.changed.set()
            log.warning("pod %s fenced: %s", name, why)

    def _info(self, rec: PodRecord) -> PodInfo:
        pod = self.cache.pods.get(rec.name) or {}
        labels = podstatus.meta(pod).get("labels") or {}
        node = str((pod.get("spec") or {}).get("nodeName", ""))
        return PodInfo(name=rec.name, pool=rec.pool, gpus=rec.gpus, template=rec.template, created_at=rec.created_at,
                       isolated=True, annotations=dict(rec.annotations),
                       endpoint=f"tcp:{rec.ip}:{self.settings.agent_port}",
                       node=node,
                       details={"uid": rec.uid, "pod_uid": podstatus.uid(pod) if pod else rec.uid,
                                "incarnation": AGENT_INCARNATION if _started_with_incarnation(pod) else None,
                                "node": node, "node_epoch": self._node_epoch(node),
                                "started_node_epoch": rec.annotations.get(ANN_NODE_EPOCH, ""), "ip": rec.ip,
                                "role": labels.get(LABEL_ROLE, ""), "origin": rec.annotations.get(ANN_ORIGIN, ""),
                                "ready": rec.ready.view()})

    def set_create_rate(self, qps: float, burst: int) -> None:
        """Re-pace pod creates (the catalog's `create_rate` was reloaded); creates waiting now use it too."""
        self.settings = dataclasses.replace(self.settings, rate=dataclasses.replace(self.settings.rate, qps=qps,
                                                                                      burst=burst))
        self._bucket.retune(qps, burst)
        log.info("pod creates paced at %.3g/s, burst %d", qps, burst)

    def ready_record(self, name: str) -> dict[str, float | None] | None:
        """Seconds from create to scheduled, image pulled, container started, agent answered."""
        rec = self._pods.get(name)
        return rec.ready.view() if rec is not None else None

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        """Identity changes are on the pod when this returns; ageing ones within `annotate_defer_s`."""
        rec = self._pods.get(name)
        if rec is None or rec.lost:
            raise BackendError(f"pod {name} is gone")
        await self.annotator.annotate(name, rec.annotations, annotations)

    async def _patch_annotations(self, name: str, annotations: dict[str, str]) -> None:
        rec = self._pods.get(name)
        if rec is None or rec.lost or name in self._deleting:
            return
        body = {"metadata": {"annotations": annotations}}
        await with_backoff(self.clock, self.settings.rate, lambda: self.api.patch("Pod", name, body))
        rec.annotations.update(annotations)

    def agent(self, name: str) -> AgentClient:
        rec = self._pods.get(name)
        if rec is None or rec.lost or not rec.ip:
            raise BackendError(f"pod {name} is gone" + (f" ({rec.lost})" if rec is not None and rec.lost else ""))
        client = self._clients.get(name)
        if client is None:
            inner = self.agent_factory(f"tcp:{rec.ip}:{self.settings.agent_port}", rec.secret, name)
            record = rec

            def lost() -> str:
                return record.lost

            client = self._clients[name] = cast(AgentClient, PodAgent(inner, name, lost))
        return client

    def rendezvous(self, coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        """Rank 0's pod IP (every pod has its own network namespace) and a port that rotates, so a quick
        re-run never meets the previous attempt's socket in TIME_WAIT."""
        rec = self._pods.get(coordinator)
        if rec is None or rec.lost or not rec.ip:
            raise BackendError(f"pod {coordinator} is gone")
        self._port = DEFAULT_MASTER_PORT + (self._port + 1 - DEFAULT_MASTER_PORT) % 1000
        return Rendezvous(rec.ip, self._port, kernel_env=((POD_IP_ENV, rec.ip),))

    async def close(self) -> None:
        """Write pending owner records, stop watching and close agent connections; pods keep running for
        the next broker."""
        await self.annotator.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        await asyncio.to_thread(self.api.close)
