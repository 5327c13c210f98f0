"""Custom images from the pool's allowlist, end to end through a broker on the API emulator (and the
local backend's typed refusal): the pod manifest names the image, a digest's pod is reused by its caller
only, a mutable tag's pod is single-use."""

from __future__ import annotations

import time
from typing import Any

import pytest

from k8s_emulator import Emulator
from tests.integration.conftest import BrokerProcess, run_job
from tests.integration.test_k8s_backend import core

pytestmark = pytest.mark.integration

DIGEST = "registry.example/team/train@sha256:" + "ab" * 32
TAG = "registry.example/team/train:nightly"
POOLS = """
pools:
  - name: cpu
    max_count: 4
    max_idle_count: 1
    idle_timeout: 300
    caller_hold_seconds: 300
    images: ["registry.example/team/*"]
    template: {image: "firepool/sandbox-cpu:0.1.0", start_timeout_s: 60}
"""


def _agent_image(cluster: Emulator, pod: str) -> tuple[str, str]:
    obj = core(cluster).read_namespaced_pod(pod, "default")
    agent = next(c for c in obj.spec.containers if c.name == "agent")
    return agent.image, agent.image_pull_policy


@pytest.mark.parametrize("backend_kind", ["kubernetes"], indirect=True)
def test_custom_images_on_kubernetes(broker_factory: Any, cluster: Emulator) -> None:
    b: BrokerProcess = broker_factory(pools=POOLS)
    alice, bob = b.client("alice"), b.client("bob")
    first = run_job(alice, {"pool": "cpu", "command": ["true"], "image": DIGEST, "lease_tag": "a"})
    assert first["state"] == "SUCCEEDED" and first["image"] == DIGEST, first
    pod = first["bound_pods"][0]
    assert first["acquisition"][0]["path"] == "custom_image"
    assert _agent_image(cluster, pod) == (DIGEST, "IfNotPresent")  # the manifest runs the image
    again = run_job(alice, {"pool": "cpu", "command": ["true"], "image": DIGEST, "lease_tag": "b"})
    assert again["bound_pods"] == [pod], again  # reused by the same caller
    other = run_job(bob, {"pool": "cpu", "command": ["true"], "image": DIGEST})
    plain = run_job(alice, {"pool": "cpu", "command": ["true"], "lease_tag": "a"})
    assert pod not in other["bound_pods"] + plain["bound_pods"]  # never another caller, never an image-less job
    assert _agent_image(cluster, plain["bound_pods"][0])[0] == "firepool/sandbox-cpu:0.1.0"

    tagged = run_job(alice, {"pool": "cpu", "command": ["true"], "image": TAG})
    single = tagged["bound_pods"][0]
    assert tagged["state"] == "SUCCEEDED" and single != pod
    deadline = time.monotonic() + 20
    while single in {p.metadata.name for p in core(cluster).list_namespaced_pod("default").items}:
        assert time.monotonic() < deadline, "the single-use pod was not deleted"
        time.sleep(0.1)
    retagged = run_job(alice, {"pool": "cpu", "command": ["true"], "image": TAG})
    assert retagged["bound_pods"] != [single]  # never reused

    refused = alice.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "image": "evil.example/x:1"})
    assert refused.status_code == 403 and refused.json()["error"]["class"] == "ImageNotAllowed"


def test_the_local_backend_refuses_an_image_with_a_typed_error(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory(pools=POOLS)
    got = b.client("alice").post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "image": DIGEST})
    assert got.status_code == 400 and got.json()["error"]["class"] == "ImagesUnsupported", got.text
