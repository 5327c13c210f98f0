"""Signed port links and cookies, host-form names, and which pod is a caller's session (broker.api.portlinks,
broker.running.sessionstreams): pure, no process."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.api.auth import Identity
from broker.api.portlinks import (
    Grant,
    PortSettings,
    Signer,
    host_label,
    load_key,
    parse_host,
    parse_range,
    still_valid,
)
from broker.errors import InvalidRequest, NotFound
from broker.jobs import Job, JobSpec, JobState
from broker.pods import Pod, PodState
from broker.running.sessionstreams import SessionStreams

GRANT = Grant("alice", "web", 8000, 1000.0, "sha256:" + "0" * 64)


def test_a_grant_verifies_under_its_key_and_kind_until_it_expires() -> None:
    signer = Signer(b"k" * 32)
    token = signer.sign("link", GRANT)
    assert signer.verify("link", token, 999.0) == GRANT
    assert signer.verify("link", token, 1000.0) is None  # expired
    assert signer.verify("cookie", token, 999.0) is None  # a link is no cookie
    assert Signer(b"x" * 32).verify("link", token, 999.0) is None  # another broker's key


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),
    lambda t: "e" + t[1:] if t[0] != "e" else "f" + t[1:],
    lambda t: t.split(".")[0],
    lambda t: "",
    lambda t: "x" * 5000,
    lambda t: "!!!." + t.split(".")[1],
])
def test_a_tampered_token_is_refused(mangle) -> None:  # type: ignore[no-untyped-def]
    signer = Signer(b"k" * 32)
    assert signer.verify("link", mangle(signer.sign("link", GRANT)), 0.0) is None


def test_a_grant_dies_with_its_token_leaving_the_tokens_file() -> None:
    assert still_valid(GRANT, lambda d: Identity("alice"))
    assert not still_valid(GRANT, lambda d: None)
    assert not still_valid(GRANT, lambda d: Identity("bob"))
    assert still_valid(Grant("alice", "web", 8000, 1.0, "jwt:abc"), lambda d: None)


@pytest.mark.parametrize("tag", ["web", "a-b-c", "MyTag", "a--b", "-x", "über", "a/b c", "x" * 30])
def test_a_host_label_names_its_tag_and_port_back(tag: str) -> None:
    label = host_label(tag, 8080)
    assert label is not None and len(label) <= 63
    assert parse_host(f"{label}.ports.example.com:8443", "ports.example.com") == (tag, 8080)
    assert parse_host(f"{label.upper()}.Ports.Example.Com.", "ports.example.com") == (tag, 8080)  # DNS ignores case


def test_hosts_that_are_not_port_hosts_are_left_to_the_api() -> None:
    for host in ("broker.example.com", "ports.example.com", "web.ports.example.com", "8000.ports.example.com",
                 "8000-a_b.ports.example.com", "x8000-web.ports.example.com", "8000-web.other.com"):
        assert parse_host(host, "ports.example.com") is None, host
    assert host_label("x" * 60, 8000) is None  # too long for one DNS label: the path form only


def test_the_port_range_is_a_setting_and_outside_it_a_typed_422() -> None:
    assert parse_range("2000-3000") == (2000, 3000)
    for bad in ("3000-2000", "0-10", "1-70000", "80", "a-b"):
        with pytest.raises(ValueError):
            parse_range(bad)
    settings = PortSettings(low=2000, high=3000)
    settings.check_port(2000)
    with pytest.raises(InvalidRequest) as info:
        settings.check_port(1999)
    assert info.value.details["field"] == "port" and info.value.status == 422


def test_the_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    key = load_key(tmp_path)
    assert load_key(tmp_path) == key and len(key) == 32
    assert (tmp_path / "port-links.key").stat().st_mode & 0o077 == 0


class _Pods:
    def __init__(self, *pods: Pod) -> None:
        self.pods = pods

    def snapshot(self) -> list[Pod]:
        return list(self.pods)


def test_a_running_pod_belongs_to_its_jobs_session_and_an_idle_one_to_its_key() -> None:
    running = Pod("p1", "cpu", state=PodState.RUNNING)
    running.job = "j1"  # a running pod has no key until its job is released
    idle = Pod("p2", "cpu", state=PodState.IDLE)
    idle.key = ("alice", "default", "old")
    job = Job("j1", "alice", JobSpec(pool="cpu", command=("true",), lease_tag="web"), state=JobState.RUNNING)
    streams = SessionStreams(_Pods(running, idle), agents=None, live={"j1": job})  # type: ignore[arg-type]
    assert streams.pod("alice", "web") is running
    assert streams.pod("alice", "old") is idle
    for caller, tag in (("bob", "web"), ("alice", "nope")):
        with pytest.raises(NotFound):
            streams.pod(caller, tag)
