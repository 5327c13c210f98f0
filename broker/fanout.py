"""Fan-out on the SDK's side, shared by `Client` and `AsyncClient`: the bodies of `POST /v1/jobs:batch`, the
id lists of `POST /v1/jobs:watch` and the reading of its event stream, with the bookkeeping that lets a watch
resume where it stopped. No I/O here: the sync and async loops (broker.fanout_blocking, broker.fanout_async)
send what this builds and feed back what they read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from broker.client_core import JobInfo, job_body
from broker.errors import FirepoolError, InvalidRequest, StreamBroken

BATCH_PATH = "/v1/jobs:batch"
WATCH_PATH = "/v1/jobs:watch"
MAX_BATCH = 1000
"""Jobs in one `POST /v1/jobs:batch` (the broker's limit); `submit_many` sends longer lists in chunks."""
MAX_BATCH_BYTES = 1 << 20
"""JSON bytes of jobs in one batch request: half the broker's default `--max-request-bytes` (2 MiB), so long
commands split into more requests rather than get 413 RequestTooLarge."""
MAX_WATCH = 10000
"""Ids in one `POST /v1/jobs:watch` (the broker's limit)."""
WATCH_WAIT_S = 60.0
"""How long one watch stream waits for its jobs before it ends with the rest `pending` (asked again then)."""
ROTATE_WAIT_S = 2.0
"""With more than MAX_WATCH ids pending, each chunk is watched this long in turn, so no chunk waits on another."""
MAX_BREAKS = 5
"""Watch streams in a row that break off (or close before `end`) with no job delivered in between: then
StreamBroken is raised."""

Item = Sequence[str] | Mapping[str, Any]
"""One job for `submit_many`: an argv list, or a job body with `command` and per-item fields."""


def map_args(first: Any, args: Sequence[Any], fields: Mapping[str, Any]
             ) -> tuple[Callable[[Any], Any] | None, Iterable[Any], str, dict[str, Any]]:
    """`map`'s two forms sorted out: (fn or None, items or inputs, pool, job fields), from
    `map(items, pool="cpu", **fields)` and `map(fn, inputs, pool="cpu", **fields)`."""
    fn = first if callable(first) else None
    names = ("inputs", "pool") if fn is not None else ("pool",)
    if len(args) > len(names):
        raise TypeError(f"map() takes at most {len(names) + 1} positional arguments ({len(args) + 1} given)")
    given = dict(zip(names, args, strict=False))
    rest = dict(fields)
    for name in names:
        if name in rest:
            if name in given:
                raise TypeError(f"map() got multiple values for argument '{name}'")
            given[name] = rest.pop(name)
    if fn is not None and "inputs" not in given:
        raise TypeError("map(fn, inputs): the inputs are missing")
    return fn, given["inputs"] if fn is not None else first, str(given.get("pool", "cpu")), rest


def batches(bodies: Sequence[dict[str, Any]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(offset, bodies) of each batch request: at most MAX_BATCH jobs and about MAX_BATCH_BYTES of JSON."""
    start, size = 0, 0
    for i, body in enumerate(bodies):
        weight = len(json.dumps(body)) + 1
        if i > start and (i - start >= MAX_BATCH or size + weight > MAX_BATCH_BYTES):
            yield start, list(bodies[start:i])
            start, size = i, 0
        size += weight
    if start < len(bodies):
        yield start, list(bodies[start:])


def batch_items(items: Iterable[Item], pool: str, fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The job bodies of a batch: `fields` are every item's defaults, a Mapping item's own fields win; each body
    gets its own `sdk-<uuid>` idempotency key (unless the item names one), so a retried batch creates nothing
    twice. InvalidRequest (details `index`) for an item that is not an argv list or a body with `command`."""
    bodies = []
    for index, item in enumerate(items):
        if isinstance(item, Mapping):
            merged = {**fields, **item}
            command = merged.pop("command", None)
            item_pool = merged.pop("pool", pool)
        else:
            command, item_pool, merged = item, pool, dict(fields)
        if isinstance(command, str | bytes) or not isinstance(command, Sequence) or not command:
            raise InvalidRequest(f"item {index}: a job is an argv list (not a string) or a body with a non-empty "
                                 f"`command` list", {"index": index})
        bodies.append(job_body(command, item_pool, merged))
    return bodies


def batch_error(exc: FirepoolError, offset: int) -> FirepoolError:
    """A chunk's refusal with its `index` counted from the start of the whole list, not of the chunk."""
    index = exc.details.get("index")
    if offset and isinstance(index, int):
        exc.details["index"] = index + offset
        exc.details["submitted"] = offset  # the chunks before this one stand (each all-or-nothing)
    return exc


def watch_timeout(body: Mapping[str, Any]) -> httpx.Timeout:
    """A watch stream may be silent for its whole `wait_s`; past that (and a margin) it is taken as broken."""
    return httpx.Timeout(30.0, read=float(body["wait_s"]) + 30.0)


def jobs_of(answer: Mapping[str, Any]) -> list[JobInfo]:
    """The jobs of a `POST /v1/jobs:batch` answer, in request order."""
    return [JobInfo.from_json(job) for job in answer["jobs"]]


def job_ids(jobs_or_ids: Iterable[JobInfo | str]) -> list[str]:
    """Ids in first-seen order, each once."""
    return list(dict.fromkeys(j.id if isinstance(j, JobInfo) else str(j) for j in jobs_or_ids))


@dataclass
class SseParser:
    """Server-sent events, one line at a time (the line without its newline): `feed` returns
    (event, data) when a blank line ends an event; comments (`: keep-alive`) and unknown fields are skipped."""

    event: str = ""
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self.data and not self.event:
                return None
            done = (self.event or "message", "\n".join(self.data))
            self.event, self.data = "", []
            return done
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


class Watch:
    """What `as_completed` still waits for. Each stream it opens asks for (a chunk of) the pending ids; each
    job event takes one off; a stream that ends without `end`, or breaks, is opened again for what is left,
    on whichever broker answers (the request layer moves between brokers), so nothing is lost or seen twice."""

    def __init__(self, ids: Sequence[str], timeout: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pending: dict[str, None] = dict.fromkeys(ids)  # ordered: chunks keep the caller's order
        self.total = len(self.pending)
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self.timeout = timeout
        self.breaks = 0
        self.ended = False
        self._turn = 0
        self._parser = SseParser()

    def body(self) -> dict[str, Any]:
        """The next stream's request: a chunk of the pending ids, in turn. TimeoutError when the deadline is past."""
        wait = WATCH_WAIT_S if len(self.pending) <= MAX_WATCH else ROTATE_WAIT_S
        if self.deadline is not None:
            left = self.deadline - self.clock()
            if left <= 0:
                raise TimeoutError(f"{len(self.pending)} of {self.total} jobs were not finished after "
                                   f"{self.timeout} s (first: {next(iter(self.pending))})")
            wait = min(wait, left)
        pending = list(self.pending)
        chunks = [pending[i:i + MAX_WATCH] for i in range(0, len(pending), MAX_WATCH)]
        ids = chunks[self._turn % len(chunks)]
        self._turn += 1
        self.ended = False
        self._parser = SseParser()
        return {"ids": ids, "wait_s": round(wait, 3)}

    def feed(self, line: str) -> JobInfo | None:
        """One line of the stream: the job it finishes, if any (each id once)."""
        event = self._parser.feed(line)
        if event is None:
            return None
        name, data = event
        if name == "end":
            self.ended = True
            self.breaks = 0
            return None
        if name != "job":
            return None
        job = JobInfo.from_json(json.loads(data))
        if job.id not in self.pending:
            return None
        del self.pending[job.id]
        self.breaks = 0
        return job

    def broken(self, exc: StreamBroken | None = None) -> None:
        """A stream broke off or closed before `end`: resumed, unless that kept happening with nothing read."""
        self.breaks += 1
        if self.breaks >= MAX_BREAKS:
            why = f": {exc.message}" if exc is not None else " (closed before its end)"
            raise StreamBroken(f"the job watch broke off {self.breaks} times in a row without news{why}",
                               {"pending": len(self.pending)}) from exc


class InOrder:
    """Finished jobs (any order) released in the order of `ids`: `add` one, get back those now due."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = ids
        self.held: dict[str, JobInfo] = {}  # kept: one job may stand for several items (a repeated key)
        self.position = 0

    def add(self, job: JobInfo) -> list[JobInfo]:
        self.held[job.id] = job
        due = []
        while self.position < len(self.ids) and self.ids[self.position] in self.held:
            due.append(self.held[self.ids[self.position]])
            self.position += 1
        return due


def finished_in_order(ids: Sequence[str], finished: Iterable[JobInfo]) -> Iterator[JobInfo]:
    """`finished` re-ordered as `ids` lists them, each yielded as soon as those before it are."""
    order = InOrder(ids)
    for job in finished:
        yield from order.add(job)
