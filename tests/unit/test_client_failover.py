"""Clients follow the leader: FIREPOOL_URL lists the brokers of one store; a client sticks to the one that
answered last, moves on at once (to the leader a NotLeader names, else round-robin) while some broker is
untried, then backs off per its RetryPolicy, within the policy's budget, and never repeats what could act twice."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from broker.cli_e2b import cmd_e2b_env
from broker.client import AsyncClient, Client
from broker.errors import NotLeader, StreamBroken, Unavailable
from broker.locations import Brokers, discover, split_urls, url_key
from broker.retrying import RetryPolicy
from broker.sandbox.handle import AsyncSandbox
from jupyter_ext.kernelspec import kernel_json
from jupyter_ext.provisioner import FirepoolProvisioner
from mcp_server.client_config import server_env
from mcp_server.identity import HttpBroker, StdioBroker

A, B, C = "http://a:1", "http://b:2", "http://c:3"
JOB = {"id": "j-1", "state": "RUNNING", "caller": "alice", "pool": "cpu"}


def not_leader(leader: str | None) -> httpx.Response:
    return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {
        "class": "NotLeader", "message": "this broker is a standby", "retryable": True,
        "details": {"leader": leader, "term": 3}}})


Step = httpx.Response | type[Exception] | Callable[[httpx.Request], httpx.Response]


class Fleet:
    """A fake transport: each host answers with its script (the last step repeats); `seen` is every try."""

    def __init__(self, **scripts: list[Step]) -> None:
        self.scripts = scripts
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        script = self.scripts[request.url.host]
        step = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(step, httpx.Response):
            return step
        if isinstance(step, type):
            raise step("scripted failure", request=request)  # type: ignore[call-arg]
        return step(request)

    @property
    def hosts(self) -> str:
        return "".join(r.url.host for r in self.seen)


def serves(body: dict[str, object], status: int = 200) -> httpx.Response:
    return httpx.Response(status, json=body)


def client(fleet: Fleet, sleeps: list[float], urls: str = f"{A},{B},{C}", attempts: int = 4) -> Client:
    return Client(urls, "tok", transport=httpx.MockTransport(fleet), sleep=sleeps.append,
                  retry=RetryPolicy(attempts=attempts, rng=random.Random(1)))


def test_a_list_is_split_trimmed_and_deduplicated_in_order() -> None:
    assert split_urls(" http://a:1/ ,, http://b:2,http://A:1") == ("http://a:1", "http://b:2")
    assert split_urls(["http://a:1", "http://b:2,http://c:3"]) == ("http://a:1", "http://b:2", "http://c:3")
    assert discover(env={"FIREPOOL_URL": f"{A}/, {B}", "FIREPOOL_TOKEN": "t"}).urls == (A, B)
    assert discover(f"{A},{B}", "t", env={}).url == f"{A},{B}"


def test_leader_urls_compare_by_scheme_host_and_port() -> None:
    assert url_key("http://Broker-1") == url_key("http://broker-1:80/") == "http://broker-1:80"
    assert url_key("https://b") == "https://b:443" != url_key("http://b:443")
    brokers = Brokers(["http://broker-0:8321", "http://broker-1:8321/prefix"])
    assert brokers.index_of("http://BROKER-1:8321") == 1 and brokers.index_of("http://other:8321") is None


def test_a_round_goes_round_robin_from_the_sticky_broker_and_each_once() -> None:
    brokers = Brokers([A, B, C])
    first = brokers.round()
    assert first.move_on() and first.url == B
    first.answered()
    walk = brokers.round()
    visited = [walk.url]
    while walk.move_on():
        visited.append(walk.url)
    assert visited == [B, C, A] and walk.url == B  # all tried: after the back-off, the next round from B
    walk.again()
    assert walk.move_on() and walk.url == C


def test_a_dead_url_and_a_standby_lead_to_the_leader_at_once() -> None:
    fleet = Fleet(a=[httpx.ConnectError], b=[not_leader(C)], c=[serves({"caller": "alice"})])
    sleeps: list[float] = []
    fp = client(fleet, sleeps)
    assert fp.whoami() == "alice" and fleet.hosts == "abc" and sleeps == []
    assert fp.url == C and fp.urls == (C, A, B)


def test_the_client_sticks_to_the_broker_that_answered_last() -> None:
    fleet = Fleet(a=[httpx.ConnectError], b=[serves({"caller": "alice"})], c=[serves({"caller": "x"})])
    fp = client(fleet, [])
    assert [fp.whoami(), fp.whoami(), fp.whoami()] == ["alice"] * 3
    assert fleet.hosts == "abbb"


def test_the_leader_named_by_a_standby_is_asked_next_before_the_round_robin() -> None:
    fleet = Fleet(a=[not_leader("http://C:3/")], b=[serves({"caller": "b"})], c=[serves({"caller": "c"})])
    assert client(fleet, []).whoami() == "c" and fleet.hosts == "ac"


def test_a_leader_that_is_not_configured_is_not_followed_the_next_url_is() -> None:
    fleet = Fleet(a=[not_leader("http://elsewhere:9")], b=[serves({"caller": "b"})], c=[serves({"caller": "c"})])
    assert client(fleet, []).whoami() == "b" and fleet.hosts == "ab"


def test_once_every_broker_was_tried_the_client_backs_off_within_its_budget() -> None:
    fleet = Fleet(a=[not_leader(None)], b=[httpx.ConnectError], c=[not_leader(None)])
    sleeps: list[float] = []
    with pytest.raises(NotLeader, match="standby"):
        client(fleet, sleeps, attempts=3).whoami()
    assert fleet.hosts == "abc" * 3  # three rounds (the policy's attempts), each broker once a round
    assert len(sleeps) == 2 and all(s > 0 for s in sleeps)


def test_an_election_in_progress_is_waited_out_and_the_new_leader_found() -> None:
    fleet = Fleet(a=[httpx.ConnectError], b=[not_leader(None), not_leader(C)],
                  c=[not_leader(None), serves({"caller": "alice"})])
    sleeps: list[float] = []
    assert client(fleet, sleeps).whoami() == "alice"
    assert fleet.hosts == "abc" + "ab" + "c" and len(sleeps) == 1


def test_one_url_keeps_the_single_broker_retry_rules() -> None:
    fleet = Fleet(a=[httpx.ConnectError, not_leader(None), serves({"caller": "alice"})])
    sleeps: list[float] = []
    assert client(fleet, sleeps, urls=A).whoami() == "alice" and fleet.hosts == "aaa" and len(sleeps) == 2


def test_a_broker_that_answers_with_a_retryable_error_is_not_left() -> None:
    busy = httpx.Response(503, json={"error": {"class": "StoreError", "message": "busy", "retryable": True,
                                               "details": {}}})
    fleet = Fleet(a=[busy, serves({"caller": "alice"})], b=[serves({"caller": "b"})])
    sleeps: list[float] = []
    assert client(fleet, sleeps).whoami() == "alice" and fleet.hosts == "aa" and len(sleeps) == 1


def test_a_submit_whose_leader_died_mid_request_is_repeated_on_the_next_broker_with_its_key() -> None:
    fleet = Fleet(a=[httpx.RemoteProtocolError], b=[serves(JOB, 201)])
    job = client(fleet, []).submit(["true"])
    keys = {json.loads(r.content)["idempotency_key"] for r in fleet.seen}
    assert job.id == "j-1" and fleet.hosts == "ab" and len(keys) == 1


def test_a_signal_that_may_have_reached_the_leader_is_not_repeated_on_another() -> None:
    fleet = Fleet(a=[httpx.ReadError], b=[serves(JOB)])
    with pytest.raises(Unavailable, match="cannot reach any of the brokers http://a:1, http://b:2"):
        client(fleet, [], urls=f"{A},{B}").signal("j-1", "INT")
    assert fleet.hosts == "a"


def test_a_signal_a_standby_refused_goes_to_the_leader() -> None:
    fleet = Fleet(a=[not_leader(B)], b=[serves(JOB)])
    assert client(fleet, [], urls=f"{A},{B}").signal("j-1", "INT").id == "j-1" and fleet.hosts == "ab"


def test_a_long_poll_that_loses_its_broker_asks_the_next_one() -> None:
    done = {**JOB, "state": "SUCCEEDED", "exit_code": 0}
    fleet = Fleet(a=[serves(JOB, 201), httpx.RemoteProtocolError], b=[not_leader(None)], c=[serves(done)])
    job = client(fleet, []).run(["true"])
    assert job.state == "SUCCEEDED" and fleet.hosts == "aabc"
    assert [r.url.params.get("wait_s") for r in fleet.seen] == ["60.0", "60.0", "60.0", "60.0"]


class Breaks(httpx.SyncByteStream):
    """A body that sends a first chunk, then loses its connection."""

    def __iter__(self) -> Iterator[bytes]:
        yield b"line 1\n"
        raise httpx.ReadError("connection reset by peer")


def test_a_log_stream_that_breaks_raises_stream_broken_and_is_not_resumed() -> None:
    fleet = Fleet(a=[not_leader(B)], b=[lambda request: httpx.Response(200, stream=Breaks())])
    got: list[bytes] = []
    with pytest.raises(StreamBroken, match=r"the stream from http://b:2/v1/jobs/j-1/logs.*broke off"):
        for chunk in client(fleet, [], urls=f"{A},{B}").stream_logs("j-1"):
            got.append(chunk)
    assert got == [b"line 1\n"] and fleet.hosts == "ab"


def test_the_environment_list_is_used_by_a_client_without_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIREPOOL_URL", f"{A}, {B}")
    monkeypatch.setenv("FIREPOOL_TOKEN", "tok")
    fleet = Fleet(a=[httpx.ConnectError], b=[serves({"caller": "alice"})])
    fp = Client(transport=httpx.MockTransport(fleet), sleep=lambda _: None)
    assert fp.whoami() == "alice" and fp.brokers.urls == (A, B)
    assert fleet.seen[-1].headers["Authorization"] == "Bearer tok"


def test_mcp_config_passes_the_list_on_as_it_was_given() -> None:
    assert server_env(f"{A},{B}", "tok") == {"FIREPOOL_URL": f"{A},{B}", "FIREPOOL_TOKEN": "tok"}


async def test_the_async_client_follows_the_leader_the_same_way() -> None:
    fleet = Fleet(a=[httpx.ConnectError], b=[not_leader(C)], c=[serves(JOB, 201), serves({"caller": "alice"})])
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncClient([A, B, C], "tok", transport=httpx.MockTransport(fleet), sleep=sleep) as fp:
        job = await fp.submit(["true"])
        caller = await fp.whoami()
    assert job.id == "j-1" and caller == "alice" and fleet.hosts == "abcc" and sleeps == []


class CommandBreaks(httpx.AsyncByteStream):
    """A streamed command whose broker dies: the job event (and, unless `early`, a first output), then a reset."""

    def __init__(self, early: bool = False) -> None:
        self.early = early

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if not self.early:
            yield json.dumps({"event": "job", "job": JOB}).encode() + b"\n"
            yield json.dumps({"event": "stdout", "data": "hel"}).encode() + b"\n"
        raise httpx.ReadError("connection reset by peer")


def sandbox_fleet(stream: CommandBreaks) -> Fleet:
    done = {**JOB, "state": "SUCCEEDED", "exit_code": 0}

    def leader(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/commands"):
            return httpx.Response(200, stream=stream)
        if request.url.path.endswith("/logs"):
            return httpx.Response(200, content=b"hello\n" if request.url.params["stream"] == "stdout" else b"")
        return serves(done)

    return Fleet(a=[not_leader(B)], b=[leader])


async def test_a_streamed_command_whose_broker_goes_away_ends_from_its_durable_job() -> None:
    fleet = sandbox_fleet(CommandBreaks())
    seen: list[str] = []
    async with AsyncClient([A, B], "tok", transport=httpx.MockTransport(fleet)) as fp:
        result = await AsyncSandbox(fp, "s1").run("echo hello", on_stdout=seen.append)
    assert (result.state, result.exit_code, result.stdout) == ("SUCCEEDED", 0, "hello\n") and "hel" in seen
    assert [r.url.path for r in fleet.seen] == ["/v1/sessions/s1/commands", "/v1/sessions/s1/commands",
                                                "/v1/jobs/j-1", "/v1/jobs/j-1/logs", "/v1/jobs/j-1/logs"]


async def test_a_streamed_command_that_breaks_before_its_job_is_known_raises_stream_broken() -> None:
    fleet = sandbox_fleet(CommandBreaks(early=True))
    async with AsyncClient([A, B], "tok", transport=httpx.MockTransport(fleet)) as fp:
        with pytest.raises(StreamBroken):
            await AsyncSandbox(fp, "s1").run("echo hello", on_stdout=lambda _: None)


async def test_the_mcp_server_and_the_jupyter_provisioner_build_on_the_same_client() -> None:
    stdio = StdioBroker(f"{A}, {B}", "tok")
    provisioner = FirepoolProvisioner(url=f"{A},{B}")
    try:
        assert stdio.client()[1].brokers.urls == (A, B) and provisioner.client().brokers.urls == (A, B)
        assert HttpBroker(f"{A},{B}", {"secret": "alice"}).url == f"{A},{B}"  # its per-caller clients get the list
    finally:
        await stdio.close()
        await provisioner.client().close()


def test_an_installed_kernelspec_keeps_the_whole_list() -> None:
    spec = kernel_json("cpu", url=discover(f"{A}/,{B}", "-", env={}).url)
    assert spec["metadata"]["kernel_provisioner"]["config"]["url"] == f"{A},{B}"


def test_e2b_env_gives_e2bs_one_url_sdks_the_first_broker_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(url=f"{A},{B}", token="tok", state_dir=None)
    assert cmd_e2b_env(args) == 0
    out, err = capsys.readouterr()
    assert f"E2B_API_URL={A}/e2b" in out and B not in out and "take one URL" in err
