"""A broker that stands by (docs/ha.md): what it pays before it leads, what it keeps warm, who it must not stand
beside, and the `broker.json` it writes once it leads.

A standby has built its whole control plane and waits on the store's lock (broker.store.leadership). Everything
a take-over would otherwise pay first is paid here: the agent clients' transport imported, the store's query for
unfinished jobs run, a connection to each agent of a shared state dir kept open.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
from pathlib import Path

from broker.control import ControlPlane
from broker.errors import FirepoolError
from broker.jobs import JobState
from broker.locations import BROKER_FILE, pid_alive

log = logging.getLogger("firepool.standby")

REFRESH_S = 2.0
"""How often a standby re-reads what it will recover: the pods of a shared state dir, the unfinished jobs."""


def warm_up() -> None:
    """The agent clients' HTTP transport imports httpcore (with h2, hpack and trio where installed) when the first
    one is made, ~0.15 s here: the slowest part of a fail-over until a standby paid it before campaigning."""
    import httpx

    httpx.AsyncHTTPTransport(verify=False)


def warm_streams() -> None:
    """Starlette's first streamed answer (a fan-out's watch, a log follow, a terminal) imports anyio's asyncio
    backend: ~20 ms of CPU inside that request. A broker pays it in a worker thread while it warms up and
    campaigns: a standby long before it takes over."""
    importlib.import_module("anyio._backends._asyncio")


async def stand_by(cp: ControlPlane, warm: asyncio.Event) -> None:
    """While campaigning: keep warm what a take-over reads first, so it reads it at the speed of a warm broker;
    `warm` is set after the first pass (a broker campaigns once warm, so a warm standby wins over one that has
    just started)."""
    keep_warm = getattr(cp.backend, "stand_by", None)
    while True:
        try:
            await cp.book.io(lambda: cp.store.list_jobs(states=[JobState.RUNNING, JobState.QUEUED], limit=1))
            if keep_warm is not None:
                await keep_warm()
        except FirepoolError as exc:
            log.debug("standby: keeping warm failed this time: %s", exc)
        warm.set()
        await asyncio.sleep(REFRESH_S)


def foreign_leader(state_dir: Path, store: str) -> str | None:
    """Why a broker of `store` must not start on `state_dir`: a live broker leads it from another store (both would
    drive the same pods). Brokers of one store on one state dir are expected: the later ones stand by."""
    path = state_dir / BROKER_FILE
    try:
        data = json.loads(path.read_text())
        pid, theirs = int(data["pid"]), data.get("store")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if theirs is None or theirs == store or not pid_alive(pid):
        return None
    return (f"a broker on another job store ({theirs}) leads state dir {state_dir} at {data.get('url')}: "
            "give this one the same --db to stand by, or another --state-dir")


def write_address(state_dir: Path, url: str, store: str) -> Path:
    """Tell local clients where the leading broker listens; called once it leads and its port is bound, so a
    client that reads the file can connect. Written whole (rename), so nobody reads half a file. `store` lets a
    broker started later on this state dir refuse a different store (`foreign_leader`)."""
    path = state_dir / BROKER_FILE
    tmp = path.with_name(f".{BROKER_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "store": store}))
    os.replace(tmp, path)
    return path


def remove_address(state_dir: Path) -> None:
    """At shutdown: remove broker.json if it is still ours (another broker may have taken the dir over)."""
    path = state_dir / BROKER_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass
