"""One set of limits: what the broker admits, the agent accepts and execve can take."""

from __future__ import annotations

import json

import pytest

from broker.claiming.admission import admit
from broker.errors import InvalidRequest
from broker.jobs import JobSpec
from broker.pools import default_catalog
from firepool_agent import limits, wire
from firepool_agent.server import MAX_BODY

POOLS = default_catalog(0).pools


def launch_body(argv: list[str], env: dict[str, str]) -> bytes:
    return json.dumps({"attempt_id": "j1:0", "argv": argv, "env": env, "session": "s"}).encode()


def broker_env(job_env: dict[str, str]) -> dict[str, str]:
    """What the executor adds to a caller's env (FIREPOOL_*, topology, GPU limits), generously sized."""
    return {**job_env, **{f"FIREPOOL_X{i}": "y" * 200 for i in range(20)}, "MASTER_ADDR": "127.0.0.1"}


def biggest_admissible(char: str) -> tuple[list[str], dict[str, str]]:
    """argv and env as large as the door admits, each argument filled with `char`."""
    per = limits.MAX_ARG_BYTES // len(char.encode())
    argv, budget = ["python3"], limits.MAX_CALLER_EXEC_BYTES - limits.exec_bytes(["python3"], {})
    while budget > limits.MAX_ARG_STRLEN + 16:
        argv.append(char * per)
        budget -= limits.exec_bytes([argv[-1]], {})
    return argv, {"TAIL": char * ((budget - 64) // len(char.encode()))}


@pytest.mark.parametrize("char", ["x", "\x01", "é", "😀"])
def test_whatever_the_door_admits_the_agent_accepts_and_execve_can_take(char: str) -> None:
    argv, env = biggest_admissible(char)
    job = admit(JobSpec(pool="cpu", command=tuple(argv), env=env), "alice", POOLS, 1.0)
    full_env = broker_env(dict(job.spec.env))
    body = launch_body(list(job.spec.command), full_env)
    assert len(body) < MAX_BODY  # even \x01 (6 bytes escaped in JSON) fits the agent's body limit
    spec = wire.parse_launch(body)
    assert limits.exec_bytes(spec.argv, spec.env) <= limits.exec_limit() <= 2 << 20


def test_one_byte_over_the_callers_budget_is_refused_at_the_door() -> None:
    argv, env = biggest_admissible("x")
    spare = limits.MAX_CALLER_EXEC_BYTES - limits.exec_bytes(argv, env)
    env["TAIL"] += "x" * (spare + 1)
    with pytest.raises(InvalidRequest) as refused:
        admit(JobSpec(pool="cpu", command=tuple(argv), env=env), "alice", POOLS, 1.0)
    assert refused.value.details["limit"] == limits.MAX_CALLER_EXEC_BYTES


@pytest.mark.parametrize("argv, env", [
    (["echo", "a\x00b"], {}), (["echo", "\ud800"], {}), (["echo"], {"A": "\udc80"}), (["echo"], {"A=B": "1"}),
    (["echo", "x" * limits.MAX_ARG_STRLEN], {}), (["echo"], {"A": "x" * limits.MAX_ARG_STRLEN}),
    (["echo", *["x" * 100_000] * 30], {}), (["x"] * (limits.MAX_ARGV_ITEMS + 1), {}),
])
def test_the_agent_refuses_a_launch_execve_would_refuse_with_a_400(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(wire.HttpError) as refused:
        wire.parse_launch(launch_body(argv, env))
    assert refused.value.status == 400


def test_the_agent_takes_operator_env_names_the_door_would_not() -> None:
    spec = wire.parse_launch(launch_body(["true"], {"my.var": "1", "1X": "2"}))
    assert spec.env == {"my.var": "1", "1X": "2"}


def test_text_problems_name_nul_and_lone_surrogates() -> None:
    assert limits.text_problem("fine ü 😀") is None
    assert "NUL" in (limits.text_problem("a\x00") or "")
    assert "U+D800" in (limits.text_problem("\ud800") or "")
    assert limits.exec_bytes(["ab"], {"K": "é"}) == (2 + 1 + 8) + (1 + 2 + 2 + 8)


def test_exec_bytes_counts_every_string_as_execve_does_whatever_its_text() -> None:
    argv, env = ["true", "a\ud800é"], {"K": "\udc00", "LONG": "x" * 300, "É": "😀"}
    one_by_one = sum(len(a.encode("utf-8", "surrogatepass")) + 1 + 8 for a in argv) + sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) + 2 + 8
        for k, v in env.items())
    assert limits.exec_bytes(argv, env) == one_by_one
