"""What the MCP server runs inside a session's live kernel, besides the user's own code.

`SETUP` installs a private module `_firepool_mcp` in the kernel (never in the user's namespace): it
enters the workspace, puts install_packages' directory on the path, renders DataFrames as markdown,
runs the other tools' commands as subprocesses of the kernel (the kernel job holds the session's pod, so
a second job could not run there), and saves / restores the namespace the way the stateless runner it
replaced did: modules by name, functions and classes by source, values by pickle. A watchdog thread saves and ends an idle kernel whose MCP server went away.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

MODULE = "_firepool_mcp"
STATE_FILE = ".firepool/kernel-namespace.pkl"
"""Where an ended kernel's namespace is saved in the workspace (the server also keeps a copy)."""
MAX_INLINE_STATE = 32 << 20
"""A saved namespace up to this size also travels back to the server (the pod may be reclaimed)."""

HELPERS = r'''
import base64, codecs, importlib, inspect, json, linecache, os, pickle, signal, subprocess, sys, textwrap, threading
import time, types
from IPython import get_ipython  # not the builtin: that exists only while a cell runs (the watchdog runs between)

WS = "."
BASE_ENV = {}
STATE = ""
ACTIVE = {"busy": 0, "last": time.monotonic()}
HIDDEN = {"In", "Out", "get_ipython", "exit", "quit", "open"}
MAX_KEEP = 24 << 20
INLINE_LIMIT = [0]
last = None


class _J:
    """A value whose repr is JSON: how results come back through user_expressions."""
    def __init__(self, value):
        self.value = value
    def __repr__(self):
        return json.dumps(self.value)


def _pre(*_):
    ACTIVE["busy"] += 1
    ACTIVE["last"] = time.monotonic()


def _post(*_):
    ACTIVE["busy"] = max(0, ACTIVE["busy"] - 1)
    ACTIVE["last"] = time.monotonic()


def frame_markdown(df, max_rows=40):
    """A DataFrame as a markdown table (no tabulate needed), head and tail when long."""
    def cell(v):
        return str(v).replace("|", "\\|").replace("\n", " ")
    rows = list(df.itertuples(index=True, name=None))
    cut = len(rows) > max_rows
    if cut:
        rows = rows[:max_rows // 2] + [None] + rows[-(max_rows // 2):]
    names = [cell(df.index.name or "")] + [cell(c) for c in df.columns]
    out = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for r in rows:
        out.append("| " + " | ".join(["..."] * len(names)) + " |" if r is None else "| " + " | ".join(cell(v) for v in r) + " |")
    if cut:
        out.append(f"\n{len(df)} rows x {len(df.columns)} columns")
    return "\n".join(out)


def setup(ws, watchdog_s, inline_limit):
    global WS, STATE
    WS = ws
    INLINE_LIMIT[0] = inline_limit
    STATE = os.path.join(ws, ".firepool", "kernel-namespace.pkl")
    BASE_ENV.update(os.environ)
    BASE_ENV.pop("MPLBACKEND", None)  # the commands' wrapper picks its own (Agg)
    for d in ("outputs", ".firepool/site", ".firepool/mpl"):
        os.makedirs(os.path.join(ws, d), exist_ok=True)
    os.chdir(ws)
    site = os.path.join(ws, ".firepool", "site")
    if site not in sys.path:
        sys.path.insert(0, site)
    os.environ["MPLCONFIGDIR"] = os.path.join(ws, ".firepool", "mpl")
    if "matplotlib" not in sys.modules:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    ip = get_ipython()
    markdown = ip.display_formatter.formatters["text/markdown"]
    for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__ is "pandas" in pandas >= 2
        markdown.for_type_by_name(module, "DataFrame", frame_markdown)
    ip.events.register("pre_execute", _pre)
    ip.events.register("post_execute", _post)
    if watchdog_s:
        threading.Thread(target=_watchdog, args=(float(watchdog_s),), daemon=True, name="firepool-idle").start()


def _watchdog(limit):
    # Only for an MCP server that went away without ending this kernel: it would pin the pod forever.
    while True:
        time.sleep(min(5.0, limit / 4))
        if ACTIVE["busy"] == 0 and time.monotonic() - ACTIVE["last"] > limit:
            try:
                save(False)
            finally:
                os._exit(0)


def _feed(pipe, data):
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass  # it exited without reading all of it


def run(argv, env, timeout, stdin=None, live=False):
    """Run a tool's command as a subprocess in the workspace, in its own process group. `stdin`: base64 bytes
    fed to it; `live`: its output goes out as this cell's stream messages as it comes (and not in the result)."""
    full = dict(BASE_ENV)
    full.update(env or {})
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=WS, env=full, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if stdin:
        threading.Thread(target=_feed, args=(proc.stdin, base64.b64decode(stdin)), daemon=True).start()
    got = {"stdout": [bytearray(), 0], "stderr": [bytearray(), 0]}
    def pump(name, pipe):
        buf = got[name]
        out, text = getattr(sys, name), codecs.getincrementaldecoder("utf-8")("replace")
        for chunk in iter(lambda: pipe.read1(65536), b""):
            buf[1] += len(chunk)
            if live:
                out.write(text.decode(chunk))
                out.flush()
            elif len(buf[0]) < MAX_KEEP:
                buf[0] += chunk[:MAX_KEEP - len(buf[0])]
    threads = [threading.Thread(target=pump, args=(n, p), daemon=True)
               for n, p in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in threads:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for t in threads:
            t.join(5)
        importlib.invalidate_caches()  # install_packages may have added modules
    return _J({"exit_code": proc.returncode, "timed_out": timed_out, "duration_s": time.monotonic() - began,
               "stdout": got["stdout"][0].decode(errors="replace"), "stdout_bytes": got["stdout"][1],
               "stderr": got["stderr"][0].decode(errors="replace"), "stderr_bytes": got["stderr"][1]})


def _user_names(ns):
    hidden = set(get_ipython().user_ns_hidden) | HIDDEN
    return [n for n in list(ns) if not n.startswith("_") and n not in hidden]


def save(inline=True):
    """Pickle what can be: modules by name, functions and classes by source, values by pickle."""
    ns = get_ipython().user_ns
    keep = {"defs": {}, "modules": {}, "values": {}, "lost": []}
    for name in _user_names(ns):
        value = ns[name]
        try:
            if isinstance(value, types.ModuleType):
                keep["modules"][name] = value.__name__
            elif getattr(value, "__module__", None) == "__main__" and isinstance(value, (types.FunctionType, type)):
                keep["defs"][name] = textwrap.dedent(inspect.getsource(value))
            else:
                keep["values"][name] = pickle.dumps(value)
        except Exception:
            keep["lost"].append(name)
    blob = pickle.dumps(keep)
    with open(STATE + ".tmp", "wb") as f:
        f.write(blob)
    os.replace(STATE + ".tmp", STATE)
    kept = sorted([*keep["defs"], *keep["modules"], *keep["values"]])
    return _J({"kept": kept, "lost": sorted(keep["lost"]), "bytes": len(blob),
               "blob": base64.b64encode(blob).decode() if inline and len(blob) <= INLINE_LIMIT[0] else None})


def restore(blob_b64):
    """Bring back a saved namespace (the server's copy, else the workspace file); report what came back."""
    if blob_b64:
        data = base64.b64decode(blob_b64)
    elif os.path.exists(STATE):
        with open(STATE, "rb") as f:
            data = f.read()
    else:
        return _J({"restored": [], "lost": [], "found": False})
    saved = pickle.loads(data)
    ns = get_ipython().user_ns
    restored, lost = [], list(saved.get("lost", []))
    for name, mod in saved["modules"].items():
        try:
            ns[name] = importlib.import_module(mod)
            restored.append(name)
        except Exception:
            lost.append(name)
    for name, src in saved["defs"].items():
        filename = f"<restored {name}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # so a later save finds it
        try:
            exec(compile(src, filename, "exec"), ns)
            restored.append(name)
        except Exception:
            lost.append(name)
    for name, b in saved["values"].items():
        try:
            ns[name] = pickle.loads(b)
            restored.append(name)
        except Exception:
            lost.append(name)
    try:
        os.replace(STATE, STATE + ".restored")
    except OSError:
        pass
    return _J({"restored": sorted(restored), "lost": sorted(lost), "found": True})
'''


def setup_code(workspace_env: str, watchdog_s: float | None) -> str:
    """The silent cell that installs the helper module; it leaves no name in the user's namespace."""
    return (f"import sys as _fp_sys, types as _fp_types, os as _fp_os\n"
            f"_fp_m = _fp_types.ModuleType({MODULE!r})\n"
            f"exec(compile({HELPERS!r}, '<firepool-mcp>', 'exec'), _fp_m.__dict__)\n"
            f"_fp_sys.modules[{MODULE!r}] = _fp_m\n"
            f"_fp_m.setup(_fp_os.environ.get({workspace_env!r}) or _fp_os.environ.get('HOME') or _fp_os.getcwd(), "
            f"{watchdog_s!r}, {MAX_INLINE_STATE})\n"
            f"del _fp_sys, _fp_types, _fp_os, _fp_m\n")


LAST = f"__import__({MODULE!r}).last"
"""The user_expressions entry that fetches what the last helper call returned."""


def call(func: str, *args: object) -> str:
    """A silent cell calling one helper with JSON-literal arguments; its value is kept for `LAST`.
    (A cell, not a user expression: an interrupt then ends it like any cell, and the idle clock sees it.)"""
    argv = ", ".join(f"__import__('json').loads({json.dumps(a)!r})" for a in args)
    return f"__import__({MODULE!r}).last = __import__({MODULE!r}).{func}({argv})\n"


def run_call(argv: Sequence[str], env: dict[str, str] | None, timeout_s: float, stdin: bytes | None = None,
             live: bool = False) -> str:
    return call("run", list(argv), env or {}, timeout_s, base64.b64encode(stdin).decode() if stdin else None, live)
