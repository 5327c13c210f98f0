"""Pool `network` modes as they shape a local pod's command line (no sandbox is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.backends.podnets import NETWORK_POLICY, stale_template
from broker.backends.sandboxing import PodDirs, SandboxSpec, bwrap_argv
from broker.podtemplate import parse_network


def spec(network: str) -> SandboxSpec:
    return SandboxSpec(name="p", dirs=PodDirs(Path("/state/pods/p")), python="/venv/bin/python3", prefixes=("/venv",),
                       agent_dir="/src/firepool_agent", cuda_visible_devices="", network=network)


def test_isolated_is_the_default_and_unknown_modes_are_refused() -> None:
    assert parse_network(None) == "isolated"
    assert [parse_network(m) for m in ("none", "isolated", "host")] == ["none", "isolated", "host"]
    for bad in ("bridge", True, "", 1):
        with pytest.raises(ValueError, match="none, isolated, host"):
            parse_network(bad)


def test_only_host_shares_the_hosts_network_namespace() -> None:
    assert "--unshare-net" in bwrap_argv("bwrap", spec("isolated"))
    assert "--unshare-net" in bwrap_argv("bwrap", spec("none"))
    assert "--unshare-net" not in bwrap_argv("bwrap", spec("host"))


def test_an_isolated_sandbox_resolves_through_the_user_mode_stack_not_the_hosts_resolver() -> None:
    argv = bwrap_argv("bwrap", spec("isolated"))
    at = argv.index("/state/pods/p/resolv.conf")
    assert argv[at - 1:at + 2] == ["--ro-bind", "/state/pods/p/resolv.conf", "/etc/resolv.conf"]
    assert argv.index("/etc/resolv.conf") > argv.index("/etc")  # on top of the read-only /etc, not under it
    for other in ("none", "host"):
        assert "/state/pods/p/resolv.conf" not in bwrap_argv("bwrap", spec(other))


def test_a_pod_made_before_isolated_networks_reads_as_stale_for_the_rollout() -> None:
    assert stale_template({"template": "abc", "network_policy": NETWORK_POLICY}) == "abc"
    assert stale_template({"template": "abc", "network": "host"}) != "abc"


def test_a_gang_links_ranks_get_the_interface_to_bind_after_the_callers_env() -> None:
    from broker.backends import ganglinks
    from broker.running.topology import Rendezvous, topology_env

    env = topology_env(1, 2, Rendezvous(ganglinks.address(0), 29500, ganglinks.env()))
    assert env["MASTER_ADDR"] == "10.213.0.1" and env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "gang0"
    assert ganglinks.address(1) == "10.213.0.2"


def test_a_symlinked_host_resolv_conf_is_read_through_and_an_isolated_pod_gets_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """systemd-resolved hosts: /etc/resolv.conf -> ../run/systemd/resolve/stub-resolv.conf, absent in a sandbox:
    the sandbox's /etc/resolv.conf is a file (the pod's own on an isolated network, the link's target on host)."""
    from broker.backends import sandboxing

    (tmp_path / "etc").mkdir()
    (tmp_path / "run" / "systemd" / "resolve").mkdir(parents=True)
    target = tmp_path / "run" / "systemd" / "resolve" / "stub-resolv.conf"
    target.write_text("nameserver 127.0.0.53\n")
    link = tmp_path / "etc" / "resolv.conf"
    link.symlink_to("../run/systemd/resolve/stub-resolv.conf")
    monkeypatch.setattr(sandboxing, "HOST_RESOLV_CONF", str(link))
    for network, source in (("isolated", "/state/pods/p/resolv.conf"), ("host", str(target))):
        argv = bwrap_argv("bwrap", spec(network))
        at = argv.index("/etc/resolv.conf")
        assert argv[at - 2:at + 1] == ["--ro-bind", source, "/etc/resolv.conf"], network


def test_a_pod_made_before_capped_run_dirs_is_stale_and_still_reached_at_its_old_run_dir(tmp_path: Path) -> None:
    from broker.backends.sandboxing import PodDirs

    assert stale_template({"template": "abc", "network_policy": 3}) != "abc"  # the rollout replaces it
    dirs = PodDirs(tmp_path)
    assert dirs.run == tmp_path / "disk" / "run" and dirs.socket.parent == dirs.run  # on the capped disk
    (tmp_path / "run").mkdir()  # what an older broker made
    assert dirs.run == tmp_path / "run"
