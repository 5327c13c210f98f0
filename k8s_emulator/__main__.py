"""`python -m k8s_emulator`: the emulator alone, for kubectl or a broker by hand.

Writes a kubeconfig, prints where it is, and serves until interrupted; every agent dies with it.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path

from k8s_emulator import ADMIN_TOKEN, Emulator, KubeletConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m k8s_emulator",
                                     description="An in-process Kubernetes API with a fake kubelet running real agents")
    parser.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--nodes", type=int, default=1, help="fake nodes node-0..")
    parser.add_argument("--gpus", type=int, default=0, help="HAMi-registered fake GPUs a node")
    parser.add_argument("--state-dir", type=Path, default=None, help="where pods' directories go (default: a temp dir)")
    parser.add_argument("--kubeconfig", type=Path, default=Path("emulator-kubeconfig.json"),
                        help="where to write the broker's kubeconfig (its service account: the shipped Role)")
    parser.add_argument("--admin-kubeconfig", type=Path, default=Path("emulator-admin-kubeconfig.json"),
                        help="where to write an admin kubeconfig (for kubectl)")
    parser.add_argument("--pull-s", type=float, default=0.0, help="the first pull of an image on a node takes this")
    parser.add_argument("--no-agents", action="store_true", help="pods go Ready without running an agent")
    parser.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto")
    args = parser.parse_args(argv)
    config = KubeletConfig(pull_s=args.pull_s, agents=not args.no_agents, sandbox=args.sandbox)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Emulator(args.state_dir, gpus=args.gpus, nodes=args.nodes, kubelet=config, port=args.port) as emu:
        args.kubeconfig.write_text(json.dumps(emu.kubeconfig(), indent=2))
        args.admin_kubeconfig.write_text(json.dumps(emu.kubeconfig(token=ADMIN_TOKEN), indent=2))
        print(f"Kubernetes emulator at {emu.url}; broker kubeconfig: {args.kubeconfig}, admin kubeconfig: "
              f"{args.admin_kubeconfig}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
