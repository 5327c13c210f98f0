"""What a local pod's sandbox looks like: the bubblewrap command line, and the unisolated (--unisolated) one.

Inside, a pod sees the host's /usr read-only, a minimal read-only /etc (sandboxetc.py), the Python
prefixes (the venv is the pool's "base image"), the agent package, private /proc, /dev, /tmp and
/dev/shm, and its own workspace, package and run directories; nothing of other pods or of the broker's
state directory. Every path a job can write is on the pod's capped disk or a sized tmpfs; bwrap's own
root and /dev are read-only.

Running as root, bwrap itself runs privileged (so it can reach bind sources under 0700 directories
such as /root/.pyenv) and the agent drops to the sandbox uid with setpriv before it starts: no
capabilities, an empty bounding set, no_new_privs. As any other user, bwrap makes a user namespace.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.backends import sandboxetc
from broker.backends.networking import unshares
from broker.podtemplate import Bind

log = logging.getLogger(__name__)

AGENT_MOUNT = "/opt/firepool/agent"
SANDBOX_WORKSPACE = "/workspace"
SANDBOX_PKG = "/pkg"
SANDBOX_RUN = "/run/firepool"
SANDBOX_DEPS = "/opt/firepool/deps"
LIMITS_MOUNT = "/opt/firepool/limits"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SYSTEM_RO = ("/usr",)
_SYSTEM_LINKS = ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin")
_NVIDIA_SHARED = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                  "/dev/nvidia-caps")
KEPT = "disk/kept"
"""A pod's kept caches, relative to its root (`PodDirs.kept`; a string for the path checked after every reset)."""
SECRET_FD = 3
INFO_FD = 4


@dataclass(frozen=True)
class PodDirs:
    """A pod's host directories under `state_dir/pods/<name>/` (only `root` is private to the broker)."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / "pod.json"

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    @property
    def disk(self) -> Path:
        """Everything a job can write on the host's disk, capped as one filesystem (see volumes.py)."""
        return self.root / "disk"

    @property
    def kept(self) -> Path:
        """The pod's copy of its caller's kept caches (broker.backends.kept): on the capped disk too."""
        return self.root / KEPT

    @property
    def disk_image(self) -> Path:
        return self.root / "disk.img"

    @property
    def workspace(self) -> Path:
        return self.disk / "workspace"

    @property
    def pkg(self) -> Path:
        return self.disk / "pkg"

    @property
    def run(self) -> Path:
        """The agent's run dir (its socket, the attempts' logs, package staging): the job runs as the agent's
        uid and writes here too, so it lives on the capped disk, never on the host's root disk. A pod made
        by an older broker keeps its run dir beside the disk until the rollout replaces it (podnets)."""
        legacy = self.root / "run"
        return legacy if legacy.is_dir() else self.disk / "run"

    @property
    def tmp(self) -> Path:
        """The fallback's TMPDIR; a sandbox gets a private tmpfs instead."""
        return self.root / "tmp"

    @property
    def deps(self) -> Path:
        """Requirements installed for the pod's jobs; kept across resets for the pod's life."""
        return self.disk / "deps"

    @property
    def volumes(self) -> Path:
        """Host directories of the pool's `wipe_paths`, private to this pod."""
        return self.disk / "volumes"

    @property
    def socket(self) -> Path:
        return self.run / "agent.sock"

    @property
    def resolv(self) -> Path:
        """The sandbox's /etc/resolv.conf on an isolated network (slirp4netns's resolver)."""
        return self.root / "resolv.conf"

    @property
    def passwd(self) -> Path:
        """The sandbox's /etc/passwd (and group below): root, nobody and the job's uid, nothing of the host's."""
        return self.root / "passwd"

    @property
    def group(self) -> Path:
        return self.root / "group"

    @property
    def net_log(self) -> Path:
        """The output of the pod's network helper (never visible in the sandbox)."""
        return self.root / "net.log"


@dataclass(frozen=True)
class SandboxSpec:
    """Everything that shapes one pod's command line."""

    name: str
    dirs: PodDirs
    python: str
    """The interpreter that runs the agent, and the first python on the jobs' PATH."""
    prefixes: tuple[str, ...]
    agent_dir: str
    """The host directory of the `firepool_agent` package."""
    cuda_visible_devices: str
    gpu_nodes: tuple[str, ...] = ()
    """/dev/nvidiaN nodes of the pod's GPUs (none for virtual GPUs)."""
    binds: tuple[Bind, ...] = ()
    uid: int | None = None
    """Set when the broker is root: the uid (and gid) the agent and jobs run as."""
    network: str = "isolated"
    """`host` shares the host's network (jobs reach its loopback); `isolated` and `none` get a namespace of
    their own (networking.py plugs a user-mode stack into an isolated one)."""
    tmp_size: int | None = None
    """Bytes of the /tmp tmpfs (None: the kernel's default, half of RAM)."""
    shm_size: int | None = None
    """Bytes of the /dev/shm tmpfs."""
    limit_dirs: tuple[tuple[str, str], ...] = ()
    """(name, host cgroup dir) shown read-only at LIMITS_MOUNT/name: the agent reads its OOM and pids counters."""


def agent_package_dir() -> str:
    """Where the `firepool_agent` package lives on this host (a source tree or site-packages)."""
    spec = importlib.util.find_spec("firepool_agent")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the firepool_agent package is not importable")
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def python_of(prefix: str) -> str:
    for name in ("python3", "python"):
        candidate = os.path.join(prefix, "bin", name)
        if os.path.exists(candidate):
            return candidate
    return sys.executable


def editable_hooks(prefix: str) -> list[str]:
    """The `.pth` hooks of editable installs in `prefix`: they point into source trees a sandbox does
    not mount, and importing their finder costs every Python start in the sandbox ~15 ms."""
    return sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "__editable__*.pth")))


def python_prefixes(prefix: str) -> tuple[str, ...]:
    """The directories a sandbox needs to run `prefix`'s python: the venv and the interpreter it links to."""
    found = [os.path.realpath(prefix)]
    if os.path.realpath(prefix) == os.path.realpath(sys.prefix):
        found.append(os.path.realpath(sys.base_prefix))
    real_python = os.path.realpath(python_of(prefix))
    found.append(os.path.dirname(os.path.dirname(real_python)))
    out: list[str] = []
    for path in found:
        if not any(_under(path, system) for system in (*_SYSTEM_RO, *_SYSTEM_LINKS)) and path not in out:
            out.append(path)
    # The venv's own path must come too when it is a symlink to elsewhere.
    if os.path.abspath(prefix) not in out and os.path.realpath(prefix) != os.path.abspath(prefix):
        out.append(os.path.abspath(prefix))
    return tuple(out)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def exposed_sources(spec: SandboxSpec) -> list[str]:
    """Host paths visible inside the sandbox (to check that the broker's state stays outside them)."""
    return [*_SYSTEM_RO, *sandboxetc.host_entries(), *spec.prefixes, spec.agent_dir, *(b.src for b in spec.binds)]


def agent_args(spec: SandboxSpec, *, isolated: bool) -> list[str]:
    """The agent's own flags: sandbox paths inside bwrap, host paths in the fallback."""
    if isolated:
        places = [SANDBOX_WORKSPACE, SANDBOX_PKG, SANDBOX_RUN, "/tmp", SANDBOX_DEPS]
    else:
        d = spec.dirs
        places = [str(d.workspace), str(d.pkg), str(d.run), str(d.tmp), str(d.deps)]
    args = ["-S", "-m", "firepool_agent", "--pod", spec.name, "--listen", f"unix:{places[2]}/agent.sock",
            "--secret-fd", str(SECRET_FD), "--workspace", places[0], "--package-dir", places[1],
            "--run-dir", places[2], "--tmp-dir", places[3], "--deps-dir", places[4],
            "--cuda-visible-devices", spec.cuda_visible_devices, "--path", job_path(spec)]
    if isolated and unshares(spec.network):
        args.append("--own-network")
    return [*args, "--isolated"] if isolated else args


def job_path(spec: SandboxSpec) -> str:
    return f"{os.path.dirname(spec.python)}:{SYSTEM_PATH}"


def agent_env(spec: SandboxSpec, *, isolated: bool) -> dict[str, str]:
    """The agent's environment (jobs get a fresh one from the agent): only what it needs to start."""
    agent_root = AGENT_MOUNT if isolated else os.path.dirname(spec.agent_dir)
    home = SANDBOX_WORKSPACE if isolated else str(spec.dirs.workspace)
    return {"PYTHONPATH": agent_root, "PATH": job_path(spec), "LANG": "C.UTF-8", "HOME": home}


def _namespaces(name: str, uid: int | None, own_network: bool = False) -> list[str]:
    argv = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", name, "--as-pid-1", "--new-session",
            "--cap-drop", "ALL", *(["--unshare-net"] if own_network else [])]
    if uid is None:
        return ["--unshare-user", *argv]
    # Privileged bwrap keeps only what setpriv needs to drop to the sandbox uid, then drops it too.
    return [*argv, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]


def _system_mounts() -> list[str]:
    argv = []
    for path in _SYSTEM_RO:
        argv += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


HOST_RESOLV_CONF = "/etc/resolv.conf"


def _etc_mounts(spec: SandboxSpec) -> list[tuple[str, list[str]]]:
    """The sandbox's minimal /etc. An isolated namespace resolves names through slirp4netns, not the
    host's resolver (often on 127.0.0.x), so it gets the pod's own resolv.conf."""
    own = spec.dirs.resolv if spec.network == "isolated" else None
    return sandboxetc.mounts(own, spec.dirs.passwd, spec.dirs.group, HOST_RESOLV_CONF)


def write_users(spec: SandboxSpec) -> None:
    """Write the pod's own /etc/passwd and /etc/group (bwrap_argv binds them): its jobs' uid by name."""
    uid = spec.uid if spec.uid is not None else os.geteuid()
    sandboxetc.write_users(spec.dirs.passwd, spec.dirs.group, uid, uid if spec.uid is not None else os.getegid())


def _drop_privileges(uid: int | None) -> list[str]:
    if uid is None:
        return []
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
            "--"]


class _Tree:
    """Emits `--dir` (mode 0755) for every missing parent of a mount point, in mount order.

    `present` are directories that exist; `filled` are binds of host directories, whose subdirectories
    exist too. A tmpfs (/tmp) is present but empty: parents below it must be made, or bwrap makes
    them root-only and the sandbox uid cannot reach the bind.
    """

    def __init__(self) -> None:
        self.present = {"/"}
        self.filled: set[str] = set()
        self.argv: list[str] = []

    def mount(self, dst: str, *mount: str) -> None:
        parents: list[str] = []
        parent = os.path.dirname(dst)
        while parent not in self.present and not any(_under(parent, p) for p in self.filled):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(parents):
            self.argv += ["--perms", "0755", "--dir", directory]
            self.present.add(directory)
        self.argv += mount
        self.present.add(dst)
        if mount and mount[0] in ("--bind", "--ro-bind", "--ro-bind-try", "--dev-bind-try"):
            self.filled.add(dst)


def _sized_tmpfs(path: str, size: int | None) -> list[str]:
    """A world-writable tmpfs; `size` caps it (writes past it fail ENOSPC), and its pages count as the
    pod's memory in its cgroup."""
    return ["--perms", "1777", *(["--size", str(size)] if size is not None else []), "--tmpfs", path]


def bwrap_argv(bwrap: str, spec: SandboxSpec) -> list[str]:
    """The full command that starts the pod: bwrap, [setpriv], python -m firepool_agent."""
    tree = _Tree()
    tree.argv += _namespaces(spec.name, spec.uid, unshares(spec.network)) + ["--info-fd", str(INFO_FD)]
    tree.argv += _system_mounts()
    tree.present.update((*_SYSTEM_RO, *_SYSTEM_LINKS))
    tree.filled.update(_SYSTEM_RO)
    tree.argv += ["--perms", "0755", "--dir", sandboxetc.ETC]
    tree.present.add(sandboxetc.ETC)
    for dst, mount in _etc_mounts(spec):
        tree.mount(dst, *mount)
    # Private /tmp and /dev/shm first: binds below may live under /tmp on the host (a checkout in /tmp)
    # and must land on top of the tmpfs, not under it.
    tree.argv += ["--proc", "/proc", "--dev", "/dev", *_sized_tmpfs("/tmp", spec.tmp_size),
                  *_sized_tmpfs("/dev/shm", spec.shm_size)]
    tree.present.update(("/proc", "/dev", "/tmp"))
    for prefix in spec.prefixes:
        tree.mount(prefix, "--ro-bind", prefix, prefix)
        for hook in editable_hooks(prefix):
            tree.argv += ["--ro-bind", "/dev/null", hook]
    tree.mount(f"{AGENT_MOUNT}/firepool_agent", "--ro-bind", spec.agent_dir, f"{AGENT_MOUNT}/firepool_agent")
    if spec.gpu_nodes:
        for node in (*_NVIDIA_SHARED, *spec.gpu_nodes):
            tree.argv += ["--dev-bind-try", node, node]
        tree.argv += ["--ro-bind-try", "/sys", "/sys"]  # CUDA and NVML read PCI topology there
    d = spec.dirs
    tree.mount(SANDBOX_WORKSPACE, "--bind", str(d.workspace), SANDBOX_WORKSPACE)
    tree.mount(SANDBOX_PKG, "--bind", str(d.pkg), SANDBOX_PKG)
    tree.mount(SANDBOX_RUN, "--bind", str(d.run), SANDBOX_RUN)
    tree.mount(SANDBOX_DEPS, "--bind", str(d.deps), SANDBOX_DEPS)
    for bind in spec.binds:
        tree.mount(bind.dst, "--ro-bind" if bind.ro else "--bind", bind.src, bind.dst)
    for name, source in spec.limit_dirs:
        tree.mount(f"{LIMITS_MOUNT}/{name}", "--ro-bind", source, f"{LIMITS_MOUNT}/{name}")
    # bwrap's own root and /dev are tmpfs filesystems without a size: read-only, so nothing lands there.
    tree.argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    env = agent_env(spec, isolated=True)
    # "/": bwrap changes directory before setpriv drops to the sandbox uid, whose dirs are 0700.
    tree.argv += ["--chdir", "/", "--clearenv"]
    for key, value in env.items():
        tree.argv += ["--setenv", key, value]
    return [bwrap, *tree.argv, "--", *_drop_privileges(spec.uid), spec.python, *agent_args(spec, isolated=True)]


def fallback_argv(spec: SandboxSpec) -> list[str]:
    """The unisolated agent: a plain process (its own session, a subreaper) over host paths."""
    return [spec.python, *agent_args(spec, isolated=False)]


def probe_bwrap(bwrap: str | None, uid: int | None, timeout_s: float = 10.0, own_network: bool = False) -> str | None:
    """None when a minimal sandbox (with a network namespace of its own if asked) starts and exits cleanly
    here; otherwise why not."""
    if bwrap is None:
        return "bwrap is not installed"
    if uid is not None and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is needed to drop to the sandbox uid when running as root"
    argv = [bwrap, *_namespaces("probe", uid, own_network), *_system_mounts(), "--proc", "/proc", "--dev", "/dev", "--",
            *_drop_privileges(uid), "/usr/bin/env", "true"]
    try:
        result = subprocess.run(argv, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap probe failed: {exc}"
    if result.returncode != 0:
        return f"bwrap probe exited {result.returncode}: {result.stderr.decode(errors='replace').strip()[:300]}"
    return None


def uses(paths: Sequence[str], target: str) -> str | None:
    """The first of `paths` that contains `target` or lies inside it, if any."""
    target = os.path.realpath(target)
    for path in paths:
        real = os.path.realpath(path)
        if _under(target, real) or _under(real, target):
            return path
    return None
