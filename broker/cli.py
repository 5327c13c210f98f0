"""The `firepool` command: run the broker, submit and follow jobs, look at pools and pods, run benchmarks."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.errors import FirepoolError
from broker.locations import DEFAULT_PORT, default_state_dir

BENCHMARKS = ("tracker", "warm-start", "reset", "late-binding", "gangs", "standby", "rollout", "mcp", "jupyter")
"""The benchmarks built so far (modules of `bench/`); dispatch, loops, frontier and recovery come later."""


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _client(args: argparse.Namespace) -> Any:
    from broker.client import Client

    return Client(url=args.url, token=args.token)


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.packages import PackageLimits
    from broker.server import ServeSettings, serve

    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per agent call drowns everything else
    settings = ServeSettings(
        state_dir=Path(args.state_dir) if args.state_dir else default_state_dir(), db_url=args.db,
        backend=args.backend, pools_file=Path(args.pools) if args.pools else None,
        tokens_file=Path(args.tokens) if args.tokens else None, host=args.host, port=args.port,
        virtual_gpus=args.virtual_gpus, sandbox=args.sandbox, keep_pods=args.keep_pods, capacity=args.capacity,
        packages=PackageLimits(max_compressed=args.package_max_bytes, max_extracted=args.package_max_extracted,
                               push_timeout_s=args.package_push_timeout), mcp=args.mcp)
    return serve(settings)


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--env expects NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _progress(job: Any, started: float, last: list[str]) -> None:
    """One line per state change, and a heartbeat on long waits, on stderr."""
    elapsed = time.monotonic() - started
    reason = job.raw.get("waiting_reason")
    line = f"{job.id}: {job.state}" + (f" ({reason})" if reason and job.state == "QUEUED" else "")
    if line != last[0] or (elapsed - float(last[1])) >= 10:
        print(f"[{elapsed:6.1f}s] {line}", file=sys.stderr, flush=True)
        last[0], last[1] = line, str(elapsed)


def cmd_submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SystemExit("nothing to run: firepool submit [options] -- CMD ...")
    requirements = Path(args.requirements).read_text() if args.requirements else None
    with _client(args) as fp:
        package = fp.package(args.package, args.exclude) if args.package else None
        job = fp.submit(command, pool=args.pool, lease_tag=args.tag, pods=args.pods, queue=args.queue,
                        env=_parse_env(args.env) or None, timeout_s=args.timeout, max_retries=args.retries,
                        single_use=args.single_use or None, priority=args.priority, package=package,
                        requirements=requirements)
        if not args.wait:
            print(json.dumps(job.raw, indent=2) if args.json else job.id)
            return 0
        started, last = time.monotonic(), ["", "0"]
        while job.state == "QUEUED":
            _progress(job, started, last)
            job = fp.get(job.id, wait_s=2.0)
            if job.state == "QUEUED":
                continue
        _progress(job, started, last)
        for chunk in fp.stream_logs(job.id, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        job = fp.wait(job.id)
        _progress(job, started, last)
        if args.json:
            print(json.dumps(job.raw, indent=2))
        else:
            latency = job.start_latency
            print(f"{job.id}: {job.state} exit={job.exit_code} path={job.path} "
                  f"submit->first={latency * 1000:.0f}ms" if latency is not None else
                  f"{job.id}: {job.state} exit={job.exit_code} error={job.error_class}", file=sys.stderr)
        if job.state == "SUCCEEDED":
            return 0
        return job.exit_code if isinstance(job.exit_code, int) and 0 < job.exit_code < 256 else 1


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        jobs = fp.jobs(state=args.state, limit=args.limit)
    if args.json:
        print(json.dumps([j.raw for j in jobs], indent=2))
        return 0
    rows = [(j.id, j.state, j.pool, j.raw.get("lease_tag", ""), j.path, j.exit_code, j.error_class,
             " ".join(j.raw.get("command", []))[:40]) for j in jobs]
    print(_table(rows, ("ID", "STATE", "POOL", "TAG", "PATH", "EXIT", "ERROR", "COMMAND")))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        for chunk in fp.stream_logs(args.job_id, stream=args.stream, follow=not args.no_follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        job = fp.cancel(args.job_id)
    print(f"{job.id}: {job.state}")
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        pools = fp.pools()
    if args.json:
        print(json.dumps(pools, indent=2))
        return 0
    keys = ("name", "gpus", "min_count", "max_idle_count", "max_count", "idle_timeout", "physical", "idle",
            "held", "starting", "busy", "standby", "stale", "borrowed", "queued_demand")
    print(_table([[p.get(k) for k in keys] for p in pools], [k.upper() for k in keys]))
    return 0


def cmd_pods(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        pods = fp.pods(args.pool)
    if args.json:
        print(json.dumps(pods, indent=2))
        return 0
    now = time.time()
    rows = [(p["name"], p["pool"], p["state"] + (" (held)" if p.get("held") else "")
             + (" (standby)" if p.get("standby") else ""), p.get("caller"),
             p.get("lease_tag"), ",".join(p.get("gpus", [])), p.get("job"),
             f"{max(0.0, p['hold_until'] - now):.0f}s" if p.get("held") and p.get("hold_until") else "",
             "yes" if p.get("isolated") else "NO (unisolated fallback)") for p in pods]
    print(_table(rows, ("POD", "POOL", "STATE", "CALLER", "TAG", "GPUS", "JOB", "HOLD", "ISOLATED")))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    rest = [a for a in args.rest if a != "--json"]
    json_out = args.json or len(rest) != len(args.rest)
    module = importlib.import_module("bench." + args.name.replace("-", "_"))
    return int(module.main(rest, json_out=json_out) or 0)


def cmd_mcp(args: argparse.Namespace) -> int:
    from mcp_server.main import main as mcp_main

    return mcp_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="firepool", description="A broker of warm, isolated GPU sandboxes.")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def client_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", help="broker URL (default: $FIREPOOL_URL, else the local broker)")
        p.add_argument("--token", help="bearer token (default: $FIREPOOL_TOKEN, else the local token)")

    p = sub.add_parser("serve", help="run the broker")
    p.add_argument("--db", help="job store URL (default: SQLite in the state dir); mysql+pymysql://, postgresql://")
    p.add_argument("--backend", default="local", choices=["local"])
    p.add_argument("--pools", help="pool catalog YAML")
    p.add_argument("--tokens", help="JSON object mapping bearer tokens to callers")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--virtual-gpus", type=int, default=None, help="pretend this many GPUs exist (no NVML)")
    p.add_argument("--state-dir", help="default: $XDG_DATA_HOME/firepool")
    p.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "none"],
                   help="local isolation: bubblewrap when it works (auto), required (bwrap), or none")
    p.add_argument("--keep-pods", action="store_true",
                   help="keep idle pods on a clean shutdown (busy pods always survive a restart)")
    p.add_argument("--capacity", help="borrowed-capacity source: a JSON file or an http(s) URL (model -> GPUs)")
    p.add_argument("--mcp", action="store_true", help="also serve the MCP server at /mcp/ (docs/mcp.md)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--package-max-bytes", type=int, default=512 << 20, help="compressed size limit of a package")
    p.add_argument("--package-max-extracted", type=int, default=2_000_000_000,
                   help="bytes a package may write when unpacked (zip-bomb guard)")
    p.add_argument("--package-push-timeout", type=float, default=300.0, help="seconds to push a package to a pod")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("submit", help="queue a job: firepool submit [opts] -- CMD ...")
    client_opts(p)
    p.add_argument("--pool", default="cpu")
    p.add_argument("--tag", default="", help="lease (session) tag")
    p.add_argument("--pods", type=int, default=1)
    p.add_argument("--queue", default="default")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--timeout", type=float, default=None, help="seconds")
    p.add_argument("--retries", type=int, default=None)
    p.add_argument("--priority", type=int, default=None)
    p.add_argument("--single-use", action="store_true")
    p.add_argument("--package", metavar="DIR", help="zip DIR, upload it once, and run the job in it")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave paths matching this .gitignore-style pattern out of --package")
    p.add_argument("--requirements", metavar="FILE", help="a requirements file to install on the pod first")
    p.add_argument("--wait", action="store_true", help="follow the job: progress, output, exit code")
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_submit)

    p = sub.add_parser("jobs", help="list your jobs")
    client_opts(p)
    p.add_argument("--state")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_jobs)

    p = sub.add_parser("logs", help="print a job's output (follows while it runs)")
    client_opts(p)
    p.add_argument("job_id")
    p.add_argument("--stream", default="combined", choices=["combined", "stdout", "stderr"])
    p.add_argument("--no-follow", action="store_true")
    p.set_defaults(fn=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a job")
    client_opts(p)
    p.add_argument("job_id")
    p.set_defaults(fn=cmd_cancel)

    p = sub.add_parser("pools", help="pool knobs and counts")
    client_opts(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_pools)

    p = sub.add_parser("pods", help="what each pod is doing")
    client_opts(p)
    p.add_argument("--pool")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_pods)

    from mcp_server.main import add_arguments as mcp_arguments

    p = sub.add_parser("mcp", help="MCP server (stdio, or streamable HTTP with --http): a warm sandbox per conversation")
    mcp_arguments(p)
    p.set_defaults(fn=cmd_mcp)

    p = sub.add_parser("bench", help="run a benchmark and print ours beside the paper's figures")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options")
    p.set_defaults(fn=cmd_bench)

    from jupyter_ext.kernelspec import add_parser as add_kernelspec_parser

    add_kernelspec_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except FirepoolError as exc:
        print(f"firepool: {exc.error_class}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
