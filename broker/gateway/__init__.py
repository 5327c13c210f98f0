"""The broker's kernel door: Jupyter kernels of sandboxes reached over the broker's own HTTP port.

`kernels` keeps the gateway's kernels (one kernel job each, a stable id across restarts, per-caller limits,
culling); `bridge` carries one websocket's messages to and from the kernel's ZeroMQ sockets, signing and
checking them with the kernel's HMAC key; `wire` holds the framings (Jupyter's `v1.kernel.websocket.jupyter.org`
and the legacy JSON form); `routes` serves the REST and websocket API that jupyter_server's GatewayClient
speaks. The kernel's keys are learned through `broker.running.kernelconns` and never leave the broker.
"""
