"""A gang's pods are kept together by pod affinity: the backend writes it from the request's gang hint and
the emulator's scheduler (least allocated first, like kube-scheduler's default) honours it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.backends.kubernetes.emulator import Emulator
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
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
            await asyncio.gather(*(b.delete(n) for n in list(b.cache.pods)))
            await b.close()


async def test_a_gang_that_fits_one_node_lands_on_one_node(tmp_path: Path) -> None:
    assert len(await _nodes_of_a_gang_beside_a_busy_card(tmp_path, hinted=True)) == 1
    # Without the hint the same requests spread over both nodes: the affinity is what kept them together.
    assert len(await _nodes_of_a_gang_beside_a_busy_card(tmp_path, hinted=False)) == 2
