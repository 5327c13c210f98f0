"""A kernel in a Firepool sandbox from a plain script: HTTP and one websocket to the broker, the caller's token,
nothing else (no jupyter_client, no ZeroMQ, no connection file, no Firepool package).

    python examples/gateway_kernel.py --url http://broker:8321 --token $FIREPOOL_TOKEN [--pool cpu] [CODE]

It lists the caller's kernelspecs, starts a kernel of the pool's (`POST /api/kernels`), sends one
execute_request over `/api/kernels/{id}/channels` in the legacy JSON form, prints what the kernel streams back
until it is idle again, and shuts the kernel down (`DELETE`). The SDK's `broker.kernel_client` does the same
with both websocket forms, interrupts, restarts and timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException


async def run(url: str, token: str, pool: str, code: str) -> int:
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=180) as http:
        specs = (await http.get("/api/kernelspecs")).raise_for_status().json()["kernelspecs"]
        name = f"firepool-{pool}"
        if name not in specs:
            print(f"gateway_kernel.py: no kernelspec {name} (no pool {pool!r}); the broker's: "
                  f"{', '.join(sorted(specs))}", file=sys.stderr)
            return 2
        kernel = (await http.post("/api/kernels", json={"name": name, "env": {}})).raise_for_status().json()
        try:
            ws_url = url.replace("http", "ws", 1) + f"/api/kernels/{kernel['id']}/channels"
            async with connect(ws_url, additional_headers=auth) as ws:
                msg_id, session = uuid.uuid4().hex, uuid.uuid4().hex
                header = {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
                          "username": "script", "version": "5.3"}
                await ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                                          "content": {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": False}}))
                status = "ok"
                while True:
                    msg = json.loads(await ws.recv())
                    if msg["parent_header"].get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "stream":
                        print(content["text"], end="")
                    elif kind == "execute_result":
                        print(content["data"].get("text/plain", ""))
                    elif kind == "error":
                        status = "error"
                        print(f"{content['ename']}: {content['evalue']}")
                    elif kind == "status" and content["execution_state"] == "idle":
                        break
        finally:
            await http.delete(f"/api/kernels/{kernel['id']}")
    return 0 if status == "ok" else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("FIREPOOL_URL", "http://127.0.0.1:8321"))
    parser.add_argument("--token", default=os.environ.get("FIREPOOL_TOKEN", ""))
    parser.add_argument("--pool", default="cpu")
    parser.add_argument("code", nargs="?", default="import os; print('hello from', os.environ['FIREPOOL_POD'])")
    args = parser.parse_args()
    return asyncio.run(run(args.url.rstrip("/"), args.token, args.pool, args.code))


def fail(text: str) -> int:
    """A missing broker, a refused token, an unknown pool: one line on stderr and exit 1."""
    print(f"gateway_kernel.py: {' '.join(text.split())}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    try:
        code = main()
    except httpx.HTTPStatusError as exc:
        code = fail(f"HTTP {exc.response.status_code} from {exc.request.url}: {exc.response.text[:200]}")
    except httpx.TransportError as exc:
        code = fail(f"cannot reach the broker at {exc.request.url.copy_with(path='/', query=None)} "
                    f"({exc or type(exc).__name__})")
    except (WebSocketException, OSError) as exc:
        code = fail(f"the kernel's websocket failed: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
