"""Ray mode's launch wrapping on the agent, and the request field that asks for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from broker.api.schemas import JobRequest, job_view
from broker.jobs import Job
from firepool_agent import raymode


def test_only_a_ray_job_is_wrapped_rank_0_as_head_and_the_rest_as_workers() -> None:
    cmd = ("python3", "train.py")
    assert raymode.wrap(cmd, {"FIREPOOL_RANK": "0"}, {}, "/run/fp") is None
    head = raymode.wrap(cmd, {"FIREPOOL_RANK": "0"}, {"mode": "ray"}, "/run/fp")
    worker = raymode.wrap(cmd, {"FIREPOOL_RANK": "3"}, {"mode": "ray"}, "/run/fp")
    assert head is not None and worker is not None
    assert head[0] == sys.executable and head[3:] == ("head", "/run/fp/ray", "--", *cmd)
    assert worker[3:] == ("worker", "/run/fp/ray", "--", *cmd)
    # Ray's Unix socket paths must fit: a long run dir moves the session to a short /tmp path.
    long = raymode.wrap(cmd, {"FIREPOOL_RANK": "0"}, {"mode": "ray"}, "/" + "x" * 60)
    assert long is not None and long[4].startswith("/tmp/fp-ray-head-")


def test_the_wrapper_refuses_a_malformed_command_line() -> None:
    assert raymode.main(["boss", "/tmp/x", "--", "true"]) == 2
    assert raymode.main(["head", "/tmp/x", "true"]) == 2


def test_a_rank_finds_the_address_that_reaches_the_head() -> None:
    assert raymode.own_address("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(("mode", "extra"), [("plain", {}), ("ray", {"mode": "ray"})])
def test_mode_ray_rides_in_the_spec_and_shows_in_the_job_view(mode: str, extra: dict[str, str]) -> None:
    spec = JobRequest(command=["python3", "driver.py"], pods=2, mode=mode).to_spec()  # type: ignore[arg-type]
    assert dict(spec.extra) == extra
    view = job_view(Job(id="j1", caller="alice", spec=spec))
    assert view.get("mode") == extra.get("mode")  # absent unless set, like every unset field


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        JobRequest(command=["true"], mode="spark")  # type: ignore[arg-type]


def _cgroups(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "proc").write_text(proc)
    for rel, text in files.items():
        (tmp_path / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / rel).write_text(text)
    return str(tmp_path / "proc"), str(tmp_path / "fs")


@pytest.mark.parametrize(
    ("proc", "files", "quota"),
    [
        (
            "0::/firepool/pod-1\n",
            {"firepool/pod-1/cpu.max": "150000 100000\n"},
            1.5,
        ),  # v2, the pod's own cgroup
        ("0::/firepool/pod-1\n", {"firepool/pod-1/cpu.max": "max 100000\n"}, None),  # v2, no limit
        (
            "4:memory:/x\n3:cpu,cpuacct:/firepool/pod-2\n",  # v1, a shared mount
            {
                "cpu,cpuacct/firepool/pod-2/cpu.cfs_quota_us": "200000\n",
                "cpu,cpuacct/firepool/pod-2/cpu.cfs_period_us": "100000\n",
            },
            2.0,
        ),
        (
            "3:cpu,cpuacct:/\n",
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            None,
        ),
        ("0::/gone\n", {}, None),  # no file: no limit known
    ],
)
def test_a_ray_node_counts_the_cpus_of_its_pods_cgroup_not_the_hosts(
    tmp_path: Path, proc: str, files: dict[str, str], quota: float | None
) -> None:
    assert raymode._cgroup_cpu_quota(*_cgroups(tmp_path, proc, files)) == quota


def test_a_pods_cpu_count_is_its_quota_rounded_down_and_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))
    for quota, expected in [(None, cores), (0.5, 1), (1.0, 1), (1.9, 1), (1000.0, cores)]:
        monkeypatch.setattr(raymode, "_cgroup_cpu_quota", lambda q=quota: q)
        assert raymode.pod_cpus() == expected
