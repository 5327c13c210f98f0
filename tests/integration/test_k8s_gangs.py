"""A gang's pods are kept together by pod affinity: the backend writes it from the request's gang hint and
the emulator's scheduler (least allocated first, like kube-scheduler's default) honours it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.errors import BackendError
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import Emulator
from tests.integration.test_k8s_backend import new_backend

pytestmark = pytest.mark.integration

GPU = parse_pool({"name": "gpu", "gpus": 1, "template": {"image": "firepool/sandbox-gpu:0.1.0",
                                                          "gpusPerNode": 2, "start_timeout_s": 60}})


async def _nodes_of_a_gang_beside_a_busy_card(tmp_path: Path, hinted: bool) -> set[str]:
    with Emulator(tmp_path / ("hinted" if hinted else "plain"), gpus=2, nodes=2) as emu:
        b = new_backend(emu)
        try:
            await b.create(PodRequest(name="gpu-busy", pool=GPU))  # node-0 keeps one free card
            gang = {"gang": "j0123456789abcdefgh", "gang_size": 2} if hinted else {}
            infos = [await b.create(PodRequest(name=f"gpu-rank{i}", pool=GPU, **gang)) for i in range(2)]  # type: ignore[arg-type]
            return {str(info.details["node"]) for info in infos}
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await asyncio.gather(*(b.delete(n) for n in list(b.cache.pods)))
            await b.close()


async def test_a_gang_that_fits_one_node_lands_on_one_node(tmp_path: Path) -> None:
    assert len(await _nodes_of_a_gang_beside_a_busy_card(tmp_path, hinted=True)) == 1
    # Without the hint the same requests spread over both nodes: the affinity is what kept them together.
    assert len(await _nodes_of_a_gang_beside_a_busy_card(tmp_path, hinted=False)) == 2


WIDE = parse_pool({"name": "wide", "gpus": 1, "template": {"image": "firepool/sandbox-gpu:0.1.0",
                                                            "gpusPerNode": 1, "start_timeout_s": 3}})


async def test_a_node_confined_gangs_pod_waits_for_room_beside_its_gang_rather_than_go_to_another_node(
        tmp_path: Path) -> None:
    # gpusPerNode 1 says two pods never fit one node, so the affinity was only preferred: the second rank went
    # to the other node, a split set the claim never takes (it sat idle until its keep-alive).
    with Emulator(tmp_path / "k8s", gpus=1, nodes=2) as emu:
        b = new_backend(emu)
        gang = {"gang": "j0123456789abcdefgh", "gang_size": 2, "gang_topology": "node"}
        try:
            first = await b.create(PodRequest(name="wide-rank0", pool=WIDE, **gang))  # type: ignore[arg-type]
            assert first.details["node"] == "node-0"
            # No room beside rank 0: Pending (never bound to node-1) until its start timeout deletes it.
            with pytest.raises(BackendError, match="still not running"):
                await b.create(PodRequest(name="wide-rank1", pool=WIDE, **gang))  # type: ignore[arg-type]
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await asyncio.gather(*(b.delete(n) for n in list(b.cache.pods)))
            await b.close()


async def test_a_quarantined_node_without_gpus_gets_no_new_pod(tmp_path: Path) -> None:
    cpu = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 60}})
    with Emulator(tmp_path / "k8s", gpus=0, nodes=2) as emu:
        b = new_backend(emu)
        try:
            info = await b.create(PodRequest(name="cpu-a", pool=cpu, avoid=frozenset({"node:node-0"})))
            assert info.details["node"] == "node-1"  # node-0 would win the tie by name
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await asyncio.gather(*(b.delete(n) for n in list(b.cache.pods)))
            await b.close()
