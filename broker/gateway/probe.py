"""Is a kernel answering? A `kernel_info_request` on a fresh shell socket, signed with the kernel's key:
what a restart in place waits for before the bridges reconnect (a local Jupyter restart waits the same)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import zmq
import zmq.asyncio

from broker.gateway.wire import Signer, WireError

RESEND_S = 0.5


async def kernel_answers(ctx: zmq.asyncio.Context, conn: dict[str, Any], timeout_s: float) -> bool:
    signer = Signer(str(conn["key"]).encode())
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.RECONNECT_IVL, 10)  # the new kernel binds within ~0.1 s: retry the dial quickly
    if conn.get("curve_publickey") and conn.get("curve_secretkey"):
        public = str(conn["curve_publickey"]).encode()
        sock.curve_secretkey = str(conn["curve_secretkey"]).encode()
        sock.curve_publickey = public
        sock.curve_serverkey = public
    sock.connect(f"{conn.get('transport', 'tcp')}://{conn['ip']}:{int(conn['shell_port'])}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while loop.time() < deadline:
            msg_id = "firepool-probe-" + os.urandom(8).hex()
            header = {"msg_id": msg_id, "msg_type": "kernel_info_request", "username": "firepool-gateway",
                      "session": msg_id, "date": "", "version": "5.3"}
            await sock.send_multipart(signer.to_zmq([json.dumps(header).encode(), b"{}", b"{}", b"{}"]))
            until = min(deadline, loop.time() + RESEND_S)
            while (left := until - loop.time()) > 0:
                if not await sock.poll(int(left * 1000) + 1):
                    break
                try:
                    parts = signer.from_zmq(await sock.recv_multipart())
                except WireError:
                    continue
                if msg_id.encode() in parts[1]:
                    return True
        return False
    finally:
        sock.close(0)
