"""`firepool kernelspec install|list|uninstall`: write (list, remove) a kernelspec whose kernel runs in a Firepool pool.

The kernel.json names the `firepool` provisioner with its config (pool, broker URL, session tag mode,
bind address) and `interrupt_mode: message`, so interrupts travel as Jupyter messages to the kernel. The
broker token is never written: the provisioner reads FIREPOOL_TOKEN or the local broker's state dir.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from broker.errors import InvalidRequest

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}\Z")


def kernel_json(pool: str, *, url: str, display_name: str | None = None, lease_tag: str = "kernel",
                ip: str = "127.0.0.1") -> dict[str, Any]:
    """The kernelspec's kernel.json for `pool`."""
    if not pool:
        raise InvalidRequest("a pool is required", {"field": "pool"})
    config = {"pool": pool, "url": url, "lease_tag": lease_tag, "ip": ip}
    return {
        # Only a front end that ignores provisioners runs argv: it gets an explanation, not a local kernel.
        "argv": [sys.executable, "-m", "jupyter_ext.kernelspec", "--direct-launch", "{connection_file}"],
        "display_name": display_name or default_display_name(pool),
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {"kernel_provisioner": {"provisioner_name": "firepool", "config": config},
                     "debugger": False},
    }


def default_display_name(pool: str) -> str:
    return f"Firepool CPU ({pool})" if pool == "cpu" else f"Firepool GPU ({pool})"


def install(spec: dict[str, Any], name: str, *, user: bool = False, prefix: str | None = None) -> str:
    """Install the kernelspec under `name`; returns the directory it went to."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError as exc:
        raise InvalidRequest("jupyter_client is not installed: pip install -e '.[jupyter]' in the checkout") from exc
    if not _NAME.match(name):
        raise InvalidRequest(f"kernel name {name!r} must be lowercase letters, digits, '.', '_' or '-'",
                             {"field": "name"})
    with tempfile.TemporaryDirectory(prefix="firepool-kernelspec-") as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        destination: str = KernelSpecManager().install_kernel_spec(tmp, kernel_name=name, user=user, prefix=prefix)
    return destination


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter] = argparse.HelpFormatter) -> None:
    """`firepool kernelspec install|list|uninstall` on the CLI's subparsers."""
    def parser(parent: Any, name: str, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help, formatter_class=formatter)
        p.set_defaults(parser=p)
        return p

    p = parser(sub, "kernelspec", "install, list or remove Jupyter kernelspecs whose kernels run in Firepool pools")
    p.set_defaults(fn=None)
    actions = p.add_subparsers(dest="kernelspec_cmd", metavar="ACTION")
    i = parser(actions, "install", "write the kernelspec (kernel.json naming the firepool provisioner)")
    i.add_argument("--pool", required=True, help="pool the kernel runs in")
    i.add_argument("--name", default=None, help="kernelspec name (default: firepool-POOL)")
    i.add_argument("--display-name", default=None, help='e.g. "Firepool GPU (H200)" (default: from the pool)')
    i.add_argument("--url", default=None, help="broker URL, or a comma-separated list of the brokers of one "
                                               "store (default: $FIREPOOL_URL, else the local broker)")
    i.add_argument("--tag", default="kernel",
                   help="session tag: 'kernel' (each kernel its own sandbox session), 'notebook' (the notebook "
                        "path: reopening it lands on its warm sandbox), or a literal tag")
    i.add_argument("--ip", default="127.0.0.1",
                   help="address the kernel binds in its pod (0.0.0.0 where the pod has its own IP)")
    where = i.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user (JUPYTER_DATA_DIR)")
    where.add_argument("--sys-prefix", action="store_true", help="install into this Python's sys.prefix")
    where.add_argument("--prefix", default=None, help="install under this prefix")
    i.set_defaults(fn=cmd_install)
    listing = parser(actions, "list", "the installed kernelspecs that run in Firepool (name, pool, directory)")
    listing.add_argument("--all", action="store_true", help="list every kernelspec, not only Firepool's")
    listing.set_defaults(fn=cmd_list)
    u = parser(actions, "uninstall", "remove installed Firepool kernelspecs by name")
    u.add_argument("names", nargs="+", metavar="NAME", help="kernelspec name (see `firepool kernelspec list`)")
    u.set_defaults(fn=cmd_uninstall)


def _manager() -> Any:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError as exc:
        raise InvalidRequest("jupyter_client is not installed: pip install -e '.[jupyter]' in the checkout") from exc
    return KernelSpecManager()


def firepool_pool(spec: dict[str, Any]) -> str | None:
    """The pool a kernel.json runs in, or None when it is not a Firepool kernelspec."""
    provisioner = spec.get("metadata", {}).get("kernel_provisioner", {})
    if provisioner.get("provisioner_name") != "firepool":
        return None
    return str(provisioner.get("config", {}).get("pool", ""))


def installed() -> list[tuple[str, str | None, str, str]]:
    """(name, pool or None, display name, directory) of every installed kernelspec."""
    found = []
    for name, entry in sorted(_manager().get_all_specs().items()):
        spec = entry.get("spec", {})
        found.append((name, firepool_pool(spec), str(spec.get("display_name", "")), str(entry.get("resource_dir"))))
    return found


def cmd_list(args: argparse.Namespace) -> int:
    from broker.cli_output import print_table

    rows = [(n, p or "-", d, r) for n, p, d, r in installed() if args.all or p is not None]
    if not rows:
        print("no Firepool kernelspecs installed: firepool kernelspec install --pool POOL --user", file=sys.stderr)
        return 0
    print_table(rows, ("NAME", "POOL", "DISPLAY NAME", "DIRECTORY"))
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    ours = {n: r for n, p, _, r in installed() if p is not None}
    missing = [n for n in args.names if n not in ours]
    if missing:
        known = ", ".join(sorted(ours)) or "none installed"
        raise InvalidRequest(f"no Firepool kernelspec named {', '.join(missing)} (installed: {known})",
                             {"names": missing})
    manager = _manager()
    for name in args.names:
        manager.remove_kernel_spec(name)
        print(f"removed kernelspec {name} from {ours[name]}")
    return 0


def check_pool(pool: str, url: str | None, token: str | None = None, *, timeout: float = 5.0) -> str | None:
    """Ask the broker whether it has `pool`. An unknown pool raises UnknownPool naming the pools it has; a broker
    that cannot be asked (not running, refused token) returns the one-line warning to print, and the install goes
    on: the kernel starts later, maybe against a broker started by then."""
    from broker.client import Client
    from broker.errors import FirepoolError, UnknownPool
    from broker.retrying import NO_RETRY

    try:
        with Client(url, token, timeout=timeout, retry=NO_RETRY) as client:
            pools = [str(p.get("name")) for p in client.pools()]
    except FirepoolError as exc:
        return f"firepool: warning: pool {pool!r} not checked ({exc.error_class}: {exc.message}); installing anyway"
    if pool not in pools:
        raise UnknownPool(f"the broker at {client.url} has no pool {pool!r} (its pools: {', '.join(pools) or 'none'}); "
                          f"nothing installed", {"pool": pool, "pools": pools})
    return None


def cmd_install(args: argparse.Namespace) -> int:
    from broker.locations import discover

    url = discover(args.url, "-").url
    name = args.name or f"firepool-{args.pool}".lower()
    spec = kernel_json(args.pool, url=url, display_name=args.display_name, lease_tag=args.tag, ip=args.ip)
    warning = check_pool(args.pool, url)
    if warning:
        print(warning, file=sys.stderr)
    prefix = sys.prefix if args.sys_prefix else args.prefix
    destination = install(spec, name, user=args.user, prefix=prefix)
    print(f"installed kernelspec {name} ({spec['display_name']}) in {destination}")
    return 0


DIRECT_LAUNCH = """this kernelspec runs its kernel through the `firepool` kernel provisioner, which this front end
did not use (it launched the kernelspec's argv itself). Use a Jupyter that honours kernel provisioners
(jupyter_client >= 7): JupyterLab, Notebook 7 or `jupyter server`, nbclient/nbconvert, or VS Code connected
to such a Jupyter server. See docs/jupyter.md."""


def main(argv: list[str] | None = None) -> int:
    """What a provisioner-unaware launcher runs: say why no kernel starts, and fail."""
    print(f"firepool: {DIRECT_LAUNCH}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
