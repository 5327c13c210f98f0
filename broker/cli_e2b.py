"""`firepool e2b env`: the lines that point the official E2B SDKs at this broker (docs/e2b.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any


def add_e2b_parser(sub: Any, subparser: Any, client_opts: Any) -> None:
    p = subparser(sub, "e2b", "the E2B-compatible API: `firepool e2b env` prints the exports for E2B's SDKs")
    p.set_defaults(fn=None)
    esub = p.add_subparsers(dest="e2b_command", metavar="COMMAND")
    e = subparser(esub, "env", "print `export E2B_API_URL=... E2B_SANDBOX_URL=...` (and E2B_API_KEY when a token is "
                               "known) for the broker this CLI talks to")
    client_opts(e)
    e.set_defaults(fn=cmd_e2b_env)


def env_lines(url: str, token: str) -> list[str]:
    base = url.rstrip("/")
    lines = [f"export E2B_API_URL={shlex.quote(base + '/e2b')}",
             f"export E2B_SANDBOX_URL={shlex.quote(base + '/e2b/sandbox')}"]
    if token:
        lines.append(f"export E2B_API_KEY={shlex.quote(token)}")
    return lines


def cmd_e2b_env(args: argparse.Namespace) -> int:
    from broker.locations import discover

    found = discover(args.url, args.token, args.state_dir)
    print("\n".join(env_lines(found.urls[0], found.token)))
    if len(found.urls) > 1:  # E2B's SDKs take one URL and do not fail over
        print(f"# the E2B SDKs take one URL: this is the first of {found.url}; for fail-over give them an address "
              f"that follows the leader (e.g. a Service routed by /readyz)", file=sys.stderr)
    return 0
