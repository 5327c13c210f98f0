"""The composition root: build the adapters (SQL store, backend, log store, auth) and serve the API.

Settings are values built once from the command line and passed down; nothing reads the environment
at import time. The embedded defaults: SQLite in the state dir, the local backend, a token for the
local user written to `<state-dir>/token`, and the broker's address in `<state-dir>/broker.json`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn

from broker.api.auth import TokenAuth, local_caller, local_token
from broker.api.exposure import Exposure
from broker.api.jwt_auth import JwtSettings, JwtVerifier
from broker.api.leading import Leadership
from broker.api.openrequests import DEFAULT_LIMIT as DEFAULT_OPEN_REQUESTS
from broker.api.portlinks import PortSettings, load_key
from broker.clock import RealClock
from broker.control import ControlPlane, Tuning
from broker.errors import FirepoolError
from broker.fencing import DEFAULT_LEASE_S, Term
from broker.gateway.kernels import GatewaySettings
from broker.locations import DEFAULT_PORT
from broker.pools import Catalog, default_catalog, load_catalog_file
from broker.ports.backend import Backend
from broker.ports.capacity import CapacitySource, FileCapacitySource, HttpCapacitySource
from broker.running.logretention import LogRetention
from broker.running.packages import FilePackageStore, PackageLimits
from broker.standby import remove_address, stand_by, warm_streams, warm_up, write_address
from broker.ui.session import SessionSettings

log = logging.getLogger("firepool.server")


@dataclass(frozen=True)
class KubernetesTarget:
    namespace: str | None = None
    """None: the broker's own namespace in a cluster, else `default`."""
    kubeconfig: str | None = None
    """None: in-cluster config, else the default kubeconfig."""
    broker_id: str = "firepool"
    """The `firepool.io/broker` label value of this broker's pods."""


@dataclass(frozen=True)
class ServeSettings:
    state_dir: Path
    """SQLite file, pod workspaces, logs, the local token."""
    db_url: str | None = None
    """SQLAlchemy URL of the job store; default SQLite in the state dir."""
    backend: str = "local"
    pools_file: Path | None = None
    tokens_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    virtual_gpus: int | None = None
    virtual_gpus_per_node: int | None = None
    """Split the virtual GPUs into nodes of this many (`--virtual-nodes`); None: one node."""
    sandbox: str = "auto"
    """Local backend isolation: bubblewrap, required (auto and bwrap), or none (unisolated)."""
    unisolated: bool = False
    """`--unisolated`: the operator's explicit choice to run pods without a sandbox (sandbox none)."""
    keep_pods: bool = False
    """On a clean shutdown keep idle pods for the next start (busy pods are always kept)."""
    tuning: Tuning = Tuning()
    capacity: str | None = None
    """Borrowed-capacity source: a JSON file path, or an http(s) URL serving the same document."""
    packages: PackageLimits = PackageLimits()
    """Limits of code packages (compressed, extracted, push timeout)."""
    mcp: bool = False
    """Also serve the MCP server (streamable HTTP) at /mcp/ on the broker's port (needs the [mcp] extra)."""
    jwt: JwtSettings | None = None
    """Also accept JWTs (OIDC, Kubernetes service accounts) verified against this JWKS."""
    metrics_caller_labels: bool = False
    """Publish per-caller series (holds by owner) on /metrics; off by default so names stay private."""
    max_request_bytes: int = 2 << 20
    """Largest JSON request body (413 RequestTooLarge above it); package uploads have their own cap."""
    max_open_requests: int = DEFAULT_OPEN_REQUESTS
    """Requests and websockets one caller may hold open at once (429 TooManyOpenRequests past it)."""
    kubernetes: KubernetesTarget = KubernetesTarget()
    """Where the kubernetes backend creates pods."""
    tls_cert: Path | None = None
    """`--tls-cert`: serve HTTPS with this certificate chain (PEM), with `tls_key`."""
    tls_key: Path | None = None
    forwarded_allow_ips: str | None = None
    """`--forwarded-allow-ips`: trust X-Forwarded-Proto/For from these proxy addresses (uvicorn's option)."""
    insecure_http: bool = False
    """`--insecure-http`: the operator accepts plain HTTP on a non-loopback address."""
    ui_sessions: SessionSettings = SessionSettings()
    """Dashboard sessions: absolute and idle lifetimes (docs/dashboard.md)."""
    log_retention: LogRetention = LogRetention()
    """How long and how much of each caller's logs the state dir keeps."""
    ports: PortSettings = PortSettings()
    """The port proxy: allowed ports, host form, body and message caps (docs/ports.md); its key is read
    from the state dir at start."""
    gateway: GatewaySettings = GatewaySettings()
    """The Jupyter gateway's per-caller kernel limit, idle culling and client envs (broker.gateway)."""
    lease_s: float = DEFAULT_LEASE_S
    """Leadership lease (docs/ha.md): a leader silent this long is replaced; it deposes itself after half."""
    advertise_url: str | None = None
    """The URL a standby names when it refers clients to this broker; None: scheme://host:port as served."""

    @property
    def store(self) -> str:
        """The job store's URL as broker.json names it (no password)."""
        from broker.store.engines import normalize_url

        url = self.db_url or f"sqlite:///{self.state_dir / 'firepool.db'}"
        return normalize_url(url).render_as_string(hide_password=True)

    @property
    def exposure(self) -> Exposure:
        return Exposure(self.host, tls=self.tls_cert is not None, insecure_http=self.insecure_http)

    def url(self, port: int | None = None) -> str:
        """Where clients reach this broker: `advertise_url`, else its scheme, host (loopback for a wildcard) and port."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.tls_cert is not None else "http"
        return f"{scheme}://{host}:{self.port if port is None else port}"


def build_capacity(settings: ServeSettings) -> CapacitySource | None:
    """The capacity source named by the settings, if any."""
    if not settings.capacity:
        return None
    if settings.capacity.startswith(("http://", "https://")):
        return HttpCapacitySource(settings.capacity)
    return FileCapacitySource(Path(settings.capacity))


def reload_catalog(cp: ControlPlane, settings: ServeSettings) -> None:
    """SIGHUP: re-read the catalog file; a bad file is logged and the running catalog kept."""
    if settings.pools_file is None:
        return
    try:
        catalog = load_catalog_file(settings.pools_file)
    except (OSError, ValueError) as exc:
        log.error("catalog reload failed, keeping the running catalog: %s", exc)
        return
    try:
        check_networks(cp.backend, catalog)
    except FirepoolError as exc:
        log.error("catalog reload failed, keeping the running catalog: %s", exc)
        return
    cp.reload_catalog(catalog)
    log.info("catalog reloaded: pools %s", ", ".join(catalog.pools))


def build_catalog(settings: ServeSettings, gpu_count: int, gpu_model: str) -> Catalog:
    if settings.pools_file is not None:
        return load_catalog_file(settings.pools_file)
    return default_catalog(gpu_count, gpu_model)


def build_auth(settings: ServeSettings) -> TokenAuth:
    jwt = JwtVerifier(settings.jwt) if settings.jwt is not None else None
    if settings.tokens_file is not None:
        return TokenAuth.from_file(settings.tokens_file, jwt)
    # The embedded broker's one local user is its operator: it sees its own broker's metrics.
    return TokenAuth({local_token(settings.state_dir): {"caller": local_caller(), "admin": True}}, jwt)


def check_networks(backend: Backend, catalog: Catalog) -> None:
    """The local backend's pod networks (bad `network` values, a missing stack); other backends have none."""
    check = getattr(backend, "check_networks", None)
    if check is not None:
        check(catalog.pools)


def build_control_plane(settings: ServeSettings, term: Term | None = None) -> ControlPlane:
    """The control plane of `settings`; with `term`, its store refuses writes once another broker leads."""
    from broker.running.logstore import FileLogStore
    from broker.store.sql import SqlJobStore

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.state_dir, 0o700)
    clock = RealClock()
    backend: Backend
    if settings.backend == "kubernetes":
        from broker.backends.kubernetes.setup import kubernetes_backend

        k8s = settings.kubernetes
        first = build_catalog(settings, 0, "gpu")  # the catalog paces the creates and names the domain labels
        rate = first.create_rate
        backend = kubernetes_backend(clock, k8s.namespace, k8s.kubeconfig, k8s.broker_id, rate.qps, rate.burst,
                                     first.topology_domain_labels, term=term)
    elif settings.backend == "local":
        from broker.backends.local import LocalBackend

        backend = LocalBackend(settings.state_dir, clock, virtual_gpus=settings.virtual_gpus,
                               sandbox="none" if settings.unisolated else settings.sandbox,
                               gpus_per_node=settings.virtual_gpus_per_node, term=term)
    else:
        raise ValueError(f"backend {settings.backend!r} is not available here (choose: local, kubernetes)")
    devices = backend.devices()
    catalog = build_catalog(settings, len(devices), devices[0].model if devices else "gpu")
    check_networks(backend, catalog)
    store = SqlJobStore.open(settings.db_url or f"sqlite:///{settings.state_dir / 'firepool.db'}")
    if term is not None:
        from broker.store.leadership import install_fence

        install_fence(store.engine, term)
    logs = FileLogStore(settings.state_dir / "logs")
    packages = FilePackageStore(settings.state_dir / "packages", settings.packages)
    from broker.store.quarantine import SqlQuarantineStore

    return ControlPlane(clock=clock, store=store, backend=backend, logs=logs, catalog=catalog,
                        tuning=settings.tuning, capacity=build_capacity(settings), packages=packages,
                        quarantine=SqlQuarantineStore(store.engine), log_retention=settings.log_retention)


class _Server(uvicorn.Server):
    """uvicorn's server, announcing itself in broker.json only once its socket is bound and it leads."""

    def __init__(self, config: uvicorn.Config, settings: ServeSettings, leadership: Leadership) -> None:
        super().__init__(config)
        self.settings = settings
        self.leadership = leadership
        self.bound: int | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return  # the bind failed (uvicorn logged why) or a signal came first: announce nothing
        self.bound = int(self.servers[0].sockets[0].getsockname()[1])
        if self.leadership.leading:
            self.announce()
        else:
            log.info("standby on %s:%s: serving /healthz and /readyz until it leads", self.settings.host, self.bound)

    def announce(self) -> None:
        if self.bound is None:
            return  # not bound yet: startup announces
        path = write_address(self.settings.state_dir, self.settings.url(self.bound), self.settings.store)
        log.info("broker ready on %s:%s, leading at term %d (clients find it through %s)", self.settings.host,
                 self.bound, self.leadership.term.value, path)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        remove_address(self.settings.state_dir)  # first: no new client should find a broker that is stopping
        await super().shutdown(sockets)


WARM_S = 5.0
"""At most this long a new broker warms up (broker.standby) before it campaigns."""
FIRST_TRY_S = 10.0
"""At most this long before a new broker serves: its first try of the store's lock (a database to reach)."""
YOUNG_COLLECTION_EVERY = 20_000
"""Net allocations between the collector's young-generation passes (CPython's default is 700)."""


def settle_heap() -> None:
    """Once the control plane started. Everything alive now (modules, catalog, recovered state) lives as long as
    the process: startup's garbage is freed, the rest is moved out of the collector's reach, so a full
    collection no longer walks it (B4: ~0.1-0.3 ms of CPU per dispatched job). A dispatched job allocates a
    few hundred short-lived, acyclic objects (rows, dicts, futures) that reference counting frees, so the
    default threshold ran a young collection every few jobs; cycles are still collected, just in fewer passes."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, older, oldest)


def serve(settings: ServeSettings) -> int:
    """Run the broker until SIGINT/SIGTERM; returns the process exit code."""
    from broker.api.app import create_app
    from broker.store.leadership import Election
    from broker.store.sql import SqlJobStore
    from broker.store.ui_sessions import SqlSessionStore
    from broker.ui import end_stale_sessions, start_ui

    auth = build_auth(settings)
    term = Term()
    cp = build_control_plane(settings, term)
    exposure = settings.exposure
    assert isinstance(cp.store, SqlJobStore)  # build_control_plane opens a SQL store
    election = Election(cp.store.engine, term, holder=f"{socket.gethostname()}:{os.getpid()}",
                        url=settings.url(), lease_s=settings.lease_s)
    leadership = Leadership(term, leading=False, leader=election.known_leader)
    app = create_app(cp, auth, metrics_caller_labels=settings.metrics_caller_labels,
                     max_request_bytes=settings.max_request_bytes, exposure=exposure,
                     ui_sessions=SqlSessionStore(cp.store.engine), ui_session_settings=settings.ui_sessions,
                     ports=replace(settings.ports, key=load_key(settings.state_dir)),
                     gateway_settings=settings.gateway, leadership=leadership,
                     max_open_requests=settings.max_open_requests)
    mcp_lifespan = _mount_mcp(app, auth, settings) if settings.mcp else None
    if exposure.transport == "http-insecure":
        log.warning("serving PLAIN HTTP on %s (--insecure-http): bearer tokens and dashboard cookies cross the "
                    "network in clear; /healthz says transport http-insecure", settings.host)
    chores: set[asyncio.Task[Any]] = set()

    def on_hangup() -> None:
        """SIGHUP: re-read the catalog and the tokens file; sessions of tokens that left the file end."""
        reload_catalog(cp, settings)
        if settings.tokens_file is None:
            return
        try:
            auth.reload(settings.tokens_file)
        except ValueError as exc:
            log.error("tokens reload failed, keeping the running tokens: %s", exc)
            return
        log.info("tokens reloaded: %d token(s)", len(auth))
        task = asyncio.get_running_loop().create_task(_end_sessions(app, end_stale_sessions))
        chores.add(task)
        task.add_done_callback(chores.discard)

    led = asyncio.Event()

    async def lead() -> None:
        """Wait for the store's lock (a hot standby: everything is built), then recover and dispatch."""
        warm_up()
        chores.add(asyncio.ensure_future(asyncio.to_thread(warm_streams)))  # beside the warm-up, off the loop
        warm = asyncio.Event()
        warming = asyncio.get_running_loop().create_task(stand_by(cp, warm))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(warm.wait(), WARM_S)
            term.value = await asyncio.to_thread(election.campaign)
        finally:
            warming.cancel()
            await asyncio.gather(warming, return_exceptions=True)
        if not term.value:
            return  # stopped while a standby
        election.lead()
        reread = getattr(cp.backend, "reread", None)  # pods the previous leader of this state dir started
        if reread is not None:
            reread()
        await cp.start()
        leadership.leading = True  # it dispatches: say so first, the rest is bookkeeping
        led.set()
        start_ui(app)  # the dashboard's timeline sampler and snapshot hub, supervised by cp.tasks
        server.announce()
        took = time.monotonic() - (election.locked_at or time.monotonic())
        log.info("control plane started at term %d, %.3f s after taking the store's lock (backend %s, isolated %s, "
                 "pools %s; recovery %s)", term.value, took, cp.backend.kind, cp.backend_isolated,
                 ", ".join(cp.catalog.pools), cp.recovery)
        chores.add(asyncio.get_running_loop().create_task(_stop_on_failure(cp, server)))
        await _end_sessions(app, end_stale_sessions)  # tokens removed while the broker was down end theirs

    async def leading_or_exit() -> None:
        try:
            await lead()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("taking the lead failed; shutting down")
            server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(_: object) -> AsyncIterator[None]:
        settle_heap()  # a standby settles before it leads: its first dispatch pays no collection
        candidacy = asyncio.get_running_loop().create_task(leading_or_exit())
        await asyncio.to_thread(election.first_try.wait, FIRST_TRY_S)
        if election.locked_at is not None:  # nobody led: serve once leading, as a broker alone always did
            waiter = asyncio.ensure_future(led.wait())
            await asyncio.wait({candidacy, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hangup)
        try:
            if mcp_lifespan is None:
                yield
            else:
                async with mcp_lifespan():
                    yield
        finally:
            election.stopping.set()
            candidacy.cancel()
            for chore in chores:
                chore.cancel()
            if leadership.leading:
                leadership.leading = False
                await app.state.gateway.close()  # its kernels' jobs run on, for the next broker to adopt
                await cp.stop(delete_idle_pods=not settings.keep_pods)
            election.stop()  # the lock goes last: a standby takes over a broker that has finished stopping
            await asyncio.to_thread(cp.store.close)

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                            ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key,
                            proxy_headers=settings.forwarded_allow_ips is not None,
                            forwarded_allow_ips=settings.forwarded_allow_ips)
    server = _Server(config, settings, leadership)
    try:
        server.run()  # SIGINT/SIGTERM end it gracefully: uvicorn handles them and returns
    finally:
        remove_address(settings.state_dir)
    if not server.started:
        return 1  # the port could not be bound (uvicorn logged why)
    return 1 if cp.tasks.failure is not None else 0


def _mount_mcp(app: object, auth: TokenAuth, settings: ServeSettings) -> Any:
    """Mount the MCP server at /mcp/; its clients use the broker's own tokens. It forwards a caller's token
    to the broker, so only plain-text entries serve there (a hashed token cannot be forwarded)."""
    from mcp_server.mounting import mount

    tokens = auth.plain_tokens
    if len(tokens) < len(auth):
        log.warning("/mcp/ serves only the callers whose tokens are stored in plain text; hashed ones get a 401 "
                    "there (run `firepool mcp --http` with a token per caller instead)")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    scheme = "https" if settings.tls_cert is not None else "http"  # its certificate must name this host
    return mount(app, broker_url=f"{scheme}://{host}:{settings.port}", tokens=tokens, host=settings.host)


async def _end_sessions(app: Any, end: Callable[[Any], Awaitable[int]]) -> None:
    try:
        ended = await end(app)
    except FirepoolError as exc:  # the store is down: the per-request check still refuses those sessions
        log.warning("could not end stale dashboard sessions now: %s", exc)
        return
    if ended:
        log.info("ended %d dashboard session(s) of removed tokens or past their expiry", ended)


async def _stop_on_failure(cp: ControlPlane, server: object) -> None:
    """A critical loop died: stop serving rather than accept jobs nobody will dispatch."""
    await cp.tasks.failed.wait()
    log.error("a control loop failed; shutting down: %r", cp.tasks.failure)
    server.should_exit = True  # type: ignore[attr-defined]
