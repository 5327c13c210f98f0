"""Late binding on the local backend over REST: code package delivery and incremental dependency installs.

Package: a few-MB package (source text plus incompressible data) uploaded once; `--jobs` warm jobs of
one session run with it and as many without it, interleaved. The agent times the unpack; the broker
times the push; committed -> first instruction is deliver + unpack + start, beside the same phase
without a package (the same run's baseline).

Dependencies: locally written wheels in a directory the pool binds at /wheels (no network), the uv
cache in a pool keep path. Each repeat is a new caller, so it gets a never-used pod: first install
(3 pins), the same pins again (marker hit), then one changed pin (incremental). The paper's pins
were real packages from an index; ours are tiny wheels, so our figures are a floor on installer cost.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, median, percentile, report
from bench.wheels import write_wheel

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def package_bytes(total_mb: float, seed: int = 7) -> bytes:
    """A deterministic zip of about `total_mb` MB: 3/4 source-like text files, 1/4 random data."""
    rng = random.Random(seed)
    words = [f"name_{i}" for i in range(500)]
    buf = io.BytesIO()
    text_bytes = int(total_mb * (1 << 20) * 0.75)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        i = 0
        while text_bytes > 0:
            body = "\n".join(f"def f{j}({rng.choice(words)}):\n    return {rng.choice(words)} + {j}"
                             for j in range(250))
            z.writestr(f"src/mod{i:04d}.py", body)
            text_bytes -= len(body)
            i += 1
        z.writestr("data/blob.bin", rng.randbytes(int(total_mb * (1 << 20) * 0.25)))
        z.writestr("main.py", "print('ok')\n")
    return buf.getvalue()


def run(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = c.post("/v1/jobs", json=body).json()
    if "id" not in job:
        raise RuntimeError(f"submit refused: {job}")
    while job["state"] not in TERMINAL:
        job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
    if job["state"] != "SUCCEEDED":
        raise RuntimeError(f"job {job['id']} {job['state']}: {job.get('error_class')} {job.get('error_message')}")
    return job


def bind_phase(job: dict[str, Any]) -> float:
    t = job["timings"]
    return float(t["first_instruction_at"] - t["committed_at"])


def bench_packages(jobs: int, size_mb: float) -> dict[str, Any]:
    data = package_bytes(size_mb)
    digest = hashlib.sha256(data).hexdigest()
    unpack, push, bound, plain = [], [], [], []
    with BenchBroker() as broker, broker.client() as c:
        r = c.put(f"/v1/packages/{digest}", content=data, headers={"Content-Type": "application/zip"})
        r.raise_for_status()
        base = {"pool": "cpu", "command": ["true"], "lease_tag": "late-binding"}
        run(c, base)  # the pod's creation
        for _ in range(jobs):
            job = run(c, {**base, "package": digest})
            timings = job["attempts"][-1]["timings"]
            unpack.append(timings["package_unpack_s"])
            push.append(timings["package_push_s"])
            bound.append(bind_phase(job))
            plain.append(bind_phase(run(c, base)))
    return {"size": len(data), "unpack": unpack, "push": push, "bound": bound, "plain": plain}


def bench_dependencies(repeats: int) -> dict[str, Any]:
    wheels = Path(tempfile.mkdtemp(prefix="fp-wheels-"))
    wheels.chmod(0o755)
    for name in ("alpha", "beta", "gamma"):
        for version in ("1.0", "2.0"):
            write_wheel(wheels, name, version, payload=20_000)
    pools = ("pools:\n  - name: cpu\n    max_count: 8\n    max_idle_count: 8\n    caller_hold_seconds: 600\n"
             "    keep_paths: [/cache/uv]\n"
             f"    template: {{binds: [{{src: {wheels}, dst: /wheels, ro: true}}]}}\n")
    callers = tuple(f"bench{i}" for i in range(repeats))
    first: list[float] = []
    same: list[float] = []
    changed: list[float] = []

    def pins(*p: str) -> str:
        return "\n".join(["--no-index", "--find-links /wheels", *p]) + "\n"

    with BenchBroker(callers=callers, pools=pools) as broker:
        for caller in callers:
            with broker.client(caller) as c:
                body = {"pool": "cpu", "command": ["python3", "-c", "import alpha, beta, gamma"],
                        "lease_tag": "deps", "env": {"UV_CACHE_DIR": "/cache/uv"}}
                three = pins("alpha==1.0", "beta==1.0", "gamma==1.0")
                for sink, text in ((first, three), (same, three),
                                   (changed, pins("alpha==1.0", "beta==2.0", "gamma==1.0"))):
                    timings = run(c, {**body, "requirements": text})["attempts"][-1]["timings"]
                    sink.append(timings["deps_install_s"])
    return {"first": first, "same": same, "changed": changed}


def main(argv: list[str], json_out: bool = False) -> int:
    if "--sim" in argv:  # B10: late binding vs per-environment pools, in the simulator
        from bench.late_binding_sim import main as sim_main

        return sim_main([a for a in argv if a != "--sim"], json_out=json_out)
    parser = argparse.ArgumentParser(prog="firepool bench late-binding", description=__doc__)
    parser.add_argument("--sim", action="store_true", help="B10 in the simulator instead (see bench/late_binding_sim.py)")
    parser.add_argument("--jobs", type=int, default=20, help="packaged jobs (and as many without)")
    parser.add_argument("--size-mb", type=float, default=4.0, help="package size before compression")
    parser.add_argument("--repeats", type=int, default=5, help="dependency sequences, one fresh pod each")
    args = parser.parse_args(argv)
    started = time.monotonic()
    pkg = bench_packages(args.jobs, args.size_mb)
    deps = bench_dependencies(args.repeats)
    s, ms = 1.0, 1000.0
    size = f"{pkg['size'] / (1 << 20):.1f} MB zip"
    unpack50 = median(pkg["unpack"]) * s
    bound50 = median(pkg["bound"]) * s
    overhead = (median(pkg["bound"]) - median(pkg["plain"])) * ms
    first50, same50, changed50 = (median(deps[k]) * s for k in ("first", "same", "changed"))
    rows = [
        Row("LB", f"package unpack p50 ({size}, {args.jobs} jobs)", unpack50, "s", "0.40-0.54 s (deliver+unpack+start)",
            "<= 0.54 s", at_most(unpack50, 0.54)),
        Row("LB", "package unpack p99", percentile(pkg["unpack"], 99) * s, "s", "<= 1.45 s (p99)", "<= 1.45 s",
            at_most(percentile(pkg["unpack"], 99), 1.45)),
        Row("LB", "package push incl. the agent's unpack p50", median(pkg["push"]) * s, "s", "-"),
        Row("LB", "deliver + unpack + start p50 (committed -> first instr.)", bound50, "s", "0.40-0.54 s",
            "<= 0.54 s", at_most(bound50, 0.54)),
        Row("LB", "  same phase without a package p50 (baseline)", median(pkg["plain"]) * s, "s", "-"),
        Row("LB", "  package overhead over the baseline p50", overhead, "ms", "-"),
        Row("LB", f"deps first install, 3 pins, p50 ({args.repeats} fresh pods)", first50, "s", "0.11 s",
            "<= 0.11 s", at_most(first50, 0.11)),
        Row("LB", "deps first install, 3 pins, first pod (cold uv cache)", deps["first"][0] * s, "s", "-"),
        Row("LB", "deps same pins again (marker hit) p50", same50, "s", "0 (marker hit)", "<= 0.01 s",
            at_most(same50, 0.01)),
        Row("LB", "deps one changed pin (incremental) p50", changed50, "s", "0.03-0.06 s", "<= 0.06 s",
            at_most(changed50, 0.06)),
    ]
    return report("late-binding", rows, json_out=json_out,
                  extra={"raw": {"packages": pkg, "dependencies": deps},
                         "wall_s": time.monotonic() - started,
                         "note": "B10 (late binding vs per-environment pools, simulator) is not part of this "
                                 "benchmark; these rows are the paper's App. C.5 / §9.2 binding costs."})
