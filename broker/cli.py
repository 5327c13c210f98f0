"""The `firepool` command: run the broker, submit and follow jobs, look at pools and pods, run benchmarks.

Every mistake a user can make here ends as one line on stderr and a non-zero exit, never a traceback:
`main` turns the broker's typed errors, unreadable files, catalog errors and broken pipes into messages.
The commands themselves are in `broker.cli_commands`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

from broker import cli_commands as cmds
from broker import cli_fleet as fleet
from broker.cli_e2b import add_e2b_parser
from broker.cli_ports import add_port_parser
from broker.cli_sessions import add_session_parsers
from broker.errors import FirepoolError
from broker.fencing import DEFAULT_LEASE_S
from broker.locations import DEFAULT_PORT
from broker.pools import CatalogError

BENCHMARKS = cmds.BENCHMARKS
SIM_SCENARIOS = cmds.SIM_SCENARIOS


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, unless the default is nothing (None, False, [])
    or the help already says what it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default in (None, False, "", argparse.SUPPRESS) or default == [] or "default" in text
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def package_version() -> str:
    try:
        return version("firepool")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _subparser(sub: Any, name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, formatter_class=HelpFormatter,
                                                **kw)
    p.set_defaults(parser=p)
    return p


def _client_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="broker URL, or a comma-separated list of the brokers of one store "
                                   "(default: $FIREPOOL_URL, else broker.json in the state dir)")
    p.add_argument("--token", help="bearer token (default: $FIREPOOL_TOKEN, else the state dir's token)")
    p.add_argument("--state-dir", help="find the local broker here (default: $FIREPOOL_STATE_DIR, else "
                                       "$XDG_DATA_HOME/firepool)")


def _serve_parser(sub: Any) -> None:
    p = _subparser(sub, "serve", "run the broker")
    p.add_argument("--db", help="job store URL (default: SQLite in the state dir); mysql+pymysql://, postgresql://")
    p.add_argument("--backend", default="local", choices=["local", "kubernetes"], help="where pods run")
    p.add_argument("--namespace", help="kubernetes backend: the namespace of the pods (default: the broker's own "
                                       "in a cluster, else `default`)")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubernetes backend: a kubeconfig (default: in-cluster "
                                                        "config, else ~/.kube/config)")
    p.add_argument("--broker-id", default="firepool", help="kubernetes backend: the firepool.io/broker label of "
                                                           "this broker's pods")
    p.add_argument("--pools", metavar="FILE", help="pool catalog YAML (default: the embedded catalog: `cpu`, "
                                                   "and `gpu` when the machine has GPUs)")
    p.add_argument("--tokens", metavar="FILE", help="JSON object mapping bearer tokens (or their sha256: digests, "
                                                    "`firepool token add`) to callers (default: one token for the "
                                                    "local user, in the state dir); docs/security.md")
    p.add_argument("--jwks", metavar="FILE|URL", help="also accept JWTs (OIDC, Kubernetes service-account tokens) "
                                                      "signed by a key of this JWKS")
    p.add_argument("--jwt-audience", help="the audience a JWT must carry (required with --jwks)")
    p.add_argument("--jwt-issuer", help="the issuer a JWT must carry (default: not checked)")
    p.add_argument("--jwt-claim", default="sub", help="the JWT claim that names the caller")
    p.add_argument("--metrics-caller-labels", action="store_true",
                   help="publish per-caller series (holds by owner) on /metrics (off: no caller names there)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; beyond loopback it needs --tls-cert "
                                                       "and --tls-key, or --insecure-http")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (0: any free port)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM; with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    p.add_argument("--forwarded-allow-ips", metavar="IPS",
                   help="behind a reverse proxy: trust its X-Forwarded-Proto/-For from these comma-separated "
                        "addresses (uvicorn's option; docs/security.md)")
    p.add_argument("--insecure-http", action="store_true",
                   help="allow plain HTTP on a non-loopback --host (tokens and cookies in clear); logged, and "
                        "/healthz says transport http-insecure")
    p.add_argument("--ui-session-max-age", type=float, default=12 * 3600.0, metavar="SECONDS",
                   help="a dashboard session ends this long after sign-in, however busy")
    p.add_argument("--ui-session-idle", type=float, default=3600.0, metavar="SECONDS",
                   help="a dashboard session unused this long ends")
    p.add_argument("--virtual-gpus", type=int, default=None, help="pretend this many GPUs exist (no NVML)")
    p.add_argument("--virtual-nodes", type=int, default=None,
                   help="split virtual GPUs into this many nodes (with --virtual-gpus-per-node; docs/fleet.md)")
    p.add_argument("--virtual-gpus-per-node", type=int, default=None, help="virtual GPUs on each virtual node")
    p.add_argument("--state-dir", help="default: $FIREPOOL_STATE_DIR, else $XDG_DATA_HOME/firepool")
    p.add_argument("--sandbox", default="auto", choices=["auto", "bwrap"],
                   help="local isolation: bubblewrap (both choices require it; without it the broker refuses to start)")
    p.add_argument("--unisolated", action="store_true",
                   help="run local pods WITHOUT a sandbox (plain processes sharing this host); only for a trusted "
                        "single user on a machine without bubblewrap; /healthz then says isolation: none")
    p.add_argument("--lease-s", type=float, default=DEFAULT_LEASE_S,
                   help="leadership lease (docs/ha.md): brokers on one store elect one leader; a leader silent this "
                        "long is replaced by a standby, and it deposes itself after half of it")
    p.add_argument("--advertise-url", help="the URL standbys name when they send clients to this broker "
                   "(default: scheme://host:port as served; set it behind a proxy or in a cluster)")
    p.add_argument("--keep-pods", action="store_true",
                   help="keep idle pods on a clean shutdown (busy pods always survive a restart)")
    p.add_argument("--capacity", help="borrowed-capacity source: a JSON file or an http(s) URL (model -> GPUs)")
    p.add_argument("--mcp", action="store_true", help="also serve the MCP server at /mcp/ (docs/mcp.md)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="broker log level")
    p.add_argument("--max-request-bytes", type=int, default=2 << 20,
                   help="largest JSON request body; larger ones get 413 RequestTooLarge (packages have their own)")
    p.add_argument("--max-open-requests", type=int, default=1000,
                   help="requests and websockets one caller may hold open at once (long polls, watch streams, "
                        "terminals); past it 429 TooManyOpenRequests")
    p.add_argument("--package-max-bytes", type=int, default=512 << 20, help="compressed size limit of a package")
    p.add_argument("--package-max-extracted", type=int, default=2_000_000_000,
                   help="bytes a package may write when unpacked (zip-bomb guard)")
    p.add_argument("--package-push-timeout", type=float, default=300.0, help="seconds to push a package to a pod")
    p.add_argument("--log-max-age", type=float, default=7 * 86400.0,
                   help="seconds a job's logs are kept (0: no age limit); docs/security.md, Output budget")
    p.add_argument("--log-max-bytes-per-caller", type=int, default=10 << 30,
                   help="bytes of logs kept per caller, oldest removed first (0: no byte budget)")
    p.add_argument("--log-max-bytes", type=int, default=0,
                   help="bytes of logs kept for every caller together, oldest removed first (0: no total)")
    p.add_argument("--port-range", default="1024-65535", metavar="LOW-HIGH",
                   help="ports of a session's sandbox the port proxy reaches (docs/ports.md)")
    p.add_argument("--port-domain", metavar="DOMAIN", help="also serve session ports at {port}-{tag}.DOMAIN "
                   "(a wildcard DNS name pointing at the broker) for apps that must sit at / (docs/ports.md)")
    p.add_argument("--port-link-ttl", type=float, default=300.0, metavar="SECONDS",
                   help="how long a signed port link may be opened (its cookie then lasts --ui-session-max-age)")
    p.add_argument("--port-max-body-bytes", type=int, default=1 << 30, help="largest request body the port proxy "
                   "passes to a sandbox server (413 above)")
    p.add_argument("--port-max-ws-message", type=int, default=8 << 20, help="largest websocket message the port "
                   "proxy passes either way (closed with 1009 above)")
    p.add_argument("--log-sweep-interval", type=float, default=300.0, help="seconds between log retention sweeps")
    p.add_argument("--gateway-max-kernels", type=int, default=8,
                   help="Jupyter gateway kernels (/api/kernels) a caller may run at once; one more gets 429")
    p.add_argument("--gateway-cull-idle", type=float, default=3600.0, metavar="SECONDS",
                   help="shut down a gateway kernel with no websocket open and no message this long (0: never)")
    p.add_argument("--gateway-allowed-envs", default="", metavar="NAMES",
                   help="comma-separated client env names passed to gateway kernels besides KERNEL_*")
    p.set_defaults(fn=cmds.cmd_serve)


def _submit_parser(sub: Any) -> None:
    p = _subparser(sub, "submit", "queue a job: firepool submit [opts] -- CMD ...")
    _client_opts(p)
    p.add_argument("--pool", default="cpu", help="pool to run in (`firepool pools` lists them)")
    p.add_argument("--tag", default="", help="lease (session) tag: jobs of one tag share a warm sandbox")
    p.add_argument("--pods", type=int, default=1, help="pods of a gang (torch.distributed topology injected)")
    p.add_argument("--queue", default="default", help="broker queue (part of the session's identity)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="environment (repeatable)")
    p.add_argument("--timeout", type=float, default=None, help="seconds the job may run (default: the pool's)")
    p.add_argument("--retries", type=int, default=None, help="attempts after a lost pod (default: the broker's)")
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default: 0)")
    p.add_argument("--single-use", action="store_true", help="retire the pod after this job")
    p.add_argument("--preemptible", action="store_true",
                   help="may run on other teams' unused quota and be preempted (SIGTERM, then SIGKILL; docs/quotas.md)")
    p.add_argument("--topology", choices=("node", "domain", "any"), default=None,
                   help="a gang's pods all on one node, within one topology domain, or anywhere "
                        "(default: the pool's; docs/fleet.md)")
    p.add_argument("--package", metavar="DIR", help="zip DIR, upload it once, and run the job in it")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="leave paths matching this .gitignore-style pattern out of --package (repeatable)")
    p.add_argument("--requirements", metavar="FILE", help="a requirements file to install on the pod first")
    p.add_argument("--wait", action="store_true", help="follow the job: progress, output, exit code")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="submit every job of a JSON Lines file (`-`: stdin), each line an argv array or a job body "
                        "object with these options as its defaults, then follow them: progress on stderr, a line "
                        "per job on stdout in the file's order (its JSON with --json); exit 1 if any failed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments, after --")
    p.set_defaults(fn=_cmd_submit)


def _cmd_submit(args: argparse.Namespace) -> int:
    if args.from_file is None:
        return cmds.cmd_submit(args)
    from broker.cli_fanout import cmd_submit_from  # progress bars load only for this form

    return cmd_submit_from(args)


def _listing_parsers(sub: Any) -> None:
    p = _subparser(sub, "jobs", "list your jobs")
    _client_opts(p)
    p.add_argument("--state", choices=["PENDING", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"],
                   help="only jobs in this state")
    p.add_argument("--limit", type=int, default=50, help="newest this many")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=cmds.cmd_jobs)

    p = _subparser(sub, "logs", "print a job's output (follows while it runs)")
    _client_opts(p)
    p.add_argument("job_id", help="the job's id")
    p.add_argument("--stream", default="combined", choices=["combined", "stdout", "stderr"], help="which output")
    p.add_argument("--no-follow", action="store_true", help="print what is there now and stop")
    p.set_defaults(fn=cmds.cmd_logs)

    p = _subparser(sub, "cancel", "cancel a job")
    _client_opts(p)
    p.add_argument("job_id", help="the job's id")
    p.set_defaults(fn=cmds.cmd_cancel)

    p = _subparser(sub, "pools", "pool knobs and counts")
    _client_opts(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=fleet.cmd_pools)

    p = _subparser(sub, "events", "fleet events: preemptions, reservation alerts, hold breaks, budget throttling")
    _client_opts(p)
    p.add_argument("--since", default=None, help="an event id (those after it) or a time (ISO 8601 or epoch seconds)")
    p.add_argument("--limit", type=int, default=100, help="oldest this many after --since")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=fleet.cmd_events)

    p = _subparser(sub, "pods", "what each pod is doing")
    _client_opts(p)
    p.add_argument("--pool", help="only this pool's pods")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=fleet.cmd_pods)

    add_port_parser(sub, _subparser, _client_opts)
    add_session_parsers(sub, _subparser, _client_opts)

    p = _subparser(sub, "quarantine", "GPUs and nodes taken out of placement after hardware failures (admin)")
    p.set_defaults(fn=None)
    qsub = p.add_subparsers(dest="quarantine_command", metavar="COMMAND")
    q = _subparser(qsub, "list", "quarantined and failing devices and nodes, with their failure counts")
    _client_opts(q)
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(fn=fleet.cmd_quarantine_list)
    q = _subparser(qsub, "release", "let a quarantined device or node back into placement (clears its count)")
    _client_opts(q)
    q.add_argument("key", help="the device key (GPU UUID, virtual-gpu-N) or node (node:NAME or NAME)")
    q.set_defaults(fn=fleet.cmd_quarantine_release)


def _shell_parser(sub: Any) -> None:
    p = _subparser(sub, "shell", "attach your terminal to a shell in session TAG's sandbox (starts the session "
                                 "when it has none); exits with the shell's exit code")
    _client_opts(p)
    p.add_argument("tag", help="the session's lease tag")
    p.add_argument("--pool", default="cpu", help="where to start the session when it is not live")
    p.add_argument("--queue", default="default", help="the session's queue")
    p.add_argument("-c", "--command", help="run this shell command instead of an interactive shell")
    p.set_defaults(fn=_cmd_shell)


def _cmd_shell(args: argparse.Namespace) -> int:
    from broker.cli_shell import shell  # the websocket client loads only for this command

    with cmds.client_of(args) as client:
        return shell(client, args.tag, pool=args.pool, queue=args.queue, command=args.command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="firepool", description="A broker of warm, isolated GPU sandboxes.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"firepool {package_version()}")
    parser.set_defaults(parser=parser, fn=None)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")
    _serve_parser(sub)
    _submit_parser(sub)
    _listing_parsers(sub)
    _shell_parser(sub)

    from mcp_server.client_config import add_config_parser
    from mcp_server.main import add_arguments as mcp_arguments

    p = _subparser(sub, "mcp", "MCP server (stdio, or streamable HTTP with --http): a warm sandbox per conversation; "
                               "`firepool mcp config --client NAME` prints a client's configuration")
    mcp_arguments(p)
    add_config_parser(p, HelpFormatter)
    p.set_defaults(fn=cmds.cmd_mcp)

    p = _subparser(sub, "token", "manage the broker's tokens file")
    p.set_defaults(fn=None)
    tsub = p.add_subparsers(dest="token_command", metavar="COMMAND")
    t = _subparser(tsub, "add", "create a token for a caller: print it once, store only its hash")
    t.add_argument("name", help="the caller the token authenticates")
    t.add_argument("--admin", action="store_true", help="the caller sees every caller's pods, jobs and /metrics")
    t.add_argument("--e2b", action="store_true", help="shape the token as E2B's API keys (e2b_<40 hex>): for "
                                                      "E2B_API_KEY (docs/e2b.md); any token works there")
    t.add_argument("--tokens", metavar="FILE", help="tokens file to add to, created if missing (default: "
                                                    "tokens.json in the state dir)")
    t.add_argument("--state-dir", help="default: $FIREPOOL_STATE_DIR, else $XDG_DATA_HOME/firepool")
    t.set_defaults(fn=cmds.cmd_token_add)
    t = _subparser(tsub, "rm", "remove every token of a caller (a running broker drops them at SIGHUP or restart, "
                               "ending their dashboard sessions)")
    t.add_argument("name", help="the caller whose tokens go")
    t.add_argument("--tokens", metavar="FILE", help="tokens file (default: tokens.json in the state dir)")
    t.add_argument("--state-dir", help="default: $FIREPOOL_STATE_DIR, else $XDG_DATA_HOME/firepool")
    t.set_defaults(fn=cmds.cmd_token_rm)

    add_e2b_parser(sub, _subparser, _client_opts)

    p = _subparser(sub, "cache", "operator's shared read-only caches (a pool's shared_paths)")
    p.set_defaults(fn=None)
    csub = p.add_subparsers(dest="cache_command", metavar="COMMAND")
    c = _subparser(csub, "dir", "print (and create) the host directory an operator fills for a pool's shared path")
    c.add_argument("pool", help="the pool")
    c.add_argument("path", help="the shared path as the pool's shared_paths lists it (absolute)")
    c.add_argument("--state-dir", help="the broker's state dir (default: $FIREPOOL_STATE_DIR, else "
                                       "$XDG_DATA_HOME/firepool)")
    c.set_defaults(fn=cmds.cmd_cache_dir)

    p = _subparser(sub, "bench", "run a benchmark and print ours beside the paper's figures")
    p.add_argument("name", choices=BENCHMARKS, help="the benchmark")
    p.add_argument("--json", action="store_true", help="print one JSON object with the figures")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="benchmark options")
    p.set_defaults(fn=cmds.cmd_bench)

    p = _subparser(sub, "sim", "run a scenario in the simulator (Firepool's control plane in virtual time)")
    p.add_argument("scenario", choices=SIM_SCENARIOS, help="the scenario")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="scenario options (--venue, --seed, --plot, --json)")
    p.set_defaults(fn=cmds.cmd_sim)

    from jupyter_ext.kernelspec import add_parser as add_kernelspec_parser

    add_kernelspec_parser(sub, HelpFormatter)
    return parser


def _fail(message: str, code: int = 1) -> int:
    print(f"firepool: {message}", file=sys.stderr)
    return code


def _quiet_broken_pipe() -> NoReturn:
    """The reader went away (`firepool jobs | head -1`): stop silently, as `cat` would. Point stdout at
    /dev/null first so the interpreter's final flush does not fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os._exit(141)  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would show the top-level usage; show the subcommand's, where the typo is
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.fn is None:  # bare `firepool` or `firepool kernelspec`: the help is the answer
        args.parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.fn(args) or 0)
    except FirepoolError as exc:
        return _fail(f"{exc.error_class}: {exc.message}")
    except CatalogError as exc:  # its message leads with the file and names the key
        return _fail(str(exc))
    except cmds.UsageError as exc:
        return _fail(str(exc), 2)
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            _quiet_broken_pipe()
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"{exc.strerror or exc}:{where}" if where else str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
