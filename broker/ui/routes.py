"""The dashboard's routes under `/ui/`: server-rendered pages, two SSE streams and the admin forms."""

from __future__ import annotations

import asyncio
import codecs
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape

from broker import __version__
from broker.api.access import Part, may_read, readable_job
from broker.api.auth import Identity
from broker.control import ControlPlane
from broker.errors import FirepoolError, Forbidden, NotFound, Unauthorized
from broker.jobs import TERMINAL, JobState
from broker.ui import actions, views
from broker.ui.live import TOPICS, Hub, Timeline, started_at
from broker.ui.session import Sessions, form
from broker.ui.templating import filters

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
KEEPALIVE_S = 15.0
FAVICON = files("broker.ui").joinpath("static", "favicon.svg")
"""Also answered at /favicon.ico: a browser asks there for any page that names no icon (the API's too)."""


class Dashboard:
    def __init__(self, cp: ControlPlane, sessions: Sessions, hub: Hub, timeline: Timeline) -> None:
        self.cp = cp
        self.sessions = sessions
        self.hub = hub
        self.timeline = timeline
        self.env = Environment(loader=PackageLoader("broker.ui", "templates"), autoescape=select_autoescape(),
                               trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(filters())
        self.env.globals["terminal"] = sorted(str(s) for s in TERMINAL)
        self.started = False

    def start(self) -> None:
        """Start the timeline sampler and the snapshot hub (supervised; idempotent)."""
        if self.started:
            return
        self.started = True
        self.cp.tasks.spawn("dashboard timeline", self.timeline.run())
        self.cp.tasks.spawn("dashboard hub", self.hub.run())

    def render(self, request: Request, name: str, who: Identity | None, status: int = 200,
               **context: Any) -> HTMLResponse:
        template = self.env.get_template(name)
        context.setdefault("now", self.cp.clock.now())
        html = template.render(who=who, csrf=self.sessions.csrf(request) if who else "", version=__version__,
                               path=request.url.path, notice=request.query_params.get("notice"), **context)
        return HTMLResponse(html, status_code=status, headers=_headers())

    def login(self, request: Request, problem: str | None = None, status: int = 401) -> HTMLResponse:
        return self.render(request, "login.html", None, status=status, problem=problem,
                           next=request.url.path if request.url.path.startswith("/ui") else "/ui/")


def _headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-store"}


def _back(to: str, notice: str) -> RedirectResponse:
    target = to if to.startswith("/ui/") and "//" not in to else "/ui/"
    sep = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{sep}{urlencode({'notice': notice})}", status_code=303)


Page = Callable[[Request, Identity], Awaitable[Response]]


def add_ui_routes(app: FastAPI, cp: ControlPlane, sessions: Sessions) -> Dashboard:
    hub = Hub(cp, cp.clock)
    timeline = Timeline(cp.pools_view, cp.clock)
    ui = Dashboard(cp, sessions, hub, timeline)
    app.state.ui = ui
    router = APIRouter(prefix="/ui", include_in_schema=False)

    def page(fn: Page) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            ui.start()
            who = await sessions.identity(request)
            if who is None:
                return ui.login(request, status=200 if request.url.path == "/ui/" else 401)
            try:
                return await fn(request, who)
            except NotFound as exc:
                return ui.render(request, "error.html", who, status=404, title="Not found", message=str(exc))
            except FirepoolError as exc:
                return ui.render(request, "error.html", who, status=exc.status, title=exc.error_class,
                                 message=str(exc))
        handler.__name__ = fn.__name__
        return handler

    async def pools_page(request: Request, who: Identity) -> Response:
        held = views.held_pods(cp, who)
        return ui.render(request, "pools.html", who, title="Pools", live="pools", pools=views.pools(cp, who),
                         held=held, timeline={p: timeline.series(p) for p in cp.catalog.pools})

    async def jobs_list(request: Request, who: Identity) -> Response:
        q = request.query_params
        state = q.get("state", "")
        f = views.JobFilter(state=JobState(state) if state in JobState._value2member_map_ else None,
                            caller=q.get("caller") or None, pool=q.get("pool") or None, tag=q.get("tag") or None,
                            path=q.get("path") or None)
        before = q.get("before") or None
        rows, cursor = await views.jobs_page(cp, who, f, before)
        return ui.render(request, "jobs.html", who, title="Jobs", live="jobs", rows=rows, f=f, before=before,
                         next_url="/ui/jobs?" + urlencode({**f.query(), "before": cursor}) if cursor else None,
                         states=list(JobState), paths=views.PATHS, pools=sorted(cp.catalog.pools),
                         back=request.url.path + (f"?{request.url.query}" if request.url.query else ""))

    async def job_page(request: Request, who: Identity) -> Response:
        job_id = request.path_params["job_id"]
        j = await readable_job(cp.book, who, job_id, Part.METADATA)
        return ui.render(request, "job.html", who, title=f"Job {j.id}", live="jobs", job=views.job_detail(cp, j),
                         output=may_read(who, j.caller, Part.OUTPUT), started=started_at(j.timings))

    async def sessions_page(request: Request, who: Identity) -> Response:
        groups = views.sessions(cp, who)
        await asyncio.to_thread(views.workspace_sizes, cp, groups)
        return ui.render(request, "sessions.html", who, title="Sessions", live="pods", sessions=groups,
                         now=cp.clock.now())

    async def pods_page(request: Request, who: Identity) -> Response:
        q = request.query_params
        try:
            n = max(0, int(q.get("page", "0")))
        except ValueError:
            n = 0
        pool, state = q.get("pool") or None, q.get("state") or None
        rows, total = views.pods_page(cp, who, pool, state, n)
        base = {k: v for k, v in (("pool", pool), ("state", state)) if v}
        pages = (total + views.PODS_PAGE - 1) // views.PODS_PAGE
        return ui.render(request, "pods.html", who, title="Pods", live="pods", rows=rows, total=total, page=n,
                         pages=pages, base=base, pool=pool, state=state, pools=sorted(cp.catalog.pools),
                         prev_url="/ui/pods?" + urlencode({**base, "page": n - 1}) if n > 0 else None,
                         next_url="/ui/pods?" + urlencode({**base, "page": n + 1}) if n + 1 < pages else None,
                         isolated=cp.backend_isolated, now=cp.clock.now())

    async def latency_page(request: Request, who: Identity) -> Response:
        return ui.render(request, "latency.html", who, title="Latency", live=None, lat=await views.latency(cp, who))

    async def terminal_page(request: Request, who: Identity) -> Response:
        tag, queue = request.path_params["tag"], request.query_params.get("queue") or "default"
        cp.streams.pod(who.caller, tag, queue)  # only the caller's own live session: anything else is the 404
        nonce = secrets.token_urlsafe(18)
        response = ui.render(request, "terminal.html", who, title=f"Terminal: {tag}", live=None, tag=tag,
                             queue=queue, nonce=nonce)
        # xterm.js adds <style> elements: admitted by this response's nonce, scripts still 'self' only.
        response.headers["Content-Security-Policy"] = CSP.replace("style-src 'self'", f"style-src 'self' 'nonce-{nonce}'")
        return response

    for path, fn in (("/", pools_page), ("/jobs", jobs_list), ("/jobs/{job_id}", job_page),
                     ("/sessions", sessions_page), ("/sessions/{tag}/terminal", terminal_page),
                     ("/pods", pods_page), ("/latency", latency_page)):
        router.add_api_route(path, page(fn), methods=["GET"], response_class=HTMLResponse)

    @router.post("/login")
    async def login(request: Request) -> Response:
        fields = await form(request)
        nxt = fields.get("next", "/ui/")
        response = RedirectResponse(nxt if nxt.startswith("/ui/") and "//" not in nxt else "/ui/", status_code=303)
        try:
            await sessions.sign_in(response, request, fields.get("token", ""))
        except Unauthorized:
            return ui.login(request, "That token is not known to this broker.")
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        sessions.check_csrf(request, (await form(request)).get("csrf"))
        response = RedirectResponse("/ui/", status_code=303)
        await sessions.sign_out(request, response)
        return response

    async def owner_form(request: Request) -> tuple[Identity, dict[str, str]]:
        """A signed-in caller's form: this broker's Origin (`form`), then the session's CSRF token."""
        who = await sessions.identity(request)
        if who is None:
            raise Unauthorized("sign in first")
        fields = await form(request)
        sessions.check_csrf(request, fields.get("csrf"))
        return who, fields

    async def admin_form(request: Request) -> dict[str, str]:
        who, fields = await owner_form(request)
        if not who.admin:
            raise Forbidden("only callers marked admin in the tokens file may act from the dashboard")
        return fields

    @router.post("/admin/break-hold")
    async def break_hold(request: Request) -> Response:
        fields = await admin_form(request)
        done = actions.break_hold(cp, fields.get("pod", ""))
        return _back(fields.get("back", "/ui/"), f"Broke {done['owner']}'s hold on {done['pod']}")

    @router.post("/admin/retire-session")
    async def retire_session(request: Request) -> Response:
        fields = await admin_form(request)
        done = await actions.retire_session(cp, fields.get("caller", ""), fields.get("queue", "default"),
                                            fields.get("tag", ""))
        return _back(fields.get("back", "/ui/sessions"),
                     f"Retired session {done['tag']}: {len(done['retired_pods'])} pods now, "
                     f"{len(done['retiring_at_release'])} at release")

    @router.post("/admin/drain-pool")
    async def drain_pool(request: Request) -> Response:
        fields = await admin_form(request)
        done = actions.drain_pool(cp, fields.get("pool", ""))
        return _back(fields.get("back", "/ui/"), f"Draining {done['pool']}: {len(done['retired'])} retired, "
                     f"{len(done['retiring_at_release'])} at release")

    @router.post("/jobs/{job_id}/cancel")
    async def cancel_job(request: Request, job_id: str) -> Response:
        who, fields = await owner_form(request)
        job = await actions.cancel_own_job(cp, who.caller, job_id)
        said = ("cancelled" if job.state is JobState.CANCELLED else "told to stop" if not job.terminal
                else f"already ended {job.state}")
        return _back(fields.get("back", f"/ui/jobs/{job.id}"), f"Job {job.id} {said}")

    @router.post("/sessions/end")
    async def end_session(request: Request) -> Response:
        who, fields = await owner_form(request)
        done = await actions.end_own_session(cp, who.caller, fields.get("queue") or "default", fields.get("tag", ""))
        return _back(fields.get("back", "/ui/sessions"),
                     f"Ended session {done['tag']}: {len(done['cancelled_jobs'])} jobs cancelled, "
                     f"{len(done['retired_pods'])} pods retired now, {len(done['retiring_at_release'])} at release")

    @router.get("/timeline.json")
    async def timeline_json(request: Request) -> Response:
        if await sessions.identity(request) is None:
            raise Unauthorized("sign in first")
        return JSONResponse({p: timeline.series(p) for p in cp.catalog.pools}, headers=_headers())

    @router.get("/events")
    async def events(request: Request, topics: str = "pools") -> Response:
        who = await sessions.identity(request)
        if who is None:
            raise Unauthorized("sign in first")
        ui.start()
        wanted = {t for t in topics.split(",") if t in TOPICS} or {"pools"}
        return StreamingResponse(_snapshots(hub, who, wanted), media_type="text/event-stream",
                                 headers={**_headers(), "X-Accel-Buffering": "no"})

    @router.get("/jobs/{job_id}/log")
    async def job_log(request: Request, job_id: str) -> Response:
        who = await sessions.identity(request)
        if who is None:
            raise Unauthorized("sign in first")
        j = await readable_job(cp.book, who, job_id, Part.OUTPUT)  # the owner's alone, as REST (access.py)
        return StreamingResponse(_log(cp, j.caller, j.id), media_type="text/event-stream",
                                 headers={**_headers(), "X-Accel-Buffering": "no"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(FAVICON.read_bytes(), media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    app.include_router(router)
    static = files("broker.ui").joinpath("static")
    app.mount("/ui/static", StaticFiles(directory=str(static)), name="ui-static")
    return ui


async def _snapshots(hub: Hub, who: Identity, topics: set[str]) -> AsyncIterator[str]:
    client = hub.subscribe(topics, who)
    try:
        yield "retry: 3000\n\n"
        seq, last = 0, ""
        while True:
            try:
                snap = await asyncio.wait_for(hub.next(seq), KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            seq = snap.seq
            text = snap.encoded(who, topics)
            if text != last:  # nothing this page shows changed: send nothing
                last = text
                yield text
    finally:
        hub.unsubscribe(client)


async def _log(cp: ControlPlane, owner: str, job_id: str) -> AsyncIterator[str]:
    """The job's combined output as SSE `data` events (JSON strings), then an `end` event."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    offset = 0
    yield "retry: 3000\n\n"
    while True:
        try:
            chunk = await cp.read_log(owner, job_id, offset=offset, wait_s=5.0)
        except FirepoolError as exc:
            yield f"event: end\ndata: {json.dumps({'error': str(exc)})}\n\n"
            return
        text = decoder.decode(chunk.data, final=chunk.complete)
        if text:
            yield f"data: {json.dumps(text)}\n\n"
        offset = chunk.next_offset
        if chunk.complete:
            yield "event: end\ndata: {}\n\n"
            return
        if not chunk.data:
            await asyncio.sleep(0.25)  # the stored copy does not block; two reads a second at most
