"""The `firepool` subcommands (the parser and the error handling are in `broker.cli`).

A command checks what the user named (files, directories, pools) before it starts anything and raises
`UsageError` with the flag and the path, so the user reads which argument to fix.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.cli_output import console, one_line_command, print_table, printed_json
from broker.locations import state_dir_for

if TYPE_CHECKING:
    from broker.client import Client, JobInfo

BENCHMARKS = ("tracker", "warm-start", "reset", "late-binding", "gangs", "standby", "rollout", "mcp", "jupyter",
              "recovery", "k8s", "dashboard", "loops", "all", "frontier", "fragmentation", "dispatch", "throughput",
              "output-flood", "one-door", "sandbox-sdk", "e2b", "failover")
"""The benchmarks built so far (modules of `bench/`); `all` runs every other one in sequence."""

EXIT_TIMEOUT = 124
"""`submit --wait` of a job that ran past its timeout exits like timeout(1)."""


class UsageError(Exception):
    """A mistake in what the user asked for, found after parsing (a missing file, a bad value)."""


def read_file(flag: str, path: str) -> str:
    """The text of the file a flag names, or a UsageError naming the flag."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {path}: is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None


def client_of(args: argparse.Namespace) -> Client:
    """The SDK client the command line names (--url, --token, --state-dir, or their defaults)."""
    from broker.client import Client

    return Client(url=args.url, token=args.token, state_dir=args.state_dir)


def cmd_serve(args: argparse.Namespace) -> int:
    from broker import startup_checks
    from broker.api.jwt_auth import JwtSettings
    from broker.api.portlinks import PortSettings, parse_range
    from broker.gateway.kernels import GatewaySettings
    from broker.pools import load_catalog
    from broker.running.logretention import LogRetention
    from broker.running.packages import PackageLimits
    from broker.server import KubernetesTarget, ServeSettings, serve
    from broker.standby import foreign_leader
    from broker.ui.session import SessionSettings

    if args.pools:
        load_catalog(read_file("--pools", args.pools), source=args.pools)  # a CatalogError here is reported before anything starts
    try:  # each a one-line message naming the flag, before anything starts
        if args.tokens:
            read_file("--tokens", args.tokens)
            startup_checks.tokens_file(Path(args.tokens))
        if args.db:
            startup_checks.db_url(args.db)
        exposure = startup_checks.exposure(args.host, args.tls_cert, args.tls_key, args.insecure_http)
        low, high = parse_range(args.port_range)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.ui_session_max_age <= 0 or args.ui_session_idle <= 0:
        raise UsageError("--ui-session-max-age and --ui-session-idle are positive numbers of seconds")
    if args.jwks and not args.jwt_audience:
        raise UsageError("--jwks needs --jwt-audience (the audience every accepted JWT must carry)")
    state_dir = state_dir_for(args.state_dir)
    _check_port(args.host, args.port)
    if args.backend != "kubernetes" and (args.namespace or args.kubeconfig):
        raise UsageError("--namespace and --kubeconfig are for --backend kubernetes")
    if args.max_open_requests < 1:
        raise UsageError(f"--max-open-requests {args.max_open_requests}: at least 1")
    if args.max_request_bytes < 4096:
        raise UsageError(f"--max-request-bytes {args.max_request_bytes}: too small for any job request (at least 4096)")
    if min(args.log_max_age, args.log_max_bytes_per_caller, args.log_max_bytes) < 0 or not args.log_sweep_interval > 0:
        raise UsageError("--log-max-age, --log-max-bytes-per-caller and --log-max-bytes are 0 (no limit) or more; "
                         "--log-sweep-interval is above 0")
    if args.port_max_body_bytes < 0 or args.port_max_ws_message < 1024 or not 0 < args.port_link_ttl <= 86400:
        raise UsageError("--port-max-body-bytes is 0 or more, --port-max-ws-message at least 1024, "
                         "--port-link-ttl in (0, 86400] seconds")
    virtual_gpus, per_node = virtual_fleet(args.virtual_gpus, args.virtual_nodes, args.virtual_gpus_per_node)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per agent call drowns everything else
    settings = ServeSettings(
        state_dir=state_dir, db_url=args.db,
        backend=args.backend, pools_file=Path(args.pools) if args.pools else None,
        tokens_file=Path(args.tokens) if args.tokens else None, host=args.host, port=args.port,
        virtual_gpus=virtual_gpus, virtual_gpus_per_node=per_node, sandbox=args.sandbox, unisolated=args.unisolated, keep_pods=args.keep_pods, capacity=args.capacity,
        packages=PackageLimits(max_compressed=args.package_max_bytes, max_extracted=args.package_max_extracted,
                               push_timeout_s=args.package_push_timeout), mcp=args.mcp,
        jwt=JwtSettings(args.jwks, args.jwt_audience, args.jwt_issuer, args.jwt_claim) if args.jwks else None,
        metrics_caller_labels=args.metrics_caller_labels, max_request_bytes=args.max_request_bytes,
        max_open_requests=args.max_open_requests,
        kubernetes=KubernetesTarget(args.namespace, args.kubeconfig, args.broker_id),
        tls_cert=Path(args.tls_cert) if args.tls_cert else None, tls_key=Path(args.tls_key) if args.tls_key else None,
        forwarded_allow_ips=args.forwarded_allow_ips, insecure_http=exposure.insecure_http,
        ui_sessions=SessionSettings(max_age_s=args.ui_session_max_age, idle_s=args.ui_session_idle),
        log_retention=LogRetention(max_age_s=args.log_max_age or None,
                                   max_bytes_per_caller=args.log_max_bytes_per_caller or None,
                                   max_bytes_total=args.log_max_bytes or None,
                                   sweep_every_s=args.log_sweep_interval),
        ports=PortSettings(low=low, high=high, domain=args.port_domain or None, link_ttl_s=args.port_link_ttl,
                           max_link_ttl_s=max(3600.0, args.port_link_ttl), max_body_bytes=args.port_max_body_bytes,
                           max_ws_message=args.port_max_ws_message),
        gateway=GatewaySettings(max_kernels=args.gateway_max_kernels, cull_idle_s=args.gateway_cull_idle,
                                allowed_envs=tuple(n for n in args.gateway_allowed_envs.split(",") if n)),
        lease_s=args.lease_s, advertise_url=args.advertise_url)
    if not args.lease_s > 0:
        raise UsageError("--lease-s is a positive number of seconds")
    other = foreign_leader(settings.state_dir, settings.store)
    if other is not None:
        raise UsageError(other)
    return serve(settings)


def virtual_fleet(gpus: int | None, nodes: int | None, per_node: int | None) -> tuple[int | None, int | None]:
    """`--virtual-gpus N` (one node) or `--virtual-nodes N --virtual-gpus-per-node G`: (GPUs, GPUs per node)."""
    if nodes is None and per_node is None:
        return gpus, None
    if nodes is None or per_node is None or nodes < 1 or per_node < 1:
        raise UsageError("--virtual-nodes and --virtual-gpus-per-node go together, each at least 1")
    if gpus is not None and gpus != nodes * per_node:
        raise UsageError(f"--virtual-gpus {gpus} disagrees with {nodes} nodes x {per_node} GPUs")
    return nodes * per_node, per_node


def cmd_cache_dir(args: argparse.Namespace) -> int:
    """The host side of a shared cache: every pod of the pool binds it read-only; only the operator writes it."""
    from broker.backends.volumes import shared_dir

    if not args.path.startswith("/"):
        raise UsageError(f"{args.path}: a shared path is absolute, as in the pool's shared_paths")
    if not args.pool or "/" in args.pool or args.pool in (".", ".."):
        raise UsageError(f"{args.pool!r} is not a pool name")
    path = shared_dir(state_dir_for(args.state_dir), args.pool, args.path)
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    print(path)
    return 0


def cmd_token_add(args: argparse.Namespace) -> int:
    """Print a new token once; the tokens file keeps only its sha256 digest."""
    from broker.api.auth import add_token

    path = Path(args.tokens) if args.tokens else state_dir_for(args.state_dir) / "tokens.json"
    if path.is_dir():
        raise UsageError(f"--tokens {path}: is a directory, not a file")
    try:
        token = add_token(path, args.name, admin=args.admin, e2b=getattr(args, "e2b", False))
    except ValueError as exc:
        raise UsageError(f"--tokens {path}: {exc}") from None
    print(token)
    print(f"stored a hash of this token for caller {args.name!r}{' (admin)' if args.admin else ''} in {path}; "
          "it is shown only now. Serve with `firepool serve --tokens " f"{path}`; a running broker reads the "
          "file at start.", file=sys.stderr)
    return 0


def cmd_token_rm(args: argparse.Namespace) -> int:
    """Remove a caller's tokens; the broker drops them (and their dashboard sessions) at SIGHUP or restart."""
    from broker.api.auth import remove_tokens

    path = Path(args.tokens) if args.tokens else state_dir_for(args.state_dir) / "tokens.json"
    read_file("--tokens", str(path))
    try:
        removed = remove_tokens(path, args.name)
    except ValueError as exc:
        raise UsageError(f"--tokens {exc}") from None
    if not removed:
        raise UsageError(f"--tokens {path}: no token for caller {args.name!r}")
    print(f"removed {removed} token(s) of caller {args.name!r} from {path}; send the broker SIGHUP (or restart "
          "it) to drop them and end their dashboard sessions", file=sys.stderr)
    return 0


def _check_port(host: str, port: int) -> None:
    """Fail before starting anything when the port is taken (uvicorn would find out only after recovery)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UsageError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); another broker? "
                             "`--port 0` picks a free port") from None


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--env expects NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


class _Progress:
    """One line per state change, and a heartbeat on long waits, on stderr."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last = ""
        self.last_at = 0.0
        self.out = console(sys.stderr)

    def __call__(self, job: JobInfo) -> None:
        elapsed = time.monotonic() - self.started
        reason = job.raw.get("waiting_reason")
        line = f"{job.id}: {job.state}" + (f" ({reason})" if reason and job.state == "QUEUED" else "")
        if line != self.last or elapsed - self.last_at >= 10:
            self.out.print(f"[{elapsed:6.1f}s] {line}")
            self.last, self.last_at = line, elapsed


def _outcome(job: JobInfo) -> tuple[str, int]:
    """The closing line of `submit --wait` and the exit code."""
    if job.state == "SUCCEEDED":
        latency = job.start_latency
        first = f" submit->first={latency * 1000:.0f}ms" if latency is not None else ""
        return f"{job.id}: SUCCEEDED exit=0 path={job.path}{first}", 0
    if job.error_class == "Timeout":
        limit = job.raw.get("timeout_s")
        return f"{job.id}: Timeout: ran past its {limit} s limit and was stopped", EXIT_TIMEOUT
    if job.error_class == "Cancelled" or job.state == "CANCELLED":
        return f"{job.id}: Cancelled", 1
    code = job.exit_code if isinstance(job.exit_code, int) and 0 < job.exit_code < 256 else 1
    message = job.raw.get("error_message")
    return (f"{job.id}: {job.state} exit={job.exit_code} error={job.error_class}"
            + (f": {message}" if message else "")), code


def checked_requirements(args: argparse.Namespace) -> str | None:
    """`submit`'s --requirements text, checked with --package and --env before anything starts."""
    _parse_env(args.env)
    requirements = read_file("--requirements", args.requirements) if args.requirements else None
    if args.package and not Path(args.package).is_dir():
        raise UsageError(f"--package {args.package}: no such directory")
    return requirements


def submit_fields(args: argparse.Namespace, fp: Client, requirements: str | None) -> dict[str, Any]:
    """The job fields `submit`'s options ask for (with --from, every line's defaults); --package is uploaded."""
    package = fp.package(args.package, args.exclude) if args.package else None
    return dict(lease_tag=args.tag, pods=args.pods, queue=args.queue, env=_parse_env(args.env) or None,
                timeout_s=args.timeout, max_retries=args.retries, single_use=args.single_use or None,
                priority=args.priority, package=package, requirements=requirements,
                preemptible=args.preemptible or None, topology=args.topology)


def cmd_submit(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("nothing to run: firepool submit [options] -- CMD ... (or --from FILE)")
    requirements = checked_requirements(args)
    with client_of(args) as fp:
        job = fp.submit(command, pool=args.pool, **submit_fields(args, fp, requirements))
        if not args.wait:
            print(json.dumps(job.raw, indent=2) if args.json else job.id)
            return 0
        progress = _Progress()
        while job.state in ("PENDING", "QUEUED"):
            progress(job)
            job = fp.get(job.id, wait_s=2.0)
        progress(job)
        for chunk in fp.stream_logs(job.id, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        job = fp.wait(job.id)
        progress(job)
    line, code = _outcome(job)
    if args.json:
        print(json.dumps(job.raw, indent=2))
    else:
        print(line, file=sys.stderr)
    return code


def cmd_jobs(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        jobs = fp.jobs(state=args.state, limit=args.limit)
    if printed_json(args.json, [j.raw for j in jobs]):
        return 0
    rows = [(j.id, j.state, j.pool, j.raw.get("lease_tag", ""), j.path, j.exit_code, j.error_class,
             one_line_command(j.raw.get("command", []))) for j in jobs]
    print_table(rows, ("ID", "STATE", "POOL", "TAG", "PATH", "EXIT", "ERROR", "COMMAND"), right=("EXIT",))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        for chunk in fp.stream_logs(args.job_id, stream=args.stream, follow=not args.no_follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        before = fp.get(args.job_id)
        if before.terminal:
            print(f"firepool: {before.id} already finished ({before.state}): nothing to cancel", file=sys.stderr)
            return 1
        job = fp.cancel(args.job_id)
    print(f"{job.id}: {job.state}" + (" (cancelling: the job is being stopped)" if not job.terminal else ""))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    rest = [a for a in args.rest if a != "--json"]
    json_out = args.json or len(rest) != len(args.rest)
    module: Any = importlib.import_module("bench." + args.name.replace("-", "_"))
    return int(module.main(rest, json_out=json_out) or 0)


SIM_SCENARIOS = ("loops", "standby", "frontier", "late-binding", "sweep", "tenants", "calibrate")
"""`firepool sim` scenarios (bench/sim.py); the simulator stays out of the broker's imports."""


def cmd_sim(args: argparse.Namespace) -> int:
    import importlib

    module: Any = importlib.import_module("bench.sim")
    return int(module.main([args.scenario, *args.rest]) or 0)


def cmd_mcp(args: argparse.Namespace) -> int:
    from mcp_server.main import main as mcp_main

    return mcp_main(args)
