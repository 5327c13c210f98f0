"""Routes of `/v1/packages/{sha256}`: PUT a zip (checked, then stored once), HEAD and GET it back.

The body streams to a staging file with the compressed limit enforced as it arrives, so an oversized
upload is cut off without being held in memory; the store then hashes, checks and commits it in a
worker thread. A caller sees only the packages it uploaded: anyone else's is "not found".
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse, Response

from broker.control import ControlPlane
from broker.errors import InvalidRequest, NotFound, PackageError, Unavailable
from broker.running.packages import PackageStore, check_digest, too_large


def _store(cp: ControlPlane) -> PackageStore:
    if cp.packages is None:
        raise Unavailable("this broker has no package store")
    return cp.packages


async def _stage(request: Request, store: PackageStore) -> Path:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > store.limits.max_compressed:
        raise too_large(store.limits.max_compressed)
    with store.upload() as upload:
        async for chunk in request.stream():
            upload.write(chunk)
    return upload.path


Digest = Annotated[str, PathParam(description="SHA-256 of the zip, lower-case hex (64 digits).",
                                  json_schema_extra={"pattern": r"^[0-9a-f]{64}$"})]
"""Checked by `check_digest` inside each route (a typed 422 InvalidRequest), not by a path pattern: a name
with a `/`, or none at all, must not fall through to another route's refusal."""


def add_package_routes(app: FastAPI, cp: ControlPlane, caller: Any, errors: dict[int | str, dict[str, Any]]) -> None:
    """Mount the package routes; `caller` is the dependency that yields the verified caller."""

    @app.api_route("/v1/packages", methods=["GET", "HEAD", "PUT"], include_in_schema=False)
    async def no_digest(who: str = Depends(caller)) -> Response:
        raise InvalidRequest("a package is named by the 64 lower-case hex digits of its SHA-256: "
                             "/v1/packages/{sha256}", {"field": "digest"})

    @app.put("/v1/packages/{digest:path}", status_code=201, responses=errors)
    async def put_package(digest: Digest, request: Request, who: str = Depends(caller)) -> JSONResponse:
        check_digest(digest)
        store = _store(cp)
        if request.headers.get("content-type", "application/zip").split(";")[0].strip() not in (
                "application/zip", "application/octet-stream", "application/x-zip-compressed"):
            raise PackageError("a package body is a zip archive (content-type application/zip)")
        staged = await _stage(request, store)
        stored = await asyncio.to_thread(store.put_file, who, digest, staged)
        return JSONResponse({"digest": stored.digest, "size": stored.size, "created": stored.created},
                            status_code=201 if stored.created else 200)

    @app.head("/v1/packages/{digest:path}", responses=errors)
    async def head_package(digest: Digest, who: str = Depends(caller)) -> Response:
        path = await asyncio.to_thread(_store(cp).path, who, check_digest(digest))
        if path is None:
            raise NotFound(f"no package {digest}", {"digest": digest})
        return Response(status_code=200, headers={"Content-Length": str(path.stat().st_size),
                                                  "Content-Type": "application/zip"})

    @app.get("/v1/packages/{digest:path}", responses=errors)
    async def get_package(digest: Digest, who: str = Depends(caller)) -> FileResponse:
        path = await asyncio.to_thread(_store(cp).path, who, check_digest(digest))
        if path is None:
            raise NotFound(f"no package {digest}", {"digest": digest})
        return FileResponse(path, media_type="application/zip", filename=f"{digest}.zip")
