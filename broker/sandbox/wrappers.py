"""What the MCP tools run inside a session's sandbox: a command wrapper and a file helper (Python runs in
the session's live kernel: `broker.sandbox.kernels`). They are plain job commands (`sh -c`, `python3 -c`):
the MCP server needs nothing from the broker but its REST API, and the pod agent's workspace rules (kept within a session, wiped at its
boundary) give the session its files, packages and Python state.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

ARTIFACTS_MARK = "\x1efirepool-artifacts"
"""First line of the block the wrapper appends to stderr when the call wrote files to outputs/."""
RESULT_MARK = "\x1efirepool-result "
"""Prefix of the one stdout line the file helper answers with."""
OUTPUTS = "outputs"
MAX_ARTIFACTS = 50
"""New files of one call listed at most (the wrapper lists all: a pipe to `head` costs a process per call)."""
"""The workspace directory whose new files come back from a call (images inline, the rest as links)."""
STATE_DIR = ".firepool"
"""Workspace directory of the MCP layer's own state: installed packages, a saved Python namespace."""

# Runs the call inside the workspace (or `cwd` below it), with packages installed by install_packages
# on the path and a headless matplotlib, then lists the files it left in outputs/. Mode `shell` evals a
# command string in a subshell (no second bash to start); mode `argv` runs the argument vector. Only
# shell builtins besides `find`: every process costs milliseconds on the warm path.
WRAPPER = r"""
__fp_ws="${FIREPOOL_WORKSPACE:-$HOME}"
cd "$__fp_ws" || exit 97
[ -d "$__fp_ws/outputs" ] && [ -d "$__fp_ws/.firepool" ] || mkdir -p "$__fp_ws/outputs" "$__fp_ws/.firepool"
if [ -n "$1" ]; then cd -- "$1" || { echo "firepool: cannot enter directory $1" >&2; exit 2; }; fi
__fp_mode=$2
shift 2
# File times come from the kernel's coarse clock (a few ms behind): count from 10 ms before the start.
__fp_s=${EPOCHREALTIME%.*} __fp_us=${EPOCHREALTIME#*.}
__fp_us=$((10#$__fp_us - 10000))
if [ $__fp_us -lt 0 ]; then __fp_s=$((__fp_s - 1)) __fp_us=$((__fp_us + 1000000)); fi
printf -v __fp_since '%d.%06d' "$__fp_s" "$__fp_us"
export PYTHONPATH="$__fp_ws/.firepool/site${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND="${MPLBACKEND:-Agg}" \
    MPLCONFIGDIR="$__fp_ws/.firepool/mpl"
if [ "$__fp_mode" = shell ]; then
    __fp_cmd=$1
    set --
    ( eval "unset __fp_cmd __fp_mode __fp_s __fp_us; $__fp_cmd" )
else
    "$@"
fi
__fp_rc=$?
__fp_new=$(find "$__fp_ws/outputs" -type f -newermt "@$__fp_since" -printf '%s %P\n' 2>/dev/null)
if [ -n "$__fp_new" ]; then printf '\036firepool-artifacts\n%s\n' "$__fp_new" >&2; fi
exit $__fp_rc
"""

STDIN_WRAPPER = ('if [ -n "$1" ]; then cd -- "$1" || exit 2; fi; __fp_n=$2; shift 2; __fp_in=; '
                 'while [ "$__fp_n" -gt 0 ]; do __fp_in+=$1; shift; __fp_n=$((__fp_n - 1)); done; '
                 'if [ -n "$__fp_in" ]; then exec "$@" < <(base64 -d <<<"$__fp_in"); else exec "$@"; fi')
"""Runs its arguments after the stdin chunks in directory $1 with stdin from the $2 base64 chunks that follow (a
session command, `POST /v1/sessions/{tag}/commands`, with a directory or stdin; the plain path starts no extra
shell). execve takes one argument of at most 128 KiB, so stdin travels in chunks."""
STDIN_CHUNK = 96 << 10
"""Base64 characters an argument of the stdin wrapper carries."""


def with_stdin(tail: Sequence[str], cwd: str | None, stdin: bytes | None) -> list[str]:
    """The session command `tail` run through STDIN_WRAPPER in `cwd` with `stdin`."""
    data = base64.b64encode(stdin).decode() if stdin else ""
    chunks = [data[i:i + STDIN_CHUNK] for i in range(0, len(data), STDIN_CHUNK)]
    return ["bash", "-c", STDIN_WRAPPER, "firepool", cwd or "", str(len(chunks)), *chunks, *tail]


def stdin_wrapped(args: Sequence[str]) -> tuple[str, bool, list[str]] | None:
    """(cwd, whether stdin was given, the command) of a `with_stdin` argv; None for anything else."""
    if len(args) < 7 or list(args[:4]) != ["bash", "-c", STDIN_WRAPPER, "firepool"] or not args[5].isdigit():
        return None
    n = int(args[5])
    tail = list(args[6 + n:])
    return (args[4], n > 0, tail) if tail else None


# One operation on the session's workspace; the answer is one JSON line after RESULT_MARK on stdout.
FILES = r'''
import base64, json, os, shutil, subprocess, sys
ws = os.environ.get("FIREPOOL_WORKSPACE") or os.environ.get("HOME") or "."
op = sys.argv[1]
args = json.loads("".join(sys.argv[2:]))
root = os.path.realpath(ws)
def answer(obj, rc=0):
    sys.stdout.write("\x1efirepool-result " + json.dumps(obj) + "\n")
    sys.exit(rc)
def fail(kind, message):
    answer({"error": kind, "message": message}, 0)
def resolve(p):
    full = os.path.normpath(os.path.join(ws, p))
    real = os.path.realpath(full)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        fail("OutsideWorkspace", f"{p} leads outside the workspace (through a symlink or '..'): give a path inside it")
    return full
if op == "write":
    done = []
    for item in args["files"]:
        path = resolve(item["path"])
        data = base64.b64decode(item["base64"]) if "base64" in item else item["text"].encode()
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "ab" if item.get("append") else "wb") as f:
                f.write(data)
        except OSError as exc:
            fail("WriteFailed", f"{item['path']}: {exc.strerror or exc}")
        done.append({"path": item["path"], "bytes": len(data)})
    answer({"written": done})
elif op == "read":
    out = []
    for item in args["files"]:
        path = resolve(item["path"])
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                f.seek(item.get("offset", 0))
                data = f.read(item.get("max_bytes", 65536))
        except IsADirectoryError:
            fail("IsADirectory", f"{item['path']} is a directory (use list_files)")
        except FileNotFoundError:
            fail("FileNotFound", f"no such file: {item['path']}")
        except OSError as exc:
            fail("ReadFailed", f"{item['path']}: {exc.strerror or exc}")
        out.append({"path": item["path"], "size": size, "offset": item.get("offset", 0),
                    "base64": base64.b64encode(data).decode()})
    answer({"files": out})
elif op == "list":
    top = resolve(args.get("path") or ".")
    if not os.path.exists(top):
        fail("FileNotFound", f"no such path: {args.get('path')}")
    if not os.path.isdir(top):
        st = os.stat(top)
        answer({"entries": [{"path": args.get("path"), "type": "file", "size": st.st_size, "mtime": st.st_mtime}],
                "truncated": False})
    entries, limit = [], args.get("limit", 1000)
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not (root == ws and d == ".firepool"))
        depth = os.path.relpath(root, top).count(os.sep) + (0 if root == top else 1)
        for name in dirs + sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            kind = "dir" if os.path.isdir(full) and not os.path.islink(full) else "link" if os.path.islink(full) else "file"
            entries.append({"path": os.path.relpath(full, ws), "type": kind, "size": st.st_size, "mtime": st.st_mtime})
            if len(entries) >= limit:
                answer({"entries": entries, "truncated": True})
        if depth >= args.get("depth", 2) - 1:
            dirs[:] = []
    answer({"entries": entries, "truncated": False})
elif op == "remove":
    done = []
    for p in args["paths"]:
        path = resolve(p)
        if os.path.realpath(path) == root:
            fail("OutsideWorkspace", "the workspace itself cannot be removed (remove what is in it)")
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            fail("FileNotFound", f"no such path: {p}")
        except OSError as exc:
            fail("RemoveFailed", f"{p}: {exc.strerror or exc}")
        done.append(p)
    answer({"removed": done})
elif op == "install":
    target = os.path.join(ws, ".firepool", "site")
    os.makedirs(target, exist_ok=True)
    sys.path.insert(0, target)
    from importlib import metadata
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:
        Requirement = None
    missing, present = [], []
    for spec in args["packages"]:
        try:
            req = Requirement(spec) if Requirement is not None else None
            have = metadata.version(req.name) if req is not None else None
            if have is not None and (not req.specifier or req.specifier.contains(have, prereleases=True)) and not req.url:
                present.append({"package": spec, "version": have})
                continue
        except Exception:
            pass
        missing.append(spec)
    rc = 0
    if missing:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--target", target, *args.get("pip_args", []), *missing]
        rc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
    answer({"installed": missing if rc == 0 else [], "already_present": present, "failed": missing if rc else [],
            "target": target, "pip_exit_code": rc}, 1 if rc else 0)
elif op == "info":
    du = shutil.disk_usage(ws)
    info = {"workspace": ws, "disk": {"total_bytes": du.total, "used_bytes": du.used, "free_bytes": du.free},
            "cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "gpus": []}
    try:
        with open("/proc/meminfo") as f:
            info["memory_total_kib"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        q = "name,memory.total,memory.used,driver_version,uuid"
        try:
            res = subprocess.run([smi, f"--query-gpu={q}", "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=20)
            for line in res.stdout.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 5:
                    info["gpus"].append({"name": parts[0], "memory_total_mib": int(parts[1]),
                                         "memory_used_mib": int(parts[2]), "driver": parts[3], "uuid": parts[4]})
            head = subprocess.run([smi], capture_output=True, text=True, timeout=20).stdout
            if "CUDA Version:" in head:
                info["cuda"] = head.split("CUDA Version:")[1].split()[0]
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            info["gpu_error"] = repr(exc)
    answer(info)
else:
    fail("UnknownOperation", op)
'''

_ARG_CHUNK = 96 * 1024
"""Linux caps one argv string at 128 KiB: larger JSON travels as several."""


def wrap(argv: Sequence[str], cwd: str = "") -> list[str]:
    """A job command that runs `argv` through the wrapper in the workspace (or `cwd` below it)."""
    return ["bash", "-c", WRAPPER, "firepool-call", cwd, "argv", *argv]


def shell(command: str, cwd: str = "") -> list[str]:
    """A job command that runs a bash command string through the wrapper."""
    return ["bash", "-c", WRAPPER, "firepool-call", cwd, "shell", command]


def files_op(op: str, args: dict[str, Any]) -> list[str]:
    """A job command for one file-helper operation; `args` is split across argv strings when large."""
    payload = json.dumps(args)
    chunks = [payload[i:i + _ARG_CHUNK] for i in range(0, len(payload), _ARG_CHUNK)] or ["{}"]
    isolated = [] if op == "install" else ["-I", "-S"]
    command = ["python3", *isolated, "-c", FILES, op, *chunks]
    return wrap(command) if op == "install" else command


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The file helper's answer line, or None when it printed none."""
    for line in reversed(stdout.split("\n")):  # not splitlines(): it splits at the marker's \x1e
        if line.startswith(RESULT_MARK):
            value = json.loads(line[len(RESULT_MARK):])
            return value if isinstance(value, dict) else None
    return None


def split_artifacts(stderr: str) -> tuple[str, list[tuple[int, str]]]:
    """stderr without the wrapper's artifact block, and the (size, path under outputs/) it listed."""
    at = stderr.rfind(ARTIFACTS_MARK + "\n")
    if at < 0:
        return stderr, []
    found = []
    for line in stderr[at + len(ARTIFACTS_MARK) + 1:].split("\n"):
        size, _, path = line.partition(" ")
        if size.isdigit() and path:
            found.append((int(size), path))
    return stderr[:at], found[:MAX_ARTIFACTS]
