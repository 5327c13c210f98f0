"""The agent's settings, built once from its command line, and the secret read from an fd or a file.

The secret never touches the environment, argv or a file the agent leaves behind: it is read to EOF
from an inherited pipe (the local backend) or from a mounted file that is unlinked when possible.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class AgentConfig:
    pod: str
    """The pod's name, reported by /v1/health."""
    listen: str
    """`unix:/path` or `tcp:host:port`."""
    workspace: str
    """The job's working directory and HOME; emptied at a session boundary."""
    package_dir: str
    """Where the job's package is unpacked; emptied by every reset."""
    run_dir: str
    """The agent's own directory: its socket and per-attempt log files."""
    tmp_dir: str
    """The job's TMPDIR; emptied with the workspace."""
    cuda_visible_devices: str = ""
    """Always set in the job's environment; "" hides every GPU (CPU pods)."""
    job_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    """PATH of every job."""
    isolated: bool = False
    """True inside a sandbox with a private /dev/shm; only then does reset empty /dev/shm."""
    own_network: bool = False
    """The sandbox has a network namespace of its own (an isolated local pod, a Kubernetes pod): whatever
    listens in it is the sandbox's, so the port tunnel skips the /proc ownership check (~10 ms a request)."""
    shm_dir: str = "/dev/shm"
    deps_dir: str = ""
    """Where requirements are installed; survives resets for the pod's life. "" disables installs."""
    ledger_fd: int | None = None
    """An O_APPEND fd of the host's record of started attempts (`ledger`); None keeps no record."""
    kernels: str = "cold"
    """Pre-started kernel (`prestart`): `cold` never, `learned` after a kernel attempt, `prestart` always."""
    incarnation: int | None = None
    """This start's incarnation (`incarnation`), given by the launcher or bumped in `state_dir`."""
    state_dir: str = ""
    """Where the agent persists its incarnation counter itself when the launcher does not give one, and the
    newest broker term it has seen (`terms`)."""
    orphan_after_s: float = 300.0
    """With no request of a current broker for this long, the agent kills its attempts and exits (`orphan`);
    0 never does."""


def _orphan_default() -> float:
    """$FIREPOOL_AGENT_ORPHAN_AFTER_S (an image or a pod spec may set it), else 300 s."""
    try:
        return float(os.environ.get("FIREPOOL_AGENT_ORPHAN_AFTER_S", "") or 300.0)
    except ValueError:
        return 300.0


def _auto_cuda_devices() -> str:
    """Indices of the GPU device nodes this container was given, without loading any CUDA library."""
    nodes = [p for p in glob.glob("/dev/nvidia*") if p[len("/dev/nvidia"):].isdigit()]
    return ",".join(str(i) for i in range(len(nodes)))


def parse_args(argv: list[str] | None = None) -> tuple[AgentConfig, bytes]:
    """Parse the command line and read the secret; returns the settings and the secret bytes."""
    parser = argparse.ArgumentParser(prog="firepool_agent", description="Firepool pod agent")
    parser.add_argument("--pod", default=None, help="pod name (default: the hostname)")
    parser.add_argument("--listen", required=True, help="unix:/path or tcp:host:port")
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument("--secret-fd", type=int, help="read the bearer secret from this fd to EOF")
    secret.add_argument("--secret-file", help="read the bearer secret from this file, then unlink it")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--package-dir", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--tmp-dir", required=True)
    parser.add_argument("--cuda-visible-devices", default="",
                        help='GPU list for jobs; "auto" counts /dev/nvidiaN nodes')
    parser.add_argument("--path", default=None, help="PATH for jobs (default: the agent's PATH)")
    parser.add_argument("--isolated", action="store_true", help="the agent runs in its own sandbox")
    parser.add_argument("--own-network", action="store_true",
                        help="the sandbox has its own network namespace (no host service listens in it)")
    parser.add_argument("--deps-dir", default="", help="the pod's dependency directory (kept across resets)")
    parser.add_argument("--kernels", choices=("cold", "learned", "prestart"), default="cold",
                        help="keep a pre-imported, unbound kernel process while idle: never, after a kernel "
                             "attempt, or always (default: cold)")
    parser.add_argument("--ledger-fd", type=int, default=None,
                        help="append each started attempt id to this fd before its code runs")
    parser.add_argument("--incarnation", type=int, default=None,
                        help="this start's incarnation, persisted by the launcher (reported by /v1/health)")
    parser.add_argument("--state-dir", default="",
                        help="persist the incarnation counter (when not given) and the newest broker term here")
    parser.add_argument("--orphan-after-s", type=float, default=_orphan_default(),
                        help="end the sandbox after this long without a request of a current broker; 0: never "
                             "(default: $FIREPOOL_AGENT_ORPHAN_AFTER_S or 300)")
    args = parser.parse_args(argv)
    cuda = _auto_cuda_devices() if args.cuda_visible_devices == "auto" else args.cuda_visible_devices
    config = AgentConfig(
        pod=args.pod or socket.gethostname(),
        listen=args.listen,
        workspace=os.path.abspath(args.workspace),
        package_dir=os.path.abspath(args.package_dir),
        run_dir=os.path.abspath(args.run_dir),
        tmp_dir=os.path.abspath(args.tmp_dir),
        cuda_visible_devices=cuda,
        job_path=args.path or os.environ.get("PATH") or AgentConfig.job_path,
        isolated=args.isolated,
        own_network=args.own_network,
        deps_dir=os.path.abspath(args.deps_dir) if args.deps_dir else "",
        kernels=args.kernels,
        ledger_fd=args.ledger_fd,
        incarnation=args.incarnation,
        state_dir=os.path.abspath(args.state_dir) if args.state_dir else "",
        orphan_after_s=args.orphan_after_s,
    )
    if not (config.orphan_after_s >= 0 and math.isfinite(config.orphan_after_s)):
        parser.error("--orphan-after-s must be a finite number of seconds, 0 or more")
    if not (config.listen.startswith("unix:") or config.listen.startswith("tcp:")):
        parser.error("--listen must be unix:/path or tcp:host:port")
    value = _read_fd(args.secret_fd) if args.secret_fd is not None else _read_file(args.secret_file)
    if len(value) < 16:
        parser.error("the secret must be at least 16 bytes")
    return config, value


def _read_fd(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).strip()


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        value = f.read().strip()
    try:
        os.unlink(path)
    except OSError:
        pass  # a read-only mount (e.g. a Kubernetes secret volume): the mount itself must be private
    return value
