"""`firepool mcp config --client NAME`: the snippet that makes an MCP client launch this install's `firepool mcp`.

The command is the absolute path of the `firepool` beside this Python (an IDE starts servers without the
shell's PATH or an activated venv, so a bare `firepool` would not resolve). The broker it reaches: `--url`
(else $FIREPOOL_URL) goes into the snippet's env with a token the user fills in (a token is printed only when
given with `--token`; VS Code prompts for it, Claude Code takes it from the shell); with neither, the server
finds the local broker the way the CLI does (the state dir, whose token file it reads), so the snippet needs no
env at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

CLIENTS = ("claude-desktop", "cursor", "vscode", "claude-code")
TOKEN_PLACEHOLDER = "<your broker token>"

WHERE = {
    "claude-desktop": "Claude Desktop: Settings > Developer > Edit Config, i.e. claude_desktop_config.json "
                      "(macOS: ~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\); "
                      "merge into its mcpServers and restart Claude Desktop",
    "cursor": "Cursor: .cursor/mcp.json in the project, or ~/.cursor/mcp.json for every project",
    "vscode": "VS Code: .vscode/mcp.json in the workspace (or MCP: Open User Configuration)",
    "claude-code": "Claude Code: run this command in the project (add --scope user for every project)",
}


def firepool_command() -> list[str]:
    """The absolute command that runs this install's CLI: bin/firepool beside sys.executable, else
    `python -m broker.cli` with this Python."""
    script = Path(sys.executable).parent / "firepool"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "broker.cli"]


def server_env(url: str | None, token: str | None, *, token_ref: str = TOKEN_PLACEHOLDER) -> dict[str, str]:
    """The environment the client gives the server: empty for the local broker; URL and token otherwise."""
    env: dict[str, str] = {}
    state_dir = os.environ.get("FIREPOOL_STATE_DIR")
    if url:
        env["FIREPOOL_URL"] = url
        env["FIREPOOL_TOKEN"] = token or token_ref
    elif state_dir:  # a local broker outside the default state dir: the server must look there too
        env["FIREPOOL_STATE_DIR"] = str(Path(state_dir).absolute())
        if token:
            env["FIREPOOL_TOKEN"] = token
    elif token:
        env["FIREPOOL_TOKEN"] = token
    return env


def snippet(client: str, *, url: str | None = None, token: str | None = None, pool: str | None = None,
            name: str = "firepool") -> str:
    """The text to paste (JSON for the config files, a command line for Claude Code)."""
    command = firepool_command()
    args = [*command[1:], "mcp", *(["--pool", pool] if pool else [])]
    if client in ("claude-desktop", "cursor"):
        entry: dict[str, Any] = {"command": command[0], "args": args}
        env = server_env(url, token)
        if env:
            entry["env"] = env
        return json.dumps({"mcpServers": {name: entry}}, indent=2)
    if client == "vscode":
        env = server_env(url, token, token_ref="${input:firepoolToken}")
        entry = {"type": "stdio", "command": command[0], "args": args}
        config: dict[str, Any] = {"servers": {name: entry}}
        if env:
            entry["env"] = env
        if env.get("FIREPOOL_TOKEN") == "${input:firepoolToken}":
            config["inputs"] = [{"id": "firepoolToken", "type": "promptString",
                                 "description": "Firepool broker token", "password": True}]
        return json.dumps(config, indent=2)
    if client == "claude-code":
        env = server_env(url, token, token_ref="$FIREPOOL_TOKEN")
        flags = []
        for key, value in env.items():  # the token stays a shell reference unless given: nothing secret printed
            flags.append(f"--env {key}=$FIREPOOL_TOKEN" if value == "$FIREPOOL_TOKEN"
                         else f"--env {shlex.quote(f'{key}={value}')}")
        return " ".join(["claude mcp add", *flags, name, "--", *map(shlex.quote, [command[0], *args])])
    raise ValueError(f"unknown MCP client {client!r} (one of {', '.join(CLIENTS)})")


def add_config_parser(mcp_parser: argparse.ArgumentParser, formatter: type[argparse.HelpFormatter]) -> None:
    """`firepool mcp config` under `firepool mcp` (which without it runs the server)."""
    sub = mcp_parser.add_subparsers(dest="mcp_command", metavar="COMMAND")
    help = "print the configuration snippet for an MCP client, with this install's absolute firepool path"
    p: argparse.ArgumentParser = sub.add_parser("config", help=help, description=help, formatter_class=formatter)
    p.set_defaults(parser=p, fn=cmd_config)
    p.add_argument("--client", required=True, choices=CLIENTS, help="the MCP client the snippet is for")
    keep = argparse.SUPPRESS  # `firepool mcp --url U config ...` keeps the U given before `config`
    p.add_argument("--url", default=keep, help="broker URL for the server, or a comma-separated list of the brokers "
                                 "of one store (default: $FIREPOOL_URL, else the local broker, found "
                                 "through its state dir: no env in the snippet)")
    p.add_argument("--token", default=keep, help="put this broker token in the snippet (default: a placeholder to fill in, or "
                                   "none for the local broker)")
    p.add_argument("--pool", default=keep, help="pool the sessions' sandboxes come from (default: the server's choice, the cpu "
                                  "pool where there is one)")
    p.add_argument("--name", default="firepool", help="the server's name in the client")


def cmd_config(args: argparse.Namespace) -> int:
    url = getattr(args, "url", None) or os.environ.get("FIREPOOL_URL") or None
    token = getattr(args, "token", None)
    print(snippet(args.client, url=url, token=token, pool=getattr(args, "pool", None), name=args.name))
    note = WHERE[args.client]
    if url and not token and args.client in ("claude-desktop", "cursor"):
        note += f"; replace {TOKEN_PLACEHOLDER} with the broker token"
    print(f"# {note}", file=sys.stderr)
    return 0
