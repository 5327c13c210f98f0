"""Routes of the REST API `/v1`, `/healthz` and `/metrics`, with one error shape for every failure."""

from __future__ import annotations

import asyncio
import datetime
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from broker import __version__
from broker.api import door, openrequests
from broker.api.access import Part, readable_job
from broker.api.auth import Identity, TokenAuth
from broker.api.batch_routes import add_batch_routes
from broker.api.command_routes import add_command_routes
from broker.api.e2b.layer import E2BLayer
from broker.api.exposure import Exposure
from broker.api.health_routes import add_health_routes
from broker.api.leading import LeaderGate, Leadership
from broker.api.longpoll import wait_job
from broker.api.metrics import registry_for, render
from broker.api.package_routes import add_package_routes
from broker.api.port_routes import add_port_routes
from broker.api.portlinks import PortSettings
from broker.api.portproxy import PortProxy
from broker.api.schemas import ErrorView, JobRequest, JobView, KernelView, SignalRequest, job_view
from broker.api.terminal_routes import add_terminal_routes
from broker.control import ControlPlane
from broker.errors import FirepoolError, Forbidden, InvalidRequest, UnknownField
from broker.events import caller_view
from broker.gateway.kernels import GatewaySettings
from broker.gateway.routes import Gateway, add_gateway_routes
from broker.jobs import JobState
from broker.ports.logs import STREAMS
from broker.ports.ui_sessions import MemorySessionStore, UiSessionStore
from broker.ui import mount_ui
from broker.ui.session import SessionSettings
from broker.warmth.poolview import caller_pool_view
from firepool_agent.limits import MAX_LOG_OFFSET

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorView}, 403: {"model": ErrorView}, 404: {"model": ErrorView}, 422: {"model": ErrorView},
    400: {"model": ErrorView},
    "default": {"model": ErrorView, "description": "Any other failure (405, 409, 410, 413, 415, 429, 5xx), "
                "in the same error shape"},
}
TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}
_ERROR_JSON = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorView"}}}
TEXT_ROUTE_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"content": _ERROR_JSON, "description": spec.get("description", "Error")} for code, spec in ERRORS.items()}
"""ERRORS for a route whose success is text: its errors are still JSON (a `model` would say text/plain)."""


def _error_response(exc: FirepoolError) -> JSONResponse:
    return door.error_response(exc)


def _validation_error(exc: RequestValidationError) -> FirepoolError:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "extra_forbidden":
            loc = [str(p) for p in err.get("loc", ()) if p != "body"]
            field = ".".join(loc)
            return UnknownField(f"unknown field {field!r}", {"field": field, **_item(err)})
    for err in errors:
        if err.get("type") == "json_invalid":  # loc ("body", offset): the body never parsed, so no field is to blame
            place = tuple(err.get("loc", ()))
            at = place[1] if len(place) > 1 and isinstance(place[1], int) else None
            why = (err.get("ctx") or {}).get("error", "")
            where = f" at character {at}" if at is not None else ""
            return InvalidRequest(f"the request body is not valid JSON{where}" + (f": {why}" if why else ""),
                                  {"field": "body", **({"offset": at} if at is not None else {})})
    details = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"), "problem": e.get("msg", "")}
               for e in errors]
    first = details[0] if details else {"field": "", "problem": "invalid request"}
    return InvalidRequest(f"{first['field'] or 'body'}: {first['problem']}",
                          {"field": first["field"] or "body", "errors": details, **(_item(errors[0]) if errors else {})})


def _item(err: Any) -> dict[str, int]:
    """A batch item's index (`POST /v1/jobs:batch`: loc body.jobs.<i>...), as the batch's own errors name it."""
    loc = tuple(err.get("loc", ()))
    return {"index": loc[2]} if len(loc) > 2 and loc[:2] == ("body", "jobs") and isinstance(loc[2], int) else {}


WAIT_ON_SUBMIT = ("Answer once the job is terminal or this many seconds passed (as GET /v1/jobs/{id}?wait_s=): "
                  "submit and wait in one request. The job is stored before the wait begins.")

MAX_EVENT_ID = 2**31 - 1
"""Largest event id `since` may name (the events table's 32-bit id); any bigger one means the same."""


def parse_since(since: str | None) -> tuple[int | None, float | None]:
    """`since` of GET /v1/events: (after this id, at or after this time)."""
    if since is None or since == "":
        return None, None
    if since.isascii() and since.isdigit():
        return min(int(since), MAX_EVENT_ID), None  # past every id there is: nothing yet
    try:
        at = float(since)
    except ValueError:
        pass
    else:
        if not math.isfinite(at):
            raise InvalidRequest("since must be a finite time", {"field": "since"})
        return None, at
    try:
        when = datetime.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest("since must be an event id, epoch seconds (with a decimal point) or an ISO 8601 time",
                             {"field": "since"}) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return None, when.timestamp()


async def current_caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The verified caller of the request's bearer token."""
    return (await current_identity(request, authorization)).caller


async def current_identity(request: Request, authorization: Annotated[str | None, Header()] = None) -> Identity:
    """The verified caller of the request's bearer token, with its admin mark.

    Async, so FastAPI runs it on the event loop: a static token is one hash and a table scan, far cheaper than
    the worker-thread hop FastAPI gives a sync dependency (py-spy: ~10 % of the broker's CPU under load).
    A JWT may fetch its issuer's keys, so it is verified on a worker thread.
    """
    auth: TokenAuth = request.app.state.auth
    if authorization is not None and authorization.count(".") == 2:
        return await asyncio.to_thread(auth.identify, authorization)
    return auth.identify(authorization)


Caller = Annotated[str, Depends(current_caller)]
Who = Annotated[Identity, Depends(current_identity)]


def create_app(cp: ControlPlane, auth: TokenAuth, *, metrics_caller_labels: bool = False,
               max_request_bytes: int = door.DEFAULT_MAX_REQUEST_BYTES, exposure: Exposure = Exposure(),
               ui_sessions: UiSessionStore | None = None, ui_session_settings: SessionSettings | None = None,
               ports: PortSettings | None = None, gateway_settings: GatewaySettings | None = None,
               leadership: Leadership | None = None, max_open_requests: int = openrequests.DEFAULT_LIMIT) -> FastAPI:
    """The broker's ASGI app; `leadership` (default: a broker that always leads) gates a standby's routes."""
    leadership = leadership or Leadership()
    app = FastAPI(title="Firepool", version=__version__,
                  description="A broker of warm, isolated GPU sandboxes for agentic and RL workloads.")
    door.install(app, max_request_bytes)
    registry = registry_for(cp, caller_labels=metrics_caller_labels)
    app.state.auth = auth

    @app.exception_handler(FirepoolError)
    async def firepool_error(_: Request, exc: FirepoolError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(exc))

    @app.get("/healthz", responses=ERRORS)
    async def healthz() -> dict[str, Any]:
        return {"ok": cp.dispatching_at is not None, "version": __version__, "backend": cp.backend.kind,
                "isolated": cp.backend_isolated, "isolation": "sandbox" if cp.backend_isolated else "none",
                "limits": cp.backend_limits, "pools": sorted(cp.catalog.pools), "transport": exposure.transport,
                "role": leadership.role, "term": leadership.current_term}

    @app.get("/readyz", responses=ERRORS)
    async def readyz() -> JSONResponse:
        """200 on the leader once it dispatches, else 503 (a readiness probe: only the leader takes traffic)."""
        if leadership.leading and cp.dispatching_at is not None:
            return JSONResponse({"role": "leader", "term": leadership.term.value})
        return _error_response(leadership.refusal())

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: TEXT, **TEXT_ROUTE_ERRORS})
    async def metrics(who: Who) -> Response:
        if not who.admin:  # pool-wide figures: an operator's view (docs/security.md)
            raise Forbidden("/metrics is for callers marked admin in the tokens file")
        return Response(render(registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/whoami", responses=ERRORS)
    async def whoami(who: Caller) -> dict[str, str]:
        return {"caller": who}

    @app.post("/v1/jobs", status_code=201, responses={201: {"model": JobView}, 200: {"model": JobView}, **ERRORS})
    async def submit(body: JobRequest, who: Caller, request: Request,
                     wait_s: Annotated[float, Query(ge=0, le=300, description=WAIT_ON_SUBMIT)] = 0.0) -> JSONResponse:
        job, created = await cp.submit(who, body.to_spec())
        if wait_s > 0 and not job.terminal:
            job = await wait_job(request, partial(cp.wait, who, job.id), wait_s) or job
        return JSONResponse(job_view(job, cp.waiting_reason(job.id)), status_code=201 if created else 200)

    @app.get("/v1/jobs", responses=ERRORS)
    async def list_jobs(who: Who, state: Annotated[list[JobState] | None, Query()] = None,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                        before: str | None = None, caller: str | None = None) -> dict[str, Any]:
        if who.admin:  # an operator lists every caller's jobs, or one caller's with ?caller=
            states = list(state) if state is not None else None
            jobs = await cp.book.io(lambda: cp.store.list_jobs(caller=caller, states=states, limit=limit,
                                                               before=before))
        elif caller is not None and caller != who.caller:
            raise Forbidden("only admin callers list another caller's jobs", {"field": "caller"})
        else:
            jobs = await cp.list_jobs(who.caller, states=state, limit=limit, before=before)
        return {"jobs": [job_view(j, cp.waiting_reason(j.id)) for j in jobs],
                "next": jobs[-1].id if len(jobs) == limit else None}

    @app.get("/v1/jobs/{job_id}", responses={200: {"model": JobView}, **ERRORS})
    async def get_job(job_id: str, who: Caller, request: Request,
                      wait_s: Annotated[float, Query(ge=0, le=300)] = 0.0) -> JSONResponse:
        waited = await wait_job(request, partial(cp.wait, who, job_id), wait_s) if wait_s > 0 else None
        job = waited or await cp.get(who, job_id)
        return JSONResponse(job_view(job, cp.waiting_reason(job.id)))

    @app.post("/v1/jobs/{job_id}/cancel", responses={200: {"model": JobView}, **ERRORS})
    async def cancel(job_id: str, who: Caller) -> JSONResponse:
        job = await cp.cancel(who, job_id)
        return JSONResponse(job_view(job))

    @app.post("/v1/jobs/{job_id}/signal", responses={200: {"model": JobView}, **ERRORS})
    async def signal(job_id: str, body: SignalRequest, who: Caller) -> JSONResponse:
        job = await cp.signal(who, job_id, body.signal)
        return JSONResponse(job_view(job))

    @app.get("/v1/jobs/{job_id}/kernel", responses={200: {"model": KernelView}, **ERRORS})
    async def kernel(job_id: str, who: Who, wait_s: Annotated[float, Query(ge=0, le=300)] = 0.0) -> JSONResponse:
        """A kernel job's connection info (address, ports, HMAC key, CurveZMQ keys), for its owner only: 404
        for anyone else, admins included; 409 KernelNotReady (retryable) until the kernel is up, or after
        `wait_s` seconds of waiting for it; 409 KernelEnded once the job ended."""
        job = await readable_job(cp.book, who, job_id, Part.OUTPUT)
        info = await cp.connections.connection(job, wait_s)
        return JSONResponse({"job": job.id, "connection": info}, headers={"Cache-Control": "no-store"})

    @app.get("/v1/jobs/{job_id}/logs", response_class=PlainTextResponse, responses={200: TEXT, **TEXT_ROUTE_ERRORS})
    async def logs(job_id: str, who: Who, stream: str = "combined", follow: bool = True,
                   attempt: Annotated[int | None, Query(ge=0, le=1 << 31)] = None,
                   offset: Annotated[int, Query(ge=0, le=MAX_LOG_OFFSET)] = 0) -> StreamingResponse:
        if stream not in STREAMS:
            raise InvalidRequest(f"stream must be one of {', '.join(STREAMS)}", {"field": "stream"})
        owner = (await readable_job(cp.book, who, job_id, Part.OUTPUT)).caller  # the owner alone (access.py)
        first = await cp.read_log(owner, job_id, stream=stream, offset=offset, attempt=attempt,
                                  wait_s=0.0)

        async def body() -> AsyncIterator[bytes]:
            chunk = first
            while True:
                if chunk.data:
                    yield chunk.data
                if chunk.complete:
                    return
                if not chunk.data:
                    if not follow:
                        return
                    await asyncio.sleep(0.05)  # reads from the store do not block; the agent's do
                try:
                    chunk = await cp.read_log(owner, job_id, stream=stream, offset=chunk.next_offset,
                                              attempt=attempt, wait_s=5.0 if follow else 0.0)
                except FirepoolError:
                    return

        return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                                 headers={"X-Job-Id": job_id})

    @app.delete("/v1/sessions/{tag}", responses=ERRORS)
    async def end_session(tag: str, who: Caller, queue: str = "default") -> dict[str, Any]:
        return await cp.end_session(who, tag, queue)

    @app.get("/v1/pools", responses=ERRORS)
    async def pools(who: Who) -> dict[str, Any]:
        views = cp.pools_view()
        body: dict[str, Any] = {"pools": views if who.admin else [caller_pool_view(v, who.caller) for v in views],
                                "fleet": cp.fleet_view()}
        if who.admin:  # team quotas (docs/quotas.md): GPUs held in quota per node and on loan per team
            body["quotas"] = cp.tracker.quota_view() if cp.quota_tree is not None else None
        return body

    @app.get("/v1/pods", responses=ERRORS)
    async def pods(who: Who, pool: str | None = None) -> dict[str, Any]:
        views = cp.pods_view(pool)
        # A caller sees its own pods only: another's names, sessions (tags) and jobs are not its business.
        return {"pods": views if who.admin else [v for v in views if v["caller"] == who.caller],
                "isolated": cp.backend_isolated, "isolation": "sandbox" if cp.backend_isolated else "none"}

    @app.get("/v1/events", responses=ERRORS)
    async def events(who: Who, since: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Fleet events oldest first (docs/quotas.md): `since` is an event id (digits: those after it) or a time
        (epoch seconds with a decimal point, or ISO 8601: those at or after it). A caller sees its own."""
        after_id, at = parse_since(since)
        found = await cp.list_events(None if who.admin else who.caller, after_id=after_id, since=at, limit=limit)
        return {"events": [e.to_json() if who.admin else caller_view(e) for e in found],
                "next": found[-1].id if found else after_id}

    add_batch_routes(app, cp, current_caller, ERRORS, cp.clock.now)  # a fan-out in one request, its results streamed
    add_command_routes(app, cp, cp.book.wait_change, current_caller, ERRORS)  # a session's command, streamed
    add_package_routes(app, cp, current_caller, {**ERRORS, 413: {"model": ErrorView}})
    settings = ui_session_settings or SessionSettings()
    settings = replace(settings, secure=settings.secure or exposure.secure_cookies)
    mount_ui(app, cp, auth, ui_sessions or MemorySessionStore(), settings)  # the dashboard at /ui/ (docs/dashboard.md)
    add_health_routes(app, cp, current_identity, ERRORS)
    app.state.gateway = Gateway(cp, cp.connections, lambda: cp.catalog, gateway_settings or GatewaySettings(),
                                lambda: list(cp.book.live.values()))
    add_gateway_routes(app, app.state.gateway, ERRORS)  # the Jupyter gateway at /api/ (broker.gateway)
    add_terminal_routes(app, cp, auth)  # a websocket: the owner's shell in a session sandbox
    port_settings = ports or PortSettings()
    add_port_routes(app, cp.streams, auth, port_settings, ERRORS)
    # Outermost: a session port's requests and websockets never meet the door's JSON checks (docs/ports.md).
    app.add_middleware(PortProxy, streams=cp.streams, auth=auth, settings=port_settings, ui=settings)
    # Outermost too: the E2B SDKs' control plane and envd (multipart, connect+json) under /e2b (docs/e2b.md).
    app.add_middleware(E2BLayer, cp=cp, gateway=app.state.gateway, auth=auth, port_domain=port_settings.domain)
    app.add_middleware(LeaderGate, leadership=leadership)  # a standby serves only its role
    app.add_middleware(openrequests.OpenRequests, limit=max_open_requests)  # outermost of all: counts everything
    return app
