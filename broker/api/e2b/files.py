"""envd's files: `GET/POST /files` (raw bytes) and the `filesystem.Filesystem` RPCs, run in the sandbox.

Each operation is one process the pod agent starts beside the holding job (`run_collected`), in the
workspace, which is the sandbox's home: relative paths resolve there, as commands start there. Bytes travel
raw: a read is `cat`, a write is `cat >` fed on stdin (the parent directories made first). The metadata
operations run a small Python helper that answers one JSON line (EntryInfo in envd's JSON form).
"""

from __future__ import annotations

import email.parser
import json
from collections.abc import Awaitable, Callable
from typing import Any

from broker.api.e2b.connect import RpcError, field
from broker.api.e2b.http import HttpError
from broker.api.e2b.sandboxes import Sandbox

MAX_FILE_BYTES = 64 << 20
"""The largest file `GET /files` answers (held whole in the broker; the runner collects one byte more)."""
Runner = Callable[[Sandbox, list[str], bytes | None], Awaitable[tuple[int, bytes, bytes]]]

WRITE = ('d=$(dirname -- "$1") && mkdir -p -- "$d" && cat > "$1" && cd -- "$d" && pwd -P')

HELPER = r'''
import datetime, grp, json, os, pwd, shutil, stat, sys
op, a = sys.argv[1], json.loads(sys.argv[2])
def done(obj):
    sys.stdout.write(json.dumps(obj)); sys.exit(0)
def fail(code, message):
    done({"error": code, "message": message})
def full(p):
    return os.path.abspath(os.path.expanduser(p or "."))
def name_of(f, i):
    try:
        return f(i)
    except (KeyError, OverflowError):
        return str(i)
def entry(p):
    st = os.lstat(p)
    kind = "FILE_TYPE_SYMLINK" if stat.S_ISLNK(st.st_mode) else "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(st.st_mode) \
        else "FILE_TYPE_FILE"
    e = {"name": os.path.basename(p) or p, "type": kind, "path": p, "size": str(st.st_size),
         "mode": st.st_mode & 0o7777, "permissions": stat.filemode(st.st_mode),
         "owner": name_of(lambda u: pwd.getpwuid(u).pw_name, st.st_uid),
         "group": name_of(lambda g: grp.getgrgid(g).gr_name, st.st_gid),
         "modifiedTime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat()
         .replace("+00:00", "Z")}
    if kind == "FILE_TYPE_SYMLINK":
        e["symlinkTarget"] = os.readlink(p)
        e["isSymlink"] = True
    return e
try:
    if op == "stat":
        done({"entry": entry(full(a["path"]))})
    elif op == "list":
        top, depth, out = full(a["path"]), max(1, int(a.get("depth") or 1)), []
        if not os.path.isdir(top):
            os.lstat(top)
            fail("invalid_argument", f"{a['path']} is not a directory")
        def walk(d, level):
            for name in sorted(os.listdir(d)):
                p = os.path.join(d, name)
                try:
                    out.append(entry(p))
                except OSError:
                    continue
                if level < depth and os.path.isdir(p) and not os.path.islink(p):
                    walk(p, level + 1)
        walk(top, 1)
        done({"entries": out})
    elif op == "mkdir":
        p = full(a["path"])
        if os.path.lexists(p):
            fail("already_exists", f"{a['path']} already exists")
        os.makedirs(p)
        done({"entry": entry(p)})
    elif op == "move":
        src, dst = full(a["source"]), full(a["destination"])
        os.lstat(src)
        os.makedirs(os.path.dirname(dst) or "/", exist_ok=True)
        os.rename(src, dst)
        done({"entry": entry(dst)})
    elif op == "remove":
        p = full(a["path"])
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
        done({})
    fail("unimplemented", op)
except FileNotFoundError as exc:
    fail("not_found", f"{exc.filename or ''}: no such file or directory")
except PermissionError as exc:
    fail("permission_denied", f"{exc.filename or ''}: permission denied")
except OSError as exc:
    fail("invalid_argument", f"{exc.filename or ''}: {exc.strerror or exc}")
'''

OPS = {"Stat": ("stat", ("path",)), "ListDir": ("list", ("path", "depth")), "MakeDir": ("mkdir", ("path",)),
       "Move": ("move", ("source", "destination")), "Remove": ("remove", ("path",))}


class Files:
    def __init__(self, run: Runner) -> None:
        self.run = run

    async def rpc(self, sbx: Sandbox, method: str, req: dict[str, Any]) -> dict[str, Any]:
        if method not in OPS:
            raise RpcError("unimplemented", f"filesystem.Filesystem/{method} is not supported by Firepool")
        op, names = OPS[method]
        args = {name: field(req, name) for name in names}
        for name in names:
            if name != "depth" and (not isinstance(args[name], str) or not args[name]):
                raise RpcError("invalid_argument", f"{name} is required")
        code, out, err = await self.run(sbx, ["python3", "-I", "-S", "-c", HELPER, op, json.dumps(args)], None)
        try:
            answer = json.loads(out)
        except ValueError:
            raise RpcError("internal", f"the file helper failed ({code}): {err[-300:].decode(errors='replace')}") \
                from None
        if not isinstance(answer, dict):
            raise RpcError("internal", "the file helper answered no object")
        if "error" in answer:
            raise RpcError(str(answer["error"]), str(answer.get("message", "")))
        return answer

    async def read(self, sbx: Sandbox, path: str) -> bytes:
        code, out, err = await self.run(sbx, ["cat", "--", path], None)
        if code != 0:
            text = err.decode(errors="replace").strip()
            status = 404 if "No such file" in text else 400 if "Is a directory" in text else \
                403 if "Permission denied" in text else 500
            raise HttpError(status, text[-300:] or f"cannot read {path}")
        if len(out) > MAX_FILE_BYTES:
            raise HttpError(413, f"{path} is larger than the {MAX_FILE_BYTES} bytes a read through the broker "
                                 "holds: read it in parts with a command (head -c / tail -c)")
        return out

    async def write(self, sbx: Sandbox, path: str, data: bytes) -> dict[str, str]:
        code, out, err = await self.run(sbx, ["sh", "-c", WRITE, "sh", path], data)
        if code != 0:
            text = err.decode(errors="replace").strip()
            raise HttpError(403 if "Permission denied" in text else 400, text[-300:] or f"cannot write {path}")
        name = path.rstrip("/").rsplit("/", 1)[-1]
        return {"name": name, "type": "file", "path": out.decode(errors="replace").strip().rstrip("/") + "/" + name}

    async def upload(self, sbx: Sandbox, query: dict[str, str], content_type: str, body: bytes) -> list[dict[str, str]]:
        if content_type.startswith("multipart/form-data"):
            message = email.parser.BytesParser().parsebytes(
                b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
            parts = message.get_payload() if message.is_multipart() else []
            if not isinstance(parts, list) or not parts:
                raise HttpError(400, "a multipart body with at least one `file` part is required")
            written = []
            for part in parts:
                if isinstance(part, str):
                    continue
                name = part.get_param("filename", header="content-disposition")
                dest = query.get("path") if len(parts) == 1 and query.get("path") else name
                if not isinstance(dest, str) or not dest:
                    raise HttpError(400, "each part needs a filename (the destination path), or ?path=")
                data = part.get_payload(decode=True)
                written.append(await self.write(sbx, dest, data if isinstance(data, bytes) else b""))
            return written
        if not query.get("path"):
            raise HttpError(400, "?path= is required")
        return [await self.write(sbx, query["path"], body)]
