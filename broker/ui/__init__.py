"""The web dashboard at `/ui/`: server-rendered pages over the control plane's own views, live over SSE.

`mount_ui` adds the routes to the broker's FastAPI app; `start_ui` starts its supervised background
tasks (the pools' timeline sampler and the shared snapshot hub) once the control plane runs. Templates
and static assets (uPlot vendored, MIT) ship inside this package; nothing is fetched from elsewhere.
"""

from __future__ import annotations

from fastapi import FastAPI

from broker.api.auth import TokenAuth
from broker.control import ControlPlane
from broker.ports.ui_sessions import UiSessionStore
from broker.ui.routes import Dashboard, add_ui_routes
from broker.ui.session import Sessions, SessionSettings


def mount_ui(app: FastAPI, cp: ControlPlane, auth: TokenAuth, store: UiSessionStore,
             settings: SessionSettings) -> Dashboard:
    return add_ui_routes(app, cp, Sessions(auth, store, cp.clock, settings))


def start_ui(app: FastAPI) -> None:
    ui: Dashboard | None = getattr(app.state, "ui", None)
    if ui is not None:
        ui.start()


async def end_stale_sessions(app: FastAPI) -> int:
    """End the dashboard sessions of tokens no longer in the tokens file, and expired ones (at start and
    after a reload of the tokens file); how many ended."""
    ui: Dashboard | None = getattr(app.state, "ui", None)
    return 0 if ui is None else await ui.sessions.purge()
