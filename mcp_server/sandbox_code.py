"""What the MCP tools run inside a session's sandbox: a command wrapper, a stateful Python runner and a
file helper. They are plain job commands (`sh -c`, `python3 -c`): the MCP server needs nothing from the
broker but its REST API, and the pod agent's workspace rules (kept within a session, wiped at its
boundary) give the session its files, packages and Python state.
"""

from __future__ import annotations

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
"""Workspace directory of the MCP layer's own state: installed packages, pickled Python namespace."""

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

# Stateful Python: the namespace of earlier calls of the session is restored from a pickle in the
# workspace (imports re-imported by name, top-level def/class statements replayed, values unpickled);
# the last expression's value is printed like a REPL; open matplotlib figures are saved to outputs/;
# what cannot be pickled is skipped with a note on stderr.
PYEXEC = r'''
def _firepool_exec():
    import ast, os, pickle, sys, time, traceback, types, importlib
    import __main__
    ws = os.environ.get("FIREPOOL_WORKSPACE") or os.environ.get("HOME") or "."
    state_path = os.path.join(ws, ".firepool", "pyexec.pkl")
    ns = __main__.__dict__
    own = set(ns)
    notes = []
    saved = {"defs": {}, "modules": {}, "values": {}}
    try:
        with open(state_path, "rb") as f:
            saved = pickle.load(f)
    except FileNotFoundError:
        pass
    except Exception as exc:
        notes.append(f"the previous state could not be read ({exc!r}); starting fresh")
    for name, mod in saved["modules"].items():
        try:
            ns[name] = importlib.import_module(mod)
        except Exception as exc:
            notes.append(f"{name}: re-import of {mod} failed ({exc!r})")
    for name, src in saved["defs"].items():
        try:
            exec(compile(src, "<python_exec:" + name + ">", "exec"), ns)
        except Exception as exc:
            notes.append(f"{name}: definition could not be replayed ({exc!r})")
    for name, blob in saved["values"].items():
        try:
            ns[name] = pickle.loads(blob)
        except Exception as exc:
            notes.append(f"{name}: could not be restored ({exc!r})")
    code = sys.argv[1]
    defs = dict(saved["defs"])
    rc = 0
    try:
        tree = ast.parse(code, "<python_exec>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs[node.name] = ast.get_source_segment(code, node) or ast.unparse(node)
        exec(compile(tree, "<python_exec>", "exec"), ns)
        if last is not None:
            value = eval(compile(last, "<python_exec>", "eval"), ns)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            out = os.path.join(ws, "outputs")
            os.makedirs(out, exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for i, num in enumerate(plt.get_fignums()):
                plt.figure(num).savefig(os.path.join(out, f"figure-{stamp}-{os.getpid()}-{i + 1}.png"))
            plt.close("all")
        except Exception as exc:
            notes.append(f"figures could not be saved ({exc!r})")
    keep = {"defs": {}, "modules": {}, "values": {}}
    skipped = []
    for name, value in list(ns.items()):
        if name in own and name not in saved["values"] and name not in saved["modules"] and name not in defs:
            continue
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            keep["modules"][name] = value.__name__
        elif getattr(value, "__module__", None) == "__main__" and isinstance(value, (types.FunctionType, type)):
            if name in defs:
                keep["defs"][name] = defs[name]
            else:
                skipped.append(name)
        else:
            try:
                keep["values"][name] = pickle.dumps(value)
            except Exception:
                skipped.append(name)
    if skipped:
        notes.append("not kept for the next call (cannot be pickled): " + ", ".join(sorted(skipped)))
    os.makedirs(os.path.dirname(state_path), exist_ok=True)
    with open(state_path + ".tmp", "wb") as f:
        pickle.dump(keep, f)
    os.replace(state_path + ".tmp", state_path)
    for note in notes:
        print("[python_exec] " + note, file=sys.stderr)
    return rc


raise SystemExit(_firepool_exec())
'''

# One operation on the session's workspace; the answer is one JSON line after RESULT_MARK on stdout.
FILES = r'''
import base64, json, os, shutil, subprocess, sys
ws = os.environ.get("FIREPOOL_WORKSPACE") or os.environ.get("HOME") or "."
op = sys.argv[1]
args = json.loads("".join(sys.argv[2:]))
def resolve(p):
    return os.path.normpath(os.path.join(ws, p))
def answer(obj, rc=0):
    sys.stdout.write("\x1efirepool-result " + json.dumps(obj) + "\n")
    sys.exit(rc)
def fail(kind, message):
    answer({"error": kind, "message": message}, 0)
if op == "write":
    done = []
    for item in args["files"]:
        path = resolve(item["path"])
        data = base64.b64decode(item["base64"]) if "base64" in item else item["text"].encode()
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "wb") as f:
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


def python_exec(code: str) -> list[str]:
    return wrap(["python3", "-c", PYEXEC, code])


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
