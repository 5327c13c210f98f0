"""`firepool port TAG PORT`: where a server of a session is served through the broker (docs/ports.md)."""

from __future__ import annotations

import argparse
from typing import Any

from broker.cli_output import printed_json


def add_port_parser(sub: Any, subparser: Any, client_opts: Any) -> None:
    p = subparser(sub, "port", "print the URL of a port a job of session TAG serves (through the broker)")
    client_opts(p)
    p.add_argument("tag", help="the session (lease tag) whose sandbox runs the server")
    p.add_argument("port", type=int, help="the port the server listens on inside the sandbox")
    p.add_argument("--link", action="store_true", help="print a short-lived signed link to open in a browser "
                   "instead (it sets a cookie for this session port only)")
    p.add_argument("--ttl", type=float, default=None, metavar="SECONDS", help="with --link: how long it may be "
                   "opened (default the broker's --port-link-ttl)")
    p.add_argument("--host-form", action="store_true", help="print the host form ({port}-{tag}.DOMAIN; the "
                   "broker needs --port-domain)")
    p.add_argument("--json", action="store_true", help="with --link: print the link, its expiry and every form")
    p.set_defaults(fn=cmd_port)


def cmd_port(args: argparse.Namespace) -> int:
    from broker.client import Client  # the CLI imports its HTTP client only for commands that call the broker

    with Client(url=args.url, token=args.token, state_dir=args.state_dir) as fp:
        link = fp.port_link(args.tag, args.port, args.ttl)  # checks the range and that the session is yours
    if printed_json(args.json, link):
        return 0
    if args.host_form and link.get("host_url") is None:
        print("firepool: this broker serves no host form (start it with --port-domain DOMAIN)")
        return 1
    key = {(False, False): "port_url", (True, False): "url", (False, True): "host_port_url",
           (True, True): "host_url"}[(args.link, args.host_form)]
    print(link[key])
    return 0
