"""An in-process Kubernetes API emulator and fake kubelet: the real fake beside the kubernetes backend.

Start one, point the official client at it, and pods really run::

    with Emulator(tmp_path, gpus=2) as emu:            # an HTTP API on 127.0.0.1:<port>, node-0
        core = kubernetes.client.CoreV1Api(emu.client())   # the admin; emu.broker_client(): the broker

The API (`api.py`, aiohttp on its own thread and loop) serves core/v1 pods, secrets, nodes, events,
configmaps: create, get, list (labelSelector, fieldSelector, limit/continue), watch (resourceVersion,
allowWatchBookmarks, timeoutSeconds), replace (409 on a stale resourceVersion), patch (merge,
strategic-merge as merge, JSON patch), delete (gracePeriodSeconds, preconditions). Faults for tests:
`fail_next(verb, resource, status, times)` (429 with Retry-After, 500, 409, 410 ...; a 410 on
`watch` arrives as an ERROR event in the stream, as from a real server), `compact()` (watches from
older versions get 410 Gone), `drop_watches()` (open streams are cut mid-stream),
`expire_watches()` (open streams get an ERROR 410 mid-stream, after a compaction), `silence_watches()`,
`stall_next()` and `lose_next()` (connections held silent, answers lost: `faults.py`).

The kubelet (`kubelet.py`) binds each new pod to a node `scheduling.py` chooses (nodeSelector, required
node affinity, taints
and tolerations, CPU and memory requests, pod affinity, GPUs), then:

- writes `spec.nodeName`, condition PodScheduled, and for a pod requesting `nvidia.com/gpu` HAMi's
  `hami.io/vgpu-devices-allocated` (`UUID,NVIDIA,mem,cores:;`) and `hami.io/vgpu-node`, honouring
  `nvidia.com/use-gpuuuid` (pinned) and `nvidia.com/nouse-gpuuuid` (avoided cards); nodes carry
  `hami.io/node-nvidia-register`;
- after `start_delay_s` pulls the image, taking `pull_s` the first time on a node (IfNotPresent;
  `prepull()` marks an image present, as a pre-pull DaemonSet does; imagePullPolicy Always always
  pulls), then shows the container waiting in ContainerCreating with its imageID set; an image
  containing `:does-not-exist` goes ErrImagePull, then ImagePullBackOff, and never starts;
- reads the agent's secret from the pod's first Secret volume (the key its `items` name, else `token`
  or `secret`, else the only key; a missing one: waiting CreateContainerConfigError until it appears);
- starts a real pod agent as the local backend does (bubblewrap sandbox, PID 1 `python -m
  firepool_agent`, the agent's `--kernels` taken from the container's command if given) listening on
  `tcp:<podIP>:<port>`, where podIP is a loopback address of its own (127.1.x.y) and the port the
  container's port named `agent` (default 8471). A backend reaches the agent exactly as in a cluster:
  `HttpAgentClient(f"tcp:{status.podIP}:{port}", token)`;
- sets phase Running, podIP(s), hostIP, startTime, containerStatuses running, conditions
  Initialized, PodReadyToStartContainers, then ContainersReady and Ready once /v1/health answers;
  condition times and Events (Scheduled, Pulling, Pulled, Started, Failed, BackOff) carry
  microsecond timestamps, from which ready records are read;
- with `KubeletConfig(agents=False)` skips the agent: pods go Running and Ready with a podIP at once;
- on delete (graceful: deletionTimestamp and deletionGracePeriodSeconds first) sends the agent SIGTERM,
  then SIGKILL at the end of the grace, waits until none of its processes is left, then removes the pod,
  which keeps its node's resources until then; an agent that dies fails its pod (restartPolicy Never).

Requests are authenticated by a token table and authorized by RBAC (`rbac.py`): `ADMIN_TOKEN` may do
anything, `BROKER_TOKEN` is the broker's service account with the rules of the shipped deploy/; every
request of the broker is audited, and leaving the `with` block raises if it was refused anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from k8s_emulator.api import Api
from k8s_emulator.faults import Faults
from k8s_emulator.kubelet import Kubelet, KubeletConfig
from k8s_emulator.nodes import gpu_uuid, make_node
from k8s_emulator.objects import Obj, Store
from k8s_emulator.rbac import (
    ADMIN_TOKEN,
    BROKER_TOKEN,
    Audit,
    Authorizer,
    Grants,
    Identity,
    service_account,
    shipped_grants,
)

__all__ = ["ADMIN_TOKEN", "BROKER_TOKEN", "Emulator", "KubeletConfig", "Store", "gpu_uuid", "make_node"]

START_TIMEOUT_S = 30.0


class Emulator:
    """The API server and kubelet on a thread of their own (the official client is synchronous)."""

    def __init__(self, state_dir: Path | None = None, *, gpus: int = 0, nodes: int = 1,
                 kubelet: KubeletConfig | bool = True, bookmark_interval_s: float = 1.0, port: int = 0,
                 rbac: Grants | bool = True, namespace: str = "default", denials_fail: bool = True) -> None:
        """`nodes` fake nodes node-0.. with `gpus` cards each; `kubelet=False` serves the API alone.

        `rbac`: the broker's token (`BROKER_TOKEN`) is the service account `firepool-broker` of `namespace`
        with the grants of the shipped deploy/ (True), of the given `Grants`, or every grant (False: no
        authentication either). `ADMIN_TOKEN` may do anything. With `denials_fail`, leaving the `with`
        block raises if the broker was refused anything (a verb missing from its Role)."""
        self._tmp = None if state_dir is not None else tempfile.TemporaryDirectory(prefix="firepool-k8semu-")
        self.state_dir = Path(state_dir if state_dir is not None else self._tmp.name)  # type: ignore[union-attr]
        self.store = Store()
        self.faults = Faults()
        self.namespace = namespace
        self.authorizer: Authorizer | None = None
        if rbac is not False:
            grants = shipped_grants() if rbac is True else rbac
            self.authorizer = Authorizer({
                ADMIN_TOKEN: Identity("kubernetes-admin", None),
                BROKER_TOKEN: Identity(service_account(namespace), grants, namespace)})
        self.denials_fail = denials_fail
        self.api = Api(self.store, self.faults, self.authorizer, bookmark_interval_s=bookmark_interval_s)
        self.kubelet_config = kubelet if isinstance(kubelet, KubeletConfig) else KubeletConfig()
        self.kubelet: Kubelet | None = Kubelet(self.store, self.state_dir, self.kubelet_config) if kubelet else None
        self.store.create("namespaces", "", {"metadata": {"name": "default"}, "spec": {"finalizers": ["kubernetes"]},
                                             "status": {"phase": "Active"}})
        for i in range(nodes):
            self.add_node(f"node-{i}", gpus=gpus)
        self.port = port
        """The API's TCP port on 127.0.0.1 (0 until started: a free one is chosen)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        """The API's base URL, for `kubernetes.client.Configuration(host=...)`."""
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Emulator:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="k8s-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S) or self._failure is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._failure!r}")
        return self

    def stop(self) -> None:
        """Kill every agent and stop serving; pods' objects are dropped with the emulator."""
        if self._loop is not None and self._stopping is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(START_TIMEOUT_S)
        self._thread = None
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        denied = self.audit.denied if self.audit is not None else {}
        if kind is None and self.denials_fail and denied:
            raise AssertionError(f"the API refused the broker (RBAC, deploy/): {dict(denied)}")

    @property
    def audit(self) -> Audit | None:
        """Every request of the broker's identity: (verb, group, resource) counts, and those refused."""
        return self.authorizer.audit if self.authorizer is not None else None

    @property
    def broker_user(self) -> str:
        return service_account(self.namespace)

    def configuration(self, token: str = ADMIN_TOKEN) -> Any:
        """A `kubernetes.client.Configuration` for this emulator as `token` (the admin's by default)."""
        import kubernetes

        config = kubernetes.client.Configuration(host=self.url)
        config.api_key = {"authorization": token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return config

    def client(self, token: str = ADMIN_TOKEN) -> Any:
        """A `kubernetes.client.ApiClient` as `token`: the test's admin by default, `BROKER_TOKEN` for a backend."""
        import kubernetes

        return kubernetes.client.ApiClient(self.configuration(token))

    def _serve(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as exc:  # surfaced by start(); a thread has nowhere else to raise
            self._failure = exc
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        runner = web.AppRunner(self.api.app(), handle_signals=False, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", self.port)
            await site.start()
            self.port = int(runner.addresses[0][1])
            if self.kubelet is not None:
                await self.kubelet.start()
            ready.set()
            await self._stopping.wait()
        finally:
            if self.kubelet is not None:
                await self.kubelet.stop()
            self.api.drop_watches()
            await runner.cleanup()

    # -- faults and cluster shape (callable from any thread) ------------------------------------

    def fail_next(self, verb: str, resource: str, status: int, times: int = 1, retry_after_s: int = 1) -> None:
        """Answer the next `times` requests of `verb` on `resource` ("*": any) with `status`."""
        self.faults.fail_next(verb, resource, status, times, retry_after_s)

    def compact(self) -> int:
        """Forget the event history: a watch from an older resourceVersion gets 410 Gone."""
        return self.store.compact()

    def drop_watches(self) -> int:
        """Cut every open watch stream mid-stream; returns how many were open."""
        return self.api.drop_watches()

    def expire_watches(self) -> int:
        """Compact, then end every open watch with an ERROR 410 Gone event; returns how many were open."""
        return self.api.expire_watches()

    def silence_watches(self) -> int:
        """Open watch streams go silent, their connections left open; returns how many were open."""
        return self.api.silence_watches()

    def lose_next(self, verb: str, resource: str, times: int = 1) -> None:
        """Carry out the next `times` requests of `verb` on `resource`, then cut the connection unanswered."""
        self.faults.lose_next(verb, resource, times)

    def stall_next(self, verb: str, resource: str, seconds: float = 3600.0, times: int = 1) -> None:
        """Hold the next `times` requests of `verb` on `resource` open, answering nothing for `seconds`."""
        self.faults.stall_next(verb, resource, seconds, times)

    def add_node(self, name: str, *, gpus: int = 0, labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None, allocatable: Mapping[str, str] | None = None,
                 taints: Sequence[Mapping[str, str]] = ()) -> Obj:
        """A Ready node with `gpus` HAMi-registered fake cards (see `nodes.make_node`)."""
        return self.store.create("nodes", "", make_node(name, gpus=gpus, labels=labels, annotations=annotations,
                                                        allocatable=allocatable, taints=taints))

    def reboot_node(self, name: str) -> str:
        """The node comes back under its name with a new `status.nodeInfo.bootID` (rebooted, or replaced by
        another machine); its pods stay bound with their UIDs, as a kubelet restarts them after a reboot.
        Returns the new boot id."""
        boot = str(uuid.uuid4())

        def rebooted(node: Obj) -> Obj:
            node["status"]["nodeInfo"]["bootID"] = boot
            return node

        self.store.update("nodes", "", name, rebooted)
        return boot

    def broker_client(self) -> Any:
        """A `kubernetes.client.ApiClient` as the broker's service account (the shipped Role applies)."""
        return self.client(BROKER_TOKEN)

    def kubeconfig(self, namespace: str | None = None, token: str = BROKER_TOKEN) -> dict[str, Any]:
        """A kubeconfig that points `firepool serve --kubeconfig` (or kubectl, with `ADMIN_TOKEN`) at this
        emulator, as the broker's service account by default."""
        namespace = namespace or self.namespace
        return {"apiVersion": "v1", "kind": "Config", "current-context": "emulator",
                "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                "users": [{"name": "emulator", "user": {"token": token}}],
                "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator",
                                                              "namespace": namespace}}]}

    def pod(self, name: str, namespace: str = "default") -> Obj:
        """A pod as stored now (tests read it without a client)."""
        return self.store.get("pods", namespace, name)

    def hurry_deletes(self) -> None:
        """From now on a graceful delete kills its pod at once, those under way too (a test's teardown: the
        brokers delete their idle pods on the way out, and no test of that teardown is about the grace)."""
        if self.kubelet is not None:
            self.kubelet.hurried = True

    def prepull(self, image: str, node: str | None = None) -> None:
        """Mark `image` present on `node` (every node when None): its next pods skip the pull."""
        if self.kubelet is None:
            return
        for name in [node] if node else [n["metadata"]["name"] for n in self.store.list("nodes", "")[0]]:
            self.kubelet.prepull(image, name)

    def evict(self, name: str, namespace: str = "default",
              message: str = "The node was low on resource: memory.") -> bool:
        """Evict a pod as a kubelet under node pressure does: its agent killed, phase Failed with reason
        Evicted, the object left for its owner to delete. False when no agent of that pod runs."""
        if self.kubelet is None or self._loop is None:
            return False
        done = asyncio.run_coroutine_threadsafe(self.kubelet.evict(namespace, name, message), self._loop)
        return done.result(START_TIMEOUT_S)

    def crash(self, name: str, namespace: str = "default") -> bool:
        """SIGKILL a pod's agent from outside (an OOM kill, a node fault): the kubelet fails the pod
        (phase Failed, container terminated). False when no agent of that pod runs."""
        pids = self.agent_pids(name, namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return bool(pids)

    def agent_pids(self, name: str, namespace: str = "default") -> list[int]:
        """The host pids of a pod's running agent (launcher and sandbox PID 1); empty when none runs."""
        if self.kubelet is None:
            return []
        try:
            uid = self.pod(name, namespace)["metadata"]["uid"]
        except Exception:
            return []
        agent = self.kubelet.running.get(uid)
        record: dict[str, Any] = agent.record if agent is not None else {}
        return sorted({int(record[k]) for k in ("pid", "launcher_pid") if record.get(k)})
