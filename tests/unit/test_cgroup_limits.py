"""Pod limits: template parsing, and cgroup v2/v1 paths and values against a fake /sys/fs/cgroup."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from broker.backends import cgroups
from broker.backends.limits import host_memory
from broker.backends.sandboxing import LIMITS_MOUNT, PodDirs, SandboxSpec, bwrap_argv
from broker.podtemplate import DEFAULT_PIDS, GiB, Limits, parse_limits, parse_size
from firepool_agent import overlimit as agent_limits

V1_SELF = "9:name=systemd:/\n8:pids:/\n4:memory:/slice/me\n1:cpu,cpuacct:/\n0::/\n"


def v2_root(tmp_path: Path) -> Path:
    root = tmp_path / "cg2"
    (root / "svc").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids")
    return root


def v1_root(tmp_path: Path, controllers: tuple[str, ...] = ("memory", "pids", "cpu,cpuacct")) -> Path:
    root = tmp_path / "cg1"
    for name in controllers:
        (root / name).mkdir(parents=True)
        (root / name / "cgroup.procs").write_text("")
    (root / "memory" / "slice" / "me").mkdir(parents=True, exist_ok=True)
    return root


def test_sizes_take_binary_and_decimal_suffixes() -> None:
    assert parse_size("4Gi", "memory") == 4 * GiB
    assert parse_size("512Mi", "memory") == 512 << 20
    assert parse_size("1G", "memory") == 10**9
    assert parse_size(1234, "memory") == 1234
    assert parse_size(None, "memory") is None
    for bad in ("4 gigs", "-1", True, 0, [1]):
        with pytest.raises(ValueError, match="memory"):
            parse_size(bad, "memory")


def test_template_limits_default_and_cpus_come_from_the_pool() -> None:
    limits = parse_limits({}, pool_cpus=2.0, default_memory=8 * GiB)
    assert limits == Limits(memory=8 * GiB, pids=DEFAULT_PIDS, cpus=2.0)
    assert parse_limits({"memory": None}, default_memory=8 * GiB).memory is None
    assert host_memory("MemTotal:       24683652 kB\nMemFree: 1 kB\n") == 24683652 * 1024
    assert host_memory("nothing") is None
    explicit = parse_limits({"memory": "1Gi", "pids": 64, "cpus": 0.5, "workspace_size": None, "tmp_size": "64Mi"})
    assert (explicit.memory, explicit.pids, explicit.cpus, explicit.workspace_size, explicit.tmp_size) == \
        (GiB, 64, 0.5, None, 64 << 20)
    for bad in ({"pids": 2}, {"pids": "many"}, {"cpus": 0}, {"workspace_size": "1Mi"}, {"shm_size": "lots"}):
        with pytest.raises(ValueError):
            parse_limits(bad)


def test_v2_host_puts_pods_under_its_own_cgroup_with_controllers_enabled(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    host = cgroups.detect(root, "0::/svc\n")
    assert host.version == 2 and host.bases == {"unified": root / "svc" / "firepool"}
    assert (root / "svc" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (root / "svc" / "firepool" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_v2_broker_at_the_root_puts_pods_in_a_root_subtree(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    assert cgroups.detect(root, "0::/\n").bases == {"unified": root / "firepool"}
    assert not (tmp_path / "firepool").exists()


def test_v2_broker_in_a_busy_leaf_puts_pods_beside_it(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    leaf = root / "svc" / "broker"
    leaf.mkdir()
    (leaf / "cgroup.subtree_control").mkdir()  # writing fails, as the kernel refuses a cgroup with processes
    host = cgroups.detect(root, "0::/svc/broker\n")
    assert host.version == 2 and host.bases == {"unified": root / "svc" / "firepool"}
    assert not (leaf / "firepool").exists()


def test_v2_pod_cgroup_gets_memory_swap_pids_and_cpu_values(tmp_path: Path) -> None:
    host = cgroups.detect(v2_root(tmp_path), "0::/svc\n")
    pod = cgroups.create(host, "p1.abcd", Limits(memory=GiB, pids=100, cpus=1.5))
    assert pod is not None
    d = pod.dirs["unified"]
    assert (d / "memory.max").read_text() == str(GiB)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "pids.max").read_text() == "100"
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert pod.procs_files == [d / "cgroup.procs"]
    pod.join(4242)
    assert (d / "cgroup.procs").read_text() == "4242"


def test_v1_host_uses_one_subtree_per_controller_under_its_own_cgroups(tmp_path: Path) -> None:
    root = v1_root(tmp_path)
    host = cgroups.detect(root, V1_SELF)
    assert host.version == 1
    assert host.bases == {"memory": root / "memory" / "slice" / "me" / "firepool",
                          "pids": root / "pids" / "firepool", "cpu": root / "cpu,cpuacct" / "firepool"}


def test_v1_pod_cgroup_sets_memory_before_memsw_and_a_cfs_quota(tmp_path: Path) -> None:
    host = cgroups.detect(v1_root(tmp_path), V1_SELF)
    memsw = host.bases["memory"] / "p1" / "memory.memsw.limit_in_bytes"
    memsw.parent.mkdir()
    memsw.write_text("")  # the kernel has swap accounting
    assert [f for _, f, _ in cgroups.settings(Limits(memory=GiB, pids=None), 1)] == \
        ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
    pod = cgroups.create(host, "p1", Limits(memory=GiB, pids=64, cpus=0.25))
    assert pod is not None
    assert (pod.dirs["memory"] / "memory.limit_in_bytes").read_text() == str(GiB)
    assert memsw.read_text() == str(GiB)
    assert (pod.dirs["pids"] / "pids.max").read_text() == "64"
    assert (pod.dirs["cpu"] / "cpu.cfs_quota_us").read_text() == "25000"
    assert (pod.dirs["cpu"] / "cpu.cfs_period_us").read_text() == "100000"


def test_v1_without_swap_accounting_writes_no_memsw(tmp_path: Path) -> None:
    pod = cgroups.create(cgroups.detect(v1_root(tmp_path), V1_SELF), "p2", Limits(memory=GiB))
    assert pod is not None and not (pod.dirs["memory"] / "memory.memsw.limit_in_bytes").exists()


def test_unlimited_values_write_nothing() -> None:
    assert cgroups.settings(Limits(memory=None, pids=None, cpus=None), 1) == []
    assert cgroups.settings(Limits(memory=None, pids=None, cpus=None), 2) == []


def test_host_without_cgroups_turns_limits_off_and_says_why(tmp_path: Path) -> None:
    host = cgroups.detect(tmp_path / "nothing", "")
    assert not host.enabled and "no writable cgroup" in host.reason
    assert cgroups.create(host, "p", Limits(memory=GiB)) is None
    assert host.describe()["cgroup"] == "off"
    only_memory = cgroups.detect(v1_root(tmp_path, ("memory",)), V1_SELF)
    assert not only_memory.enabled


def test_removing_a_pod_cgroup_removes_its_directories(tmp_path: Path) -> None:
    host = cgroups.detect(v1_root(tmp_path), V1_SELF)
    pod = cgroups.create(host, "p3", Limits(pids=None, cpus=None))
    assert pod is not None and all(d.is_dir() for d in pod.dirs.values())
    assert cgroups.remove(pod)
    assert not any(d.exists() for d in pod.dirs.values())
    assert cgroups.from_record(host, {"limits": {"cgroup": "p3"}}) == pod
    assert cgroups.from_record(host, {"cgroup_dirs": {"pids": "/elsewhere/p3"}}) == \
        cgroups.PodCgroup({"pids": Path("/elsewhere/p3")})
    assert cgroups.from_record(host, {"limits": {"cgroup": "off"}}) is None


def test_a_pods_deletion_kills_what_its_cgroup_still_holds(tmp_path: Path) -> None:
    # A process the pod's known pids missed (a sandbox bwrap forked as its start was stopped) is in its cgroup.
    stray = subprocess.Popen(["sleep", "60"])
    try:
        group = tmp_path / "pids" / "pod"
        group.mkdir(parents=True)
        (group / "cgroup.procs").write_text(f"{stray.pid}\n")  # a fake hierarchy keeps the pid listed
        assert cgroups.kill_members(cgroups.PodCgroup({"pids": group}), timeout_s=0.2) == 1
        assert stray.wait(5) == -signal.SIGKILL
    finally:
        stray.kill()
        stray.wait()
    (group / "cgroup.procs").write_text("")
    assert cgroups.kill_members(cgroups.PodCgroup({"pids": group})) == 0


def test_cgroup_names_differ_between_state_dirs() -> None:
    assert cgroups.cgroup_name("p", Path("/a")) != cgroups.cgroup_name("p", Path("/b"))


def test_agent_reads_oom_and_pids_counters_of_both_versions(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "pids").mkdir()
    (v1 / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v1 / "pids" / "pids.events").write_text("max 7\n")
    assert agent_limits.read_counters(v1) == agent_limits.Counters(3, 7)
    v2 = tmp_path / "v2"
    (v2 / "unified").mkdir(parents=True)
    (v2 / "unified" / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    (v2 / "unified" / "pids.events").write_text("max 4\n")
    assert agent_limits.read_counters(v2) == agent_limits.Counters(1, 4)
    assert agent_limits.read_counters(tmp_path / "none") == agent_limits.Counters()


def test_agent_names_the_limit_a_failed_attempt_hit(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr"
    stderr.write_bytes(b"Traceback\nOSError: [Errno 28] No space left on device\n")
    quiet = tmp_path / "quiet"
    quiet.write_bytes(b"boom\n")
    zero, oom, forks = agent_limits.Counters(), agent_limits.Counters(1, 0), agent_limits.Counters(0, 5)
    assert agent_limits.classify(zero, oom, [], quiet) == agent_limits.OUT_OF_MEMORY
    assert agent_limits.classify(zero, forks, [], quiet) == agent_limits.TOO_MANY_PROCESSES
    assert agent_limits.classify(zero, zero, [], stderr) == agent_limits.DISK_FULL
    assert agent_limits.classify(zero, zero, [str(tmp_path)], quiet) is None


def _spec(tmp_path: Path, **kw: object) -> SandboxSpec:
    return SandboxSpec(name="p", dirs=PodDirs(tmp_path / "p"), python="/usr/bin/python3", prefixes=(),
                       agent_dir=str(tmp_path / "agent"), cuda_visible_devices="", **kw)  # type: ignore[arg-type]


def test_sandbox_sizes_tmp_and_shm_and_shows_the_cgroup_read_only(tmp_path: Path) -> None:
    argv = bwrap_argv("bwrap", _spec(tmp_path, tmp_size=32 << 20, shm_size=16 << 20,
                                     limit_dirs=(("memory", "/cg/memory/p"), ("pids", "/cg/pids/p"))))
    joined = " ".join(argv)
    assert "--perms 1777 --size 33554432 --tmpfs /tmp" in joined
    assert "--perms 1777 --size 16777216 --tmpfs /dev/shm" in joined
    assert f"--ro-bind /cg/memory/p {LIMITS_MOUNT}/memory" in joined
    assert f"--ro-bind /cg/pids/p {LIMITS_MOUNT}/pids" in joined
    assert str(agent_limits.LIMITS_DIR) == LIMITS_MOUNT  # the agent reads where the broker shows
    unsized = " ".join(bwrap_argv("bwrap", _spec(tmp_path)))
    assert "--size" not in unsized and "--perms 1777 --tmpfs /tmp" in unsized


def test_everything_a_job_writes_on_disk_lives_on_the_pods_capped_disk(tmp_path: Path) -> None:
    dirs = PodDirs(tmp_path / "p")
    for path in (dirs.workspace, dirs.pkg, dirs.deps, dirs.volumes):
        assert path.parent == dirs.disk
