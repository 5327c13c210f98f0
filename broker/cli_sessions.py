"""`firepool signal JOB SIG` and `firepool session end TAG`: what REST has (`POST /v1/jobs/{id}/signal`,
`DELETE /v1/sessions/{tag}`), from the command line."""

from __future__ import annotations

import argparse
from typing import Any

from broker.jobs import SIGNALS


def _signal_name(raw: str) -> str:
    name = raw.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise argparse.ArgumentTypeError(f"{raw!r} is not one of {', '.join(SIGNALS)}")
    return name


def add_session_parsers(sub: Any, subparser: Any, client_opts: Any) -> None:
    p = subparser(sub, "signal", "send a signal to a running job (INT, TERM, HUP, USR1, USR2, QUIT to its "
                  "process group; KILL to every process of it)")
    client_opts(p)
    p.add_argument("job_id", help="the job's id")
    p.add_argument("signal", type=_signal_name, help=f"one of {', '.join(SIGNALS)} (SIGINT and int work too)")
    p.set_defaults(fn=cmd_signal)

    p = subparser(sub, "session", "your sessions (lease tags) and their sandboxes")
    p.set_defaults(fn=None)
    actions = p.add_subparsers(dest="session_command", metavar="COMMAND")
    end = subparser(actions, "end", "end session TAG now: cancel its live jobs and retire its sandboxes")
    client_opts(end)
    end.add_argument("tag", help="the session's lease tag")
    end.add_argument("--queue", default="default", help="the session's queue")
    end.set_defaults(fn=cmd_session_end)


def cmd_signal(args: argparse.Namespace) -> int:
    from broker.client import Client  # the CLI imports its HTTP client only for commands that call the broker

    with Client(url=args.url, token=args.token, state_dir=args.state_dir) as fp:
        job = fp.signal(args.job_id, args.signal)
    print(f"{job.id}: SIG{args.signal} sent ({job.state})")
    return 0


def cmd_session_end(args: argparse.Namespace) -> int:
    from broker.client import Client

    with Client(url=args.url, token=args.token, state_dir=args.state_dir) as fp:
        ended = fp.end_session(args.tag, args.queue)
    jobs, pods = ended["cancelled_jobs"], ended["retired_pods"] + ended["retiring_at_release"]
    print(f"session {args.tag!r} ended: {len(jobs)} job(s) cancelled, {len(pods)} sandbox(es) retired")
    return 0
