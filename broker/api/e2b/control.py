"""The E2B control plane (`E2B_API_URL` = `<broker>/e2b`): create, connect, list, get info, set timeout, kill.

Auth: `X-API-KEY` is a Firepool token (any token of the tokens file; `firepool token add --e2b` makes one
shaped `e2b_<hex>`). Another caller's sandbox is a 404, as an unknown one. Errors are E2B's shape
`{"code": <status>, "message": ...}`; what Firepool does not do is a 501 naming the feature.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

from broker.api.auth import TokenAuth
from broker.api.door import Send
from broker.api.e2b.http import HttpError, Request, send_bytes, send_json, unsupported
from broker.api.e2b.sandboxes import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, Sandbox
from broker.api.e2b.service import Service
from broker.errors import FirepoolError

ENVD_VERSION = "0.5.7"
"""The envd version reported: ≥ 0.4.0 (no default user), 0.5.2 (close_stdin), 0.5.7 (octet-stream uploads)."""
CLIENT_ID = "firepool"

CREATE_FIELDS = frozenset({"templateID", "timeout", "metadata", "envVars", "secure", "allow_internet_access"})
UNSUPPORTED_FIELDS = {"autoPause": "auto-pause", "autoPauseMemory": "auto-pause", "autoResume": "auto-resume",
                      "network": "network configuration", "mcp": "the MCP gateway", "iam": "IAM",
                      "volumeMounts": "volumes"}
UNSUPPORTED_ROUTES = [
    (re.compile(r"/sandboxes/[^/]+/pause"), "pause"), (re.compile(r"/sandboxes/[^/]+/resume"), "resume"),
    (re.compile(r"/sandboxes/[^/]+/fork"), "fork"), (re.compile(r"/sandboxes/[^/]+/snapshots"), "snapshots"),
    (re.compile(r"/snapshots.*"), "snapshots"), (re.compile(r"/sandboxes/[^/]+/metrics"), "metrics"),
    (re.compile(r"/sandboxes/metrics"), "metrics"), (re.compile(r"/sandboxes/[^/]+/network"), "network configuration"),
    (re.compile(r"/sandboxes/[^/]+/logs"), "logs"), (re.compile(r"(/v\d)?/templates.*"), "templates"),
    (re.compile(r"/volumes.*"), "volumes"), (re.compile(r"/secrets.*"), "secrets")]
_SANDBOX = re.compile(r"(?:/v2)?/sandboxes/([^/]+)(/connect|/timeout|/refreshes)?")


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _str_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HttpError(400, f"{name} must be an object of strings")
    return dict(value)


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT_S:
        raise HttpError(400, f"timeout must be a number of seconds in (0, {MAX_TIMEOUT_S}]")
    return float(value)


class Control:
    def __init__(self, service: Service, auth: TokenAuth, port_domain: str | None = None) -> None:
        self.service = service
        self.auth = auth
        self.port_domain = port_domain.strip(".") if port_domain else None
        """The port proxy's host-form domain (`--port-domain`): the SDK's `get_host(port)` is then
        `{port}-{sandbox id}.{domain}`, which is that proxy's name for the session's port."""

    async def caller(self, req: Request) -> str:
        key = req.headers.get("x-api-key", "").strip()
        if not key:
            raise HttpError(401, "missing X-API-KEY (a Firepool token)")
        try:
            if key.count(".") == 2:  # a JWT may fetch its issuer's keys
                return (await asyncio.to_thread(self.auth.identify, f"Bearer {key}")).caller
            return self.auth.identify(f"Bearer {key}").caller
        except FirepoolError:
            raise HttpError(401, "invalid API key") from None

    def sandbox_view(self, sbx: Sandbox) -> dict[str, Any]:
        return {"templateID": sbx.template, "sandboxID": sbx.id, "clientID": CLIENT_ID, "envdVersion": ENVD_VERSION,
                "envdAccessToken": sbx.token, "trafficAccessToken": sbx.traffic_token, "domain": self.port_domain,
                "alias": sbx.template}

    def listed_view(self, sbx: Sandbox) -> dict[str, Any]:
        pool = self.service.pools().get(sbx.template)
        cpus = max(1, int(getattr(pool, "cpus", 1) or 1))
        return {"templateID": sbx.template, "sandboxID": sbx.id, "clientID": CLIENT_ID, "alias": sbx.template,
                "startedAt": iso(sbx.started_at), "endAt": iso(sbx.end_at), "cpuCount": cpus, "memoryMB": 1024 * cpus,
                "diskSizeMB": 10240, "state": "running", "envdVersion": ENVD_VERSION, "metadata": sbx.metadata}

    async def handle(self, req: Request, send: Send) -> None:
        for pattern, feature in UNSUPPORTED_ROUTES:
            if pattern.fullmatch(req.path):
                await self.caller(req)
                raise unsupported(feature)
        caller = await self.caller(req)
        if req.path in ("/sandboxes", "/v2/sandboxes"):
            if req.method == "POST":
                await send_json(send, 201, self.sandbox_view(await self.create(caller, await req.json())))
                return
            if req.method == "GET":
                await self.list(caller, req, send)
                return
            raise HttpError(405, f"{req.method} is not allowed on {req.path}")
        m = _SANDBOX.fullmatch(req.path)
        if m is None:
            raise HttpError(404, f"no route {req.path[:100]!r} in Firepool's E2B API")
        sid, action = unquote(m.group(1)), m.group(2) or ""
        sbx = self.service.registry.owned(caller, sid)
        if sbx is None:
            raise HttpError(404, f"sandbox {sid[:80]!r} not found")
        if action == "/connect" and req.method == "POST":
            body = await req.json()
            extra = set(body) - {"timeout", "memory"} if isinstance(body, dict) else {"(not an object)"}
            if extra:
                raise HttpError(400, f"unknown field(s) {', '.join(sorted(extra))}")
            if body.get("timeout") is not None:
                sbx.end_at = max(sbx.end_at, self.service.now() + _timeout(body["timeout"]))
            if sbx.token is None:
                sbx.mint_tokens()  # a restarted broker keeps only digests: the caller gets new tokens
            await send_json(send, 200, self.sandbox_view(sbx))
        elif action == "/timeout" and req.method == "POST":
            body = await req.json()
            if not isinstance(body, dict) or set(body) != {"timeout"}:
                raise HttpError(400, "the body is {\"timeout\": <seconds>}")
            sbx.end_at = self.service.now() + _timeout(body["timeout"])
            await send_bytes(send, 204)
        elif action == "/refreshes" and req.method == "POST":
            await send_bytes(send, 204)
        elif action == "" and req.method == "GET":
            await send_json(send, 200, {**self.listed_view(sbx), "envdAccessToken": sbx.token,
                                        "domain": self.port_domain})
        elif action == "" and req.method == "DELETE":
            await self.service.end(sbx)
            await send_bytes(send, 204)
        else:
            raise HttpError(405, f"{req.method} is not allowed on {req.path}")

    async def create(self, caller: str, body: Any) -> Sandbox:
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        for name, feature in UNSUPPORTED_FIELDS.items():
            if body.get(name) not in (None, False, {}, []):
                raise unsupported(feature)
        unknown = set(body) - CREATE_FIELDS - set(UNSUPPORTED_FIELDS)
        if unknown:
            raise HttpError(400, f"unknown field(s) {', '.join(sorted(unknown))[:200]}")
        if body.get("allow_internet_access") is False:
            raise unsupported("allow_internet_access=False (a sandbox's network is its pool's)")
        template = body.get("templateID")
        if not isinstance(template, str) or not template:
            raise HttpError(400, "templateID (a Firepool pool) is required")
        timeout = _timeout(body["timeout"]) if body.get("timeout") is not None else float(DEFAULT_TIMEOUT_S)
        return await self.service.create(caller, template, timeout, _str_map(body.get("metadata"), "metadata"),
                                         _str_map(body.get("envVars"), "envVars"))

    async def list(self, caller: str, req: Request, send: Send) -> None:
        q = req.query
        mine = self.service.registry.of(caller)
        states = {s.strip() for s in q.get("state", "running").split(",") if s.strip()}
        if "running" not in states:
            mine = []
        if q.get("metadata"):
            wanted = {unquote(k): unquote(v) for k, v in parse_qsl(q["metadata"], keep_blank_values=True)}
            mine = [s for s in mine if all(s.metadata.get(k) == v for k, v in wanted.items())]
        if q.get("template"):
            mine = [s for s in mine if s.template == q["template"]]
        mine.sort(key=lambda s: (s.started_at, s.id), reverse=q.get("order") == "desc")
        try:
            limit = int(q.get("limit", "100"))
            start = int(q.get("nextToken") or "0")
        except ValueError:
            raise HttpError(400, "limit and nextToken are numbers") from None
        if not 1 <= limit <= 1000 or start < 0:
            raise HttpError(400, "limit is 1 to 1000; nextToken is a cursor from x-next-token")
        page = mine[start:start + limit]
        more = start + limit < len(mine)
        headers = {"x-next-token": str(start + limit)} if more else None
        await send_json(send, 200, [self.listed_view(s) for s in page], headers)
