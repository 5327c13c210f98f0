"""B16: the kubernetes backend's own overhead, through the in-process API emulator and fake kubelet.

Create→ready breakdown of new pods (scheduled, image pulled, container started, agent answered, as the
backend's ready records see them: the emulated kubelet's share) and the create call's total; paced
creates with injected 429s; then warm claims through `firepool serve --backend kubernetes`: the broker
share of a warm claim (submitted → handed off to the agent) and claims/s of concurrent callers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_least, at_most, percentile, report


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emu",
        "clusters": [{"name": "emu", "cluster": {"server": server}}],
        "users": [{"name": "emu", "user": {"token": "emulator"}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu", "namespace": "default"}}]}))
    return path


async def _creates(url: str, pods: int, paced: int) -> dict[str, Any]:
    import kubernetes

    from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
    from broker.backends.kubernetes.kubeapi import KubeApi
    from broker.backends.kubernetes.ratelimit import RateSettings
    from broker.clock import RealClock
    from broker.pools import parse_pool
    from broker.ports.backend import PodRequest

    def backend(rate: RateSettings) -> KubernetesBackend:
        api = KubeApi(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)), "default")
        return KubernetesBackend(RealClock(), api, KubernetesSettings(broker_id="bench", rate=rate))

    pool = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0"}})
    b = backend(RateSettings())
    walls, stages = [], []
    try:
        for i in range(pods):
            t0 = time.perf_counter()
            info = await b.create(PodRequest(name=f"cpu-seq-{i}", pool=pool))
            walls.append(time.perf_counter() - t0)
            stages.append(info.details["ready"])
        for i in range(pods):
            await b.delete(f"cpu-seq-{i}")
    finally:
        await b.close()
    qps = 10.0
    b = backend(RateSettings(qps=qps, burst=2, backoff_s=0.05))
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(b.create(PodRequest(name=f"cpu-par-{i}", pool=pool)) for i in range(paced)))
        paced_s = time.perf_counter() - t0
        await asyncio.gather(*(b.delete(f"cpu-par-{i}") for i in range(paced)))
    finally:
        await b.close()
    return {"walls": walls, "stages": stages, "paced_s": paced_s, "qps": qps}


def _api_writes(url: str | None) -> int:
    """The API server's resourceVersion: the emulator counts every write with it (0 without a cluster)."""
    if url is None:
        return 0
    import kubernetes

    core: Any = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)))
    try:
        return int(core.list_namespaced_pod("default", limit=1).metadata.resource_version)
    finally:
        core.api_client.close()


def _warm_claims(url: str | None, state: Path, jobs: int, callers: int) -> dict[str, Any]:
    """Warm jobs of `callers` concurrent callers on the kubernetes backend (`url`: the API) or the local one."""
    names = tuple(f"c{i}" for i in range(callers))
    extra: tuple[str, ...] = ()
    if url is not None:
        config = _kubeconfig(state / "kubeconfig.json", url)
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
            writes = _api_writes(url)
            t0 = time.perf_counter()
            results = list(pool.map(lambda c: run(c, jobs // callers), names))
            elapsed = time.perf_counter() - t0
            writes = _api_writes(url) - writes
    for job in (j for r in results for j in r):
        t = job["timings"]
        share.append(t["handed_off_at"] - t["submitted_at"])
        path = job["acquisition"][0]["path"]
        paths[path] = paths.get(path, 0) + 1
    done = sum(len(r) for r in results)
    return {"share": share, "paths": paths, "rate": done / elapsed, "jobs": done, "writes": writes / done,
            "elapsed": elapsed}


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench k8s", description=__doc__)
    parser.add_argument("--pods", type=int, default=10, help="new pods created one after another")
    parser.add_argument("--paced", type=int, default=12, help="pods created at once under qps 10, burst 2")
    parser.add_argument("--jobs", type=int, default=120, help="warm jobs over all callers")
    parser.add_argument("--callers", type=int, default=4)
    args = parser.parse_args(argv)
    from broker.backends.kubernetes.emulator import Emulator

    with tempfile.TemporaryDirectory(prefix="firepool-bench-k8s-") as tmp, Emulator(Path(tmp) / "k8s") as emu:
        emu.fail_next("create", "pods", 429, times=2, retry_after_s=0)
        made = asyncio.run(_creates(emu.url, args.pods, args.paced))
        warm = _warm_claims(emu.url, Path(tmp), args.jobs, args.callers)
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
        Row("B16", "  same claims on the local backend: broker share p50", percentile(local["share"], 50) * ms, "ms",
            "-"),
        Row("B16", "  kubernetes minus local, broker share p50", share50 - percentile(local["share"], 50) * ms, "ms",
            "-", "<= 5 ms", at_most(share50 - percentile(local["share"], 50) * ms, 5.0)),
        Row("B16", f"warm claims/s end to end, {args.callers} callers (agent and job included)", warm["rate"],
            "claims/s", "tracker 110-220k/s", ">= 20/s", at_least(warm["rate"], 20.0)),
        Row("B16", "  same on the local backend", local["rate"], "claims/s", "-"),
    ]
    return report("k8s", rows, json_out=json_out)
