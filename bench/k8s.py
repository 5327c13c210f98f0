"""B16: the kubernetes backend's own overhead, through the in-process API emulator and fake kubelet.

Create→ready breakdown of new pods (scheduled, image pulled, container started, agent answered, as the
backend's ready records see them: the emulated kubelet's share) and the create call's total; paced
creates with injected 429s; then warm claims through `firepool serve --backend kubernetes`: the broker
share of a warm claim (submitted → handed off to the agent) and claims/s of concurrent callers. API calls
(every request of the broker's service account, as the emulator's audit counts them) per warm claim and per
pod lifecycle (create → agent answered → delete → object gone): the load a broker puts on a real API server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_least, at_most, percentile, report


def _kubeconfig(path: Path, emu: Any) -> Path:
    """The broker's kubeconfig: its service-account token, so the shipped Role applies."""
    path.write_text(json.dumps(emu.kubeconfig("default")))
    return path


async def _creates(emu: Any, pods: int, paced: int) -> dict[str, Any]:
    from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
    from broker.backends.kubernetes.kubeapi import KubeApi
    from broker.backends.kubernetes.ratelimit import RateSettings
    from broker.clock import RealClock
    from broker.pools import parse_pool
    from broker.ports.backend import PodRequest

    def backend(rate: RateSettings) -> KubernetesBackend:
        api = KubeApi(emu.broker_client(), "default")
        return KubernetesBackend(RealClock(), api, KubernetesSettings(broker_id="bench", rate=rate))

    pool = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0"}})
    b = backend(RateSettings())
    walls, stages, calls = [], [], [0, 0, 0]
    try:
        for i in range(pods):
            t0 = time.perf_counter()
            info = await b.create(PodRequest(name=f"cpu-seq-{i}", pool=pool))
            walls.append(time.perf_counter() - t0)
            stages.append(info.details["ready"])
            if i == 0:  # the first create also starts the watch and lists nodes: counted apart
                calls[0] = _calls(emu)
        calls[1] = _calls(emu)
        await asyncio.gather(*(b.delete(f"cpu-seq-{i}") for i in range(pods)))  # each ends when its pod is gone
        calls[2] = _calls(emu)
    finally:
        await b.close()
    lifecycle = (calls[1] - calls[0]) / max(1, pods - 1) + (calls[2] - calls[1]) / pods
    qps = 10.0
    b = backend(RateSettings(qps=qps, burst=2, backoff_s=0.05))
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(b.create(PodRequest(name=f"cpu-par-{i}", pool=pool)) for i in range(paced)))
        paced_s = time.perf_counter() - t0
        await asyncio.gather(*(b.delete(f"cpu-par-{i}") for i in range(paced)))
    finally:
        await b.close()
    return {"walls": walls, "stages": stages, "paced_s": paced_s, "qps": qps, "lifecycle_calls": lifecycle}


def _calls(emu: Any) -> int:
    """API requests the broker's identity made so far (the emulator's audit; 0 without a cluster)."""
    return int(emu.audit.calls(emu.broker_user)) if emu is not None else 0


def _api_writes(emu: Any) -> int:
    """The API server's resourceVersion: the emulator counts every write with it (0 without a cluster)."""
    if emu is None:
        return 0
    import kubernetes

    core: Any = kubernetes.client.CoreV1Api(emu.client())
    try:
        return int(core.list_namespaced_pod("default", limit=1).metadata.resource_version)
    finally:
        core.api_client.close()


def _warm_claims(emu: Any, state: Path, jobs: int, callers: int) -> dict[str, Any]:
    """Warm jobs of `callers` concurrent callers on the kubernetes backend (`emu`: the API) or the local one."""
    names = tuple(f"c{i}" for i in range(callers))
    extra: tuple[str, ...] = ()
    if emu is not None:
        config = _kubeconfig(state / "kubeconfig.json", emu)
        extra = ("--backend", "kubernetes", "--kubeconfig", str(config), "--broker-id", "bench-broker")
    pools = f"pools:\n  - {{name: cpu, max_count: {callers + 1}, max_idle_count: {callers + 1}}}\n"
    share: list[float] = []
    paths: dict[str, int] = {}
    with BenchBroker(callers=names, pools=pools, extra=extra) as broker:
        def run(caller: str, count: int) -> list[dict[str, Any]]:
            out = []
            with broker.client(caller) as c:
                for _ in range(count + 1):
                    job = c.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "lease_tag": "k8s"}).json()
                    while job["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                        job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}).json()
                    out.append(job)
            return out[1:]  # the first job of each caller creates its pod

        with ThreadPoolExecutor(callers) as pool:
            list(pool.map(lambda c: run(c, 2), names))  # every caller's pod exists and is warm
            time.sleep(1.5)  # owner records of the warm-up written (broker.backends.kubernetes.annotating)
            writes, calls = _api_writes(emu), _calls(emu)
            t0 = time.perf_counter()
            results = list(pool.map(lambda c: run(c, jobs // callers), names))
            elapsed = time.perf_counter() - t0
            writes, calls = _api_writes(emu) - writes, _calls(emu) - calls
    for job in (j for r in results for j in r):
        t = job["timings"]
        share.append(t["handed_off_at"] - t["submitted_at"])
        path = job["acquisition"][0]["path"]
        paths[path] = paths.get(path, 0) + 1
    done = sum(len(r) for r in results)
    return {"share": share, "paths": paths, "rate": done / elapsed, "jobs": done, "writes": writes / done, "calls": calls / done,
            "elapsed": elapsed}


def _emulator() -> Any:
    """The API emulator is test support, never installed with the broker: a checkout has it beside bench/."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)
    try:
        from k8s_emulator import Emulator
    except ImportError as exc:
        raise SystemExit("firepool bench k8s needs a source checkout (it drives k8s_emulator/ beside bench/)") from exc
    return Emulator


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench k8s", description=__doc__)
    parser.add_argument("--pods", type=int, default=10, help="new pods created one after another")
    parser.add_argument("--paced", type=int, default=12, help="pods created at once under qps 10, burst 2")
    parser.add_argument("--jobs", type=int, default=120, help="warm jobs over all callers")
    parser.add_argument("--callers", type=int, default=4)
    args = parser.parse_args(argv)
    Emulator = _emulator()

    with tempfile.TemporaryDirectory(prefix="firepool-bench-k8s-") as tmp, Emulator(Path(tmp) / "k8s") as emu:
        emu.fail_next("create", "pods", 429, times=2, retry_after_s=0)
        made = asyncio.run(_creates(emu, args.pods, args.paced))
        warm = _warm_claims(emu, Path(tmp), args.jobs, args.callers)
    local = _warm_claims(None, Path(tempfile.gettempdir()), args.jobs, args.callers)  # the same on this machine
    ms = 1000.0

    def stage(name: str) -> float:
        return percentile([s[name] for s in made["stages"] if s.get(name) is not None], 50) * ms

    create_p50 = percentile(made["walls"], 50) * ms
    own = percentile([w - s["agent_answered"] for w, s in zip(made["walls"], made["stages"], strict=True)], 50) * ms
    share50, share90 = percentile(warm["share"], 50) * ms, percentile(warm["share"], 90) * ms
    paced_rate = args.paced / made["paced_s"]
    rows = [
        Row("B16", f"new pod: create call -> agent answered p50 ({args.pods} pods)", create_p50, "ms", "20-35 s real"),
        Row("B16", "  stage: scheduled (emulated scheduler) p50", stage("scheduled"), "ms", "-"),
        Row("B16", "  stage: image pulled (emulated kubelet) p50", stage("image_pulled"), "ms", "-"),
        Row("B16", "  stage: container started p50", stage("container_started"), "ms", "-"),
        Row("B16", "  stage: agent answered p50", stage("agent_answered"), "ms", "-"),
        Row("B16", "  broker's own part after the agent answered p50", own, "ms", "-"),
        Row("B16", f"paced creates: {args.paced} at once, qps {made['qps']:.0f}, 2 injected 429s", paced_rate,
            "creates/s", "-", f"<= {made['qps']:.0f} + burst", at_most(paced_rate, made["qps"] + 2.0)),
        Row("B16", f"warm claim broker share (submitted->handed off) p50 ({warm['jobs']} jobs, {warm['paths']})",
            share50, "ms", "hand-off 390 ms", "<= 5 ms", at_most(share50, 5.0)),
        Row("B16", "warm claim broker share p90", share90, "ms", "-"),
        Row("B16", f"  API writes per warm claim ({warm['elapsed']:.1f} s of claims)", warm["writes"], "writes",
            "-"),
        Row("B16", "  API calls per warm claim (the broker's requests, any verb)", warm["calls"], "calls", "-"),
        Row("B16", "API calls per pod lifecycle (create -> agent answered -> delete -> object gone)",
            made["lifecycle_calls"], "calls", "-"),
        Row("B16", "  same claims on the local backend: broker share p50", percentile(local["share"], 50) * ms, "ms",
            "-"),
        Row("B16", "  kubernetes minus local, broker share p50", share50 - percentile(local["share"], 50) * ms, "ms",
            "-", "<= 5 ms", at_most(share50 - percentile(local["share"], 50) * ms, 5.0)),
        Row("B16", f"warm claims/s end to end, {args.callers} callers (agent and job included)", warm["rate"],
            "claims/s", "tracker 110-220k/s", ">= 20/s", at_least(warm["rate"], 20.0)),
        Row("B16", "  same on the local backend", local["rate"], "claims/s", "-"),
    ]
    return report("k8s", rows, json_out=json_out)
