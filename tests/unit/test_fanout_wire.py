"""The SDK's fan-out against the batch and watch routes' contract: what `submit_many` sends (one body per item,
its own idempotency key, 1000 to a request, refusals indexed over the whole list), how `as_completed` follows
`POST /v1/jobs:watch` (finish order, each job once, resumed after a pending `end` or a broken stream, on
another broker), and `map`'s two orders, for `Client` and `AsyncClient`."""

from __future__ import annotations

import json

import httpx
import pytest

from broker import intake
from broker.client import AsyncClient, Client
from broker.errors import InvalidRequest, StreamBroken
from broker.fanout import MAX_BATCH, MAX_BATCH_BYTES, MAX_WATCH, ROTATE_WAIT_S, SseParser, Watch
from broker.retrying import safe_to_repeat
from tests.unit.fanout_fake import FakeBroker, Plan

A, B = "http://a:1", "http://b:2"


def client(fake: FakeBroker, urls: str = A) -> Client:
    return Client(urls, "tok", transport=fake.transport(), sleep=lambda _: None)


def test_the_sdks_limits_are_the_brokers() -> None:
    assert (MAX_BATCH, MAX_WATCH) == (intake.MAX_BATCH, intake.MAX_WATCH)


def test_items_become_bodies_with_shared_defaults_their_own_overrides_and_a_key_each() -> None:
    fake = FakeBroker()
    with client(fake) as fp:
        jobs = fp.submit_many([["echo", "a"], {"command": ["echo", "b"], "pool": "gpu", "env": {"X": "1"}}],
                              pool="cpu", lease_tag="rl", env={"X": "0"}, timeout_s=None)
    assert [j.id for j in jobs] == ["j-0", "j-1"] and len(fake.batches) == 1
    first, second = fake.batches[0]
    assert {k: v for k, v in first.items() if k != "idempotency_key"} == {
        "pool": "cpu", "command": ["echo", "a"], "lease_tag": "rl", "env": {"X": "0"}}
    assert (second["pool"], second["env"], second["lease_tag"]) == ("gpu", {"X": "1"}, "rl")
    keys = [first["idempotency_key"], second["idempotency_key"]]
    assert all(k.startswith("sdk-") for k in keys) and len(set(keys)) == 2


def test_a_long_list_goes_in_chunks_of_the_batch_limit_and_comes_back_in_order() -> None:
    fake = FakeBroker()
    with client(fake) as fp:
        jobs = fp.submit_many([["echo", str(i)] for i in range(2 * MAX_BATCH + 5)])
    assert [len(b) for b in fake.batches] == [MAX_BATCH, MAX_BATCH, 5]
    assert [j.id for j in jobs] == [f"j-{i}" for i in range(2 * MAX_BATCH + 5)]


def test_long_commands_split_a_batch_before_the_request_grows_past_the_byte_budget() -> None:
    fake = FakeBroker()
    arg = "x" * 100_000
    with client(fake) as fp:
        jobs = fp.submit_many([["echo", arg]] * 25)
    sizes = [len(json.dumps({"jobs": b})) for b in fake.batches]
    assert len(fake.batches) == 3 and max(sizes) <= MAX_BATCH_BYTES + 1000 and len(jobs) == 25


def test_a_refused_item_is_named_by_its_index_in_the_whole_list() -> None:
    fake = FakeBroker(refuse={1: 3})  # the second request refuses its fourth item
    with client(fake) as fp, pytest.raises(InvalidRequest) as refused:
        fp.submit_many([["true"]] * (MAX_BATCH + 10))
    assert refused.value.details == {"index": MAX_BATCH + 3, "submitted": MAX_BATCH}


@pytest.mark.parametrize("item", ["echo hi", {"pool": "cpu"}, [], {"command": "echo hi"}])
def test_an_item_that_is_not_a_job_is_refused_before_anything_is_sent(item: object) -> None:
    fake = FakeBroker()
    with client(fake) as fp, pytest.raises(InvalidRequest, match="item 1") as refused:
        fp.submit_many([["true"], item])  # type: ignore[list-item]
    assert refused.value.details == {"index": 1} and fake.batches == []


def test_a_batch_with_every_key_and_a_watch_may_be_sent_again_a_batch_without_keys_may_not() -> None:
    def post(path: str, body: object) -> httpx.Request:
        return httpx.Request("POST", A + path, json=body)

    assert safe_to_repeat(post("/v1/jobs:batch", {"jobs": [{"idempotency_key": "k1"}, {"idempotency_key": "k2"}]}))
    assert not safe_to_repeat(post("/v1/jobs:batch", {"jobs": [{"idempotency_key": "k1"}, {"command": ["x"]}]}))
    assert safe_to_repeat(post("/v1/jobs:watch", {"ids": ["j-1"]}))


def test_a_batch_whose_answer_was_lost_is_sent_again_with_the_same_keys_and_creates_each_job_once() -> None:
    fake = FakeBroker()
    lost = [True]

    def flaky(request: httpx.Request) -> httpx.Response:
        response = fake(request)
        if lost.pop() if lost else False:
            raise httpx.ReadError("reset after the broker acted")
        return response

    with Client(A, "tok", transport=httpx.MockTransport(flaky), sleep=lambda _: None) as fp:
        jobs = fp.submit_many([["a"], ["b"]])
    assert len(fake.batches) == 2 and fake.batches[0] == fake.batches[1]
    assert [j.id for j in jobs] == ["j-0", "j-1"] and len(fake.jobs) == 2


def test_jobs_come_back_in_finish_order_each_once() -> None:
    fake = FakeBroker(finish_order="reverse")
    with client(fake) as fp:
        jobs = fp.submit_many([["echo", str(i)] for i in range(5)])
        done = list(fp.as_completed([*jobs, jobs[0].id]))
    assert [j.id for j in done] == ["j-4", "j-3", "j-2", "j-1", "j-0"] and all(j.terminal for j in done)
    assert fake.watches == [{"ids": ["j-0", "j-1", "j-2", "j-3", "j-4"], "wait_s": 60.0}]


def test_an_end_with_pending_jobs_is_followed_by_a_watch_of_just_those() -> None:
    fake = FakeBroker(plans=[Plan(events=2), Plan(events=0), Plan()])
    with client(fake) as fp:
        done = [j.id for j in fp.as_completed(["j-0", "j-1", "j-2"] if fp.submit_many([["x"]] * 3) else [])]
    assert done == ["j-0", "j-1", "j-2"]
    assert [w["ids"] for w in fake.watches] == [["j-0", "j-1", "j-2"], ["j-2"], ["j-2"]]


def test_a_broken_stream_is_resumed_on_the_other_broker_for_what_it_had_not_sent() -> None:
    fake = FakeBroker(plans=[Plan(events=1, breaks=True), Plan()])
    with client(fake, f"{A},{B}") as fp:
        jobs = fp.submit_many([["x"]] * 3)
        fake.hosts.clear()
        broken_once = iter([True])

        def fail_over(request: httpx.Request) -> httpx.Response:
            if request.url.host == "a" and len(fake.watches) == 1 and next(broken_once, False):
                raise httpx.ConnectError("a is gone")
            return fake(request)

        fp._http._transport = httpx.MockTransport(fail_over)
        done = [j.id for j in fp.as_completed(jobs)]
    assert done == ["j-0", "j-1", "j-2"]
    assert [w["ids"] for w in fake.watches] == [["j-0", "j-1", "j-2"], ["j-1", "j-2"]]
    assert fake.hosts == ["a", "b"]


def test_a_watch_that_keeps_breaking_without_news_gives_up_with_stream_broken() -> None:
    fake = FakeBroker(plans=[Plan(events=1, breaks=True)] + [Plan(events=0, breaks=True)] * 10)
    with client(fake) as fp:
        jobs = fp.submit_many([["x"]] * 2)
        done = []
        with pytest.raises(StreamBroken, match="5 times in a row"):
            for job in fp.as_completed(jobs):
                done.append(job.id)
    assert done == ["j-0"] and len(fake.watches) == 5  # the break after news counts as the first


def test_a_stream_closed_before_its_end_counts_as_broken_and_is_resumed() -> None:
    fake = FakeBroker()
    with client(fake) as fp:
        jobs = fp.submit_many([["x"]] * 2)
        real = fake.watch

        def truncated(body: dict) -> httpx.Response:
            response = real(body)
            if len(fake.watches) == 1:  # the first stream loses its `end`
                response.stream.chunks = response.stream.chunks[:-1]  # type: ignore[union-attr]
            return response

        fake.watch = truncated  # type: ignore[method-assign]
        assert [j.id for j in fp.as_completed(jobs)] == ["j-0", "j-1"]
    assert len(fake.watches) == 1  # every job was in; nothing left to watch


def test_more_ids_than_one_watch_holds_are_watched_in_turns_of_a_short_wait() -> None:
    ids = [f"j-{i}" for i in range(MAX_WATCH + 1)]
    watch = Watch(ids)
    first, second = watch.body(), watch.body()
    assert (len(first["ids"]), len(second["ids"])) == (MAX_WATCH, 1)
    assert first["wait_s"] == second["wait_s"] == ROTATE_WAIT_S and watch.body()["ids"] == first["ids"]


def test_the_watch_waits_at_most_what_is_left_of_the_timeout_then_raises_timeout_error() -> None:
    now = [100.0]
    watch = Watch(["j-1"], timeout=90, clock=lambda: now[0])
    assert watch.body()["wait_s"] == 60.0
    now[0] += 75
    assert watch.body()["wait_s"] == 15.0
    now[0] += 15
    with pytest.raises(TimeoutError, match="1 of 1 jobs were not finished after 90 s"):
        watch.body()


def test_server_sent_events_skip_comments_and_join_data_lines() -> None:
    parser = SseParser()
    lines = [": keep-alive", "", "event: job", "data: {\"a\":", "data:1}", "", "event:end", "data: {}", ""]
    got = [e for e in map(parser.feed, lines) if e is not None]
    assert got == [("job", '{"a":\n1}'), ("end", "{}")] and json.loads(got[0][1]) == {"a": 1}


@pytest.mark.parametrize(("ordered", "expected"), [(True, ["j-0", "j-1", "j-2"]), (False, ["j-2", "j-1", "j-0"])])
def test_map_yields_in_input_order_or_as_jobs_finish(ordered: bool, expected: list[str]) -> None:
    fake = FakeBroker(finish_order="reverse")
    with client(fake) as fp:
        jobs = fp.map([["a"], ["b"], ["fail"]], "cpu", ordered=ordered, lease_tag="t")
        assert len(fake.batches) == 1  # submitted at the call, before the first job is asked for
        done = list(jobs)
    assert [j.id for j in done] == expected and {j.id: j.state for j in done}["j-2"] == "FAILED"
    assert fake.batches[0][0]["lease_tag"] == "t"


async def test_the_async_client_submits_follows_and_resumes_the_same_way() -> None:
    fake = FakeBroker(finish_order="reverse", plans=[Plan(events=1, breaks=True), Plan(events=1), Plan()])
    async with AsyncClient(A, "tok", transport=fake.transport(), sleep=_no_sleep) as fp:
        jobs = await fp.submit_many([["a"], ["b"], ["c"]], pool="gpu")
        unordered = [j.id async for j in fp.as_completed(jobs)]
        ordered = [j.id async for j in fp.map([["d"], ["e"]])]
    assert unordered == ["j-2", "j-1", "j-0"] and ordered == ["j-3", "j-4"]
    assert [w["ids"] for w in fake.watches[:3]] == [["j-0", "j-1", "j-2"], ["j-0", "j-1"], ["j-0"]]
    assert {b["pool"] for b in fake.batches[0]} == {"gpu"}


async def _no_sleep(_: float) -> None:
    return None
