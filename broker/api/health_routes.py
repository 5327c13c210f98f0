"""Operator routes of fleet health: `GET /v1/admin/quarantine`, `POST /v1/admin/quarantine/{key}/release`.

Admin tokens only (403 for any other caller): which devices and nodes are quarantined, their failure
counts, and the release that lets one back into placement (broker.health.quarantine).
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI

from broker.api.auth import Identity
from broker.control import ControlPlane
from broker.errors import Forbidden


def _admin(who: Identity) -> Identity:
    if not who.admin:
        raise Forbidden("quarantine is an operator's view: for callers marked admin in the tokens file")
    return who


def add_health_routes(app: FastAPI, cp: ControlPlane, identity: Any, errors: dict[int | str, dict[str, Any]]) -> None:
    """Mount the routes; `identity` is the dependency that yields the verified caller and its admin mark."""

    @app.get("/v1/admin/quarantine", responses=errors)
    async def quarantine(who: Identity = Depends(identity)) -> dict[str, Any]:
        _admin(who)
        q = cp.health.quarantine
        return {"quarantine": [r.view() for r in q.list()], "threshold": q.settings.threshold,
                "node_threshold": q.settings.node_threshold}

    @app.post("/v1/admin/quarantine/{key:path}/release", responses=errors)
    async def release(key: str, who: Identity = Depends(identity)) -> dict[str, Any]:
        _admin(who)
        return (await cp.health.quarantine.release(key, who.caller)).view()
