"""The Jupyter gateway API at the broker's root: what jupyter_server's GatewayClient (and any client with a
bearer token) calls. `jupyter lab --gateway-url=<broker> --GatewayClient.auth_token=<token>` is all a
notebook server needs; docs/jupyter.md has the recipe.

    GET    /api/kernelspecs                 one `firepool-<pool>` spec per pool the caller may use
    GET    /api/kernelspecs/{name}          one of them
    GET    /kernelspecs/{name}/{resource}   404 (no logos)
    GET    /api/kernels                     the caller's kernels
    POST   /api/kernels                     {"name", "env"}: start one (201), waits until it is up
    GET    /api/kernels/{id}                DELETE: shut down (204)
    POST   /api/kernels/{id}/interrupt      SIGINT to the kernel (204)
    POST   /api/kernels/{id}/restart        a new kernel in the same sandbox, same id (200)
    WS     /api/kernels/{id}/channels       the kernel's channels: `v1.kernel.websocket.jupyter.org` or legacy JSON

Auth: `Authorization: Bearer <token>` or `token <token>` (GatewayClient's default scheme). Owner-only:
another caller's kernel is a 404 like an unknown one. A websocket refused before its upgrade gets the
typed JSON error as its HTTP answer (or close code 1008 where the server cannot send one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import zmq.asyncio
from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.websockets import WebSocket

from broker.api.auth import TokenAuth
from broker.api.door import error_response
from broker.errors import FirepoolError, NotFound, Unauthorized
from broker.gateway.bridge import Bridge
from broker.gateway.kernels import SPEC_PREFIX, Connections, ControlPlane, GatewayKernels, GatewaySettings
from broker.gateway.wire import V1_PROTOCOL
from firepool_agent.limits import MAX_ENV_ENTRIES

CLOSE_POLICY = 1008
log = logging.getLogger("firepool.gateway")


class StartKernel(BaseModel):
    """POST /api/kernels: what GatewayClient sends (`name`, `env`), and JupyterLab's REST `path`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = Field(default=None, max_length=128, description="A kernelspec name; absent: the default.")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ENTRIES,
                                description="KERNEL_* and the broker's allowed client envs reach the kernel; "
                                "KERNEL_FIREPOOL_SESSION names its session, KERNEL_WORKING_DIR its cwd.")
    path: str | None = Field(default=None, max_length=4096, description="Accepted and ignored.")


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def normalise(authorization: str | None) -> str | None:
    """`token <t>` (GatewayClient's default scheme) is a bearer token."""
    if authorization is None:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    return f"Bearer {rest.strip()}" if scheme.lower() == "token" else authorization


async def identify(auth: TokenAuth, authorization: str | None) -> str:
    header = normalise(authorization)
    if header is not None and header.count(".") == 2:  # a JWT may fetch its issuer's keys
        return (await asyncio.to_thread(auth.identify, header)).caller
    return auth.identify(header).caller


async def gateway_caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    caller = await identify(request.app.state.auth, authorization)
    await request.app.state.gateway.kernels.adopt()
    return caller


Caller = Annotated[str, Depends(gateway_caller)]


def may_use(pool: Any, caller: str, limits: Mapping[str, Any]) -> bool:
    """A pool whose GPUs the caller's limits forbid (max_gpus 0, max_pods 0) is not offered."""
    mine = limits.get(caller, limits.get("default"))
    if mine is None:
        return True
    if getattr(mine, "max_pods", None) == 0:
        return False
    return not (getattr(pool, "gpus", 0) and getattr(mine, "max_gpus", None) == 0)


def kernelspec(name: str, pool: Any) -> dict[str, Any]:
    gpus = int(getattr(pool, "gpus", 0) or 0)
    hardware = f"{gpus}x {getattr(pool, 'accelerator', 'GPU')}" if gpus else "CPU"
    return {"name": f"{SPEC_PREFIX}{name}", "resources": {},
            "spec": {"argv": [], "display_name": f"Python (Firepool {name}, {hardware})", "language": "python",
                     "interrupt_mode": "signal", "env": {},
                     "metadata": {"firepool": {"pool": name, "gpus": gpus,
                                               "accelerator": getattr(pool, "accelerator", "cpu")}}}}


class Gateway:
    def __init__(self, cp: ControlPlane, connections: Connections, catalog: Callable[[], Any],
                 settings: GatewaySettings, live_jobs: Callable[[], list[Any]] = list) -> None:
        self.catalog = catalog
        """The broker's current catalog (a SIGHUP may replace it)."""
        self.settings = settings
        self._ctx: zmq.asyncio.Context | None = None
        self.kernels = GatewayKernels(cp, connections, lambda: catalog().pools, settings, lambda: self.ctx,
                                      live_jobs)

    @property
    def ctx(self) -> zmq.asyncio.Context:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        return self._ctx

    def specs(self, caller: str) -> dict[str, Any]:
        catalog = self.catalog()
        limits = getattr(catalog, "caller_limits", {}) or {}
        return {f"{SPEC_PREFIX}{n}": kernelspec(n, p) for n, p in catalog.pools.items()
                if may_use(p, caller, limits)}

    def default(self, specs: Mapping[str, Any]) -> str:
        return f"{SPEC_PREFIX}cpu" if f"{SPEC_PREFIX}cpu" in specs else next(iter(specs), "")

    async def close(self) -> None:
        """The broker stops: the kernels' jobs run on (as every job does) for the next broker to adopt."""
        await self.kernels.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)


def add_gateway_routes(app: FastAPI, gateway: Gateway, errors: dict[int | str, dict[str, Any]]) -> None:
    kernels = gateway.kernels

    @app.get("/api/kernelspecs", responses=errors, tags=["gateway"])
    async def list_specs(who: Caller) -> dict[str, Any]:
        specs = gateway.specs(who)
        return {"default": gateway.default(specs), "kernelspecs": specs}

    @app.get("/api/kernelspecs/{name}", responses=errors, tags=["gateway"])
    async def get_spec(name: str, who: Caller) -> dict[str, Any]:
        spec = gateway.specs(who).get(name)
        if spec is None:
            raise NotFound(f"no kernelspec {name[:80]!r}", {"kernelspec": name[:80]})
        return dict(spec)

    @app.get("/kernelspecs/{name}/{resource:path}", responses=errors, tags=["gateway"])
    async def spec_resource(name: str, resource: str, who: Caller) -> Response:
        raise NotFound(f"kernelspec {name[:80]!r} has no resource {resource[:80]!r}", {"resource": resource[:80]})

    @app.get("/api/kernels", responses=errors, tags=["gateway"])
    async def list_kernels(who: Caller) -> list[dict[str, Any]]:
        return [k.model() for k in kernels.of(who)]

    @app.post("/api/kernels", status_code=201, responses=errors, tags=["gateway"])
    async def start_kernel(who: Caller, body: StartKernel | None = None) -> JSONResponse:
        body = body or StartKernel()
        name = body.name or gateway.default(gateway.specs(who))
        if name not in gateway.specs(who):
            raise NotFound(f"no kernelspec {name[:80]!r} (GET /api/kernelspecs lists them)", {"kernelspec": name[:80]})
        k = await kernels.start(who, name, body.env)
        return JSONResponse(k.model(), status_code=201, headers={"Location": f"/api/kernels/{k.id}"})

    @app.get("/api/kernels/{kernel_id}", responses=errors, tags=["gateway"])
    async def get_kernel(kernel_id: str, who: Caller) -> dict[str, Any]:
        return kernels.get(who, kernel_id).model()

    @app.delete("/api/kernels/{kernel_id}", status_code=204, responses=errors, tags=["gateway"])
    async def shutdown_kernel(kernel_id: str, who: Caller) -> Response:
        await kernels.shutdown(who, kernel_id)
        return Response(status_code=204)

    @app.post("/api/kernels/{kernel_id}/interrupt", status_code=204, responses=errors, tags=["gateway"])
    async def interrupt_kernel(kernel_id: str, who: Caller, body: Empty | None = None) -> Response:
        await kernels.interrupt(who, kernel_id)
        return Response(status_code=204)

    @app.post("/api/kernels/{kernel_id}/restart", responses=errors, tags=["gateway"])
    async def restart_kernel(kernel_id: str, who: Caller, body: Empty | None = None) -> dict[str, Any]:
        return (await kernels.restart(who, kernel_id)).model()

    @app.websocket("/api/kernels/{kernel_id}/channels")
    async def channels(ws: WebSocket, kernel_id: str) -> None:
        try:
            who = await identify(ws.app.state.auth, ws.headers.get("authorization"))
            await kernels.adopt()
            k = kernels.get(who, kernel_id)
        except FirepoolError as exc:
            await refuse(ws, exc)
            return
        v1 = V1_PROTOCOL in ws.scope.get("subprotocols", ())
        await ws.accept(subprotocol=V1_PROTOCOL if v1 else None)
        try:
            await Bridge(k, gateway.ctx, ws, v1=v1, max_bytes=gateway.settings.max_message_bytes).run()
        except Exception as exc:  # noqa: BLE001 - a client gone mid-send, a kernel's socket closing
            log.info("kernel %s: websocket ended: %r", kernel_id, exc)


async def refuse(ws: WebSocket, exc: FirepoolError) -> None:
    """The typed error as the upgrade's HTTP answer where the server can send one, else close 1008."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(error_response(exc))
        return
    reason = "unauthorized" if isinstance(exc, Unauthorized) else exc.error_class
    await ws.close(code=CLOSE_POLICY, reason=reason)
