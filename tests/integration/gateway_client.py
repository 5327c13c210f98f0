"""A client of the broker's Jupyter gateway that speaks only HTTP and websocket to the broker (no
jupyter_client, no kernel key): the tests' way in, in both websocket framings."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import websocket

from broker.gateway.wire import V1_PROTOCOL, decode_v1, encode_v1


class Channels:
    """One websocket to `/api/kernels/{id}/channels`; `v1` picks the binary subprotocol."""

    def __init__(self, base_url: str, kernel_id: str, token: str, *, v1: bool = False, scheme: str = "Bearer",
                 timeout: float = 60.0, quickack: bool = False) -> None:
        url = base_url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
        self.v1 = v1
        self.ws = websocket.create_connection(url, header=[f"Authorization: {scheme} {token}"], timeout=timeout,
                                              subprotocols=[V1_PROTOCOL] if v1 else None)
        self.session = uuid.uuid4().hex
        self.quickack = quickack
        """Set TCP_QUICKACK before each read, as the issue's measurement did: a sender's Nagle then never
        waits on this client's delayed ACK, so what remains is what the hops themselves add."""

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": "t", "session": self.session, "msg_type": msg_type,
                  "version": "5.3", "date": ""}
        if self.v1:
            parts = [json.dumps(p).encode() for p in (header, {}, {}, content)]
            self.ws.send_binary(encode_v1(channel, parts))
        else:
            self.ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                     "channel": channel}))
        return msg_id

    def recv(self) -> dict[str, Any]:
        if self.quickack:
            self.ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        opcode, data = self.ws.recv_data()
        if self.v1:
            channel, parts = decode_v1(data)
            header, parent, metadata, content = (json.loads(p) for p in parts[:4])
            return {"channel": channel, "header": header, "parent_header": parent, "metadata": metadata,
                    "content": content, "msg_type": header["msg_type"]}
        return dict(json.loads(data))

    def execute(self, code: str, timeout: float = 60.0) -> tuple[str, dict[str, Any]]:
        """Run `code`; (its stdout and results as text, its execute_reply content)."""
        msg_id = self.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        out: list[str] = []
        reply: dict[str, Any] | None = None
        idle = False
        deadline = time.monotonic() + timeout
        while not (idle and reply is not None):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer to {code!r} within {timeout} s")
            m = self.recv()
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                out.append(m["content"]["text"])
            elif m["msg_type"] in ("execute_result", "error"):
                out.append(m["content"].get("data", {}).get("text/plain", "") or m["content"].get("ename", ""))
            elif m["msg_type"] == "execute_reply":
                reply = m["content"]
            elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        return "".join(out), reply

    def close(self) -> None:
        self.ws.close()
