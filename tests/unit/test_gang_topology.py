"""Gang topology: every rank gets its rank and rank 0's rendezvous; callers cannot steer either."""

from __future__ import annotations

import pytest

from broker.errors import BackendError
from broker.jobs import ErrorClass, Job, JobSpec, JobState, new_job_id, transition
from broker.pods import PodState
from broker.running.topology import Rendezvous
from tests.unit.harness import Harness, cpu_pool

TOPOLOGY = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")


def _launch_env(h: Harness, job: Job) -> list[dict[str, str]]:
    """Each rank's launch environment, in rank order."""
    envs = []
    for name in job.pods:
        [request] = [r for r in h.backend.agents[name].launches if r.attempt_id.startswith(job.id)]
        envs.append(dict(request.env))
    return envs


async def test_every_rank_gets_its_rank_and_meets_at_rank0() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.run_job("bob", pods=3, command=("sleep", "1"))
        assert job.state is JobState.SUCCEEDED
        envs = _launch_env(h, job)
        assert [e["RANK"] for e in envs] == ["0", "1", "2"]
        assert [e["NODE_RANK"] for e in envs] == ["0", "1", "2"]
        assert {e["WORLD_SIZE"] for e in envs} == {"3"}
        assert {e["LOCAL_RANK"] for e in envs} == {"0"}
        assert {e["MASTER_ADDR"] for e in envs} == {f"{job.pods[0]}.fake"}  # rank 0's pod is the coordinator
        assert len({e["MASTER_PORT"] for e in envs}) == 1
        assert [e["FIREPOOL_COORDINATOR"] for e in envs] == ["1", "0", "0"]
        assert {e["PET_NNODES"] for e in envs} == {"3"}  # a bare `torchrun script.py` forms the same gang
    finally:
        await h.stop()


async def test_two_gangs_get_distinct_rendezvous_ports() -> None:
    h = await Harness([cpu_pool(max_count=4)]).start()
    try:
        a, b = [await h.submit("bob", lease_tag=t, pods=2, command=("sleep", "1")) for t in ("a", "b")]
        a, b = await h.finish(a), await h.finish(b)
        ports = {_launch_env(h, j)[0]["MASTER_PORT"] for j in (a, b)}
        assert len(ports) == 2
    finally:
        await h.stop()


async def test_caller_env_cannot_set_topology_and_is_told_why() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        env = {"MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "1", "RANK": "5", "WORLD_SIZE": "64", "LOCAL_RANK": "3",
               "NODE_RANK": "7", "PET_NNODES": "64", "TORCHELASTIC_RUN_ID": "x", "FIREPOOL_RANK": "9",
               "GROUP_WORLD_SIZE": "64", "MY_SETTING": "kept"}
        job = await h.run_job("bob", pods=2, env=env, command=("sleep", "1"))
        dropped = {d["name"] for d in job.dropped_env}
        assert dropped == set(env) - {"MY_SETTING"}
        assert all("topology" in d["reason"] or "FIREPOOL" in d["reason"] for d in job.dropped_env)
        for rank, got in enumerate(_launch_env(h, job)):
            assert got["MY_SETTING"] == "kept"
            assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["NODE_RANK"]) == (str(rank), "2", "0",
                                                                                            str(rank))
            assert got["MASTER_ADDR"] == f"{job.pods[0]}.fake" and got["MASTER_PORT"] != "1"
            assert got["PET_NNODES"] == "2" and "TORCHELASTIC_RUN_ID" not in got and got["FIREPOOL_RANK"] == str(rank)
    finally:
        await h.stop()


async def test_topology_wins_over_a_stored_spec_that_carries_it() -> None:
    """A row written without the filter (an older broker, a hand-edited store) still cannot steer ranks."""
    h = await Harness([cpu_pool()]).start()
    try:
        now = h.clock.now()
        spec = JobSpec(pool="cpu", command=("sleep", "1"), pods=2, env={"RANK": "7", "MASTER_ADDR": "evil"})
        raw = transition(Job(id=new_job_id(now), caller="bob", spec=spec, timings={"submitted_at": now}),
                         JobState.QUEUED, now)
        h.cp.dispatcher.enqueue(await h.cp.book.insert(raw))
        job = await h.finish(raw)
        assert job.state is JobState.SUCCEEDED
        envs = _launch_env(h, job)
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {e["MASTER_ADDR"] for e in envs} == {f"{job.pods[0]}.fake"}
    finally:
        await h.stop()


async def test_release_resets_every_pod_of_the_gang() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.run_job("bob", pods=3, command=("sleep", "1"))
        await h.run_for(0.5)
        assert all(len(h.backend.agents[n].resets) == 1 for n in job.pods)
        pods = {p.name: p for p in h.cp.tracker.snapshot()}
        assert all(pods[n].state is PodState.IDLE and pods[n].job is None for n in job.pods)
        # The pods return as independent warm workers: three 1-pod jobs of the same session take them.
        singles = [await h.submit("bob", command=("sleep", "1")) for _ in range(3)]
        done = [await h.finish(j) for j in singles]
        assert sorted(n for d in done for n in d.pods) == sorted(job.pods)
    finally:
        await h.stop()


async def test_a_gang_whose_ranks_cannot_meet_fails_as_a_whole_before_any_rank_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h = await Harness([cpu_pool()]).start()

    def no_meeting(coordinator: str, world: int, *members: object) -> Rendezvous:
        raise BackendError("pods have a private network")

    monkeypatch.setattr(h.backend, "rendezvous", no_meeting)
    try:
        job = await h.run_job("bob", pods=2, command=("sleep", "1"))
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.LAUNCH_ERROR
        assert "private network" in (job.error_message or "")
        assert all(h.backend.agents[n].launches == [] for n in job.pods)
        await h.run_for(0.5)
        assert all(len(h.backend.agents[n].resets) == 1 for n in job.pods)
    finally:
        await h.stop()
