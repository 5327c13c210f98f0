"""The Pods page on both backends: reset proofs of the last resets, and the Kubernetes ready record."""

from __future__ import annotations

import httpx
import pytest

from broker.backends.kubernetes.podstatus import STAGES
from tests.integration.conftest import both_backends, run_job

pytestmark = pytest.mark.integration


@both_backends
def test_the_pods_page_shows_reset_proofs_and_the_ready_record(broker_factory, backend_kind: str) -> None:
    b = broker_factory()
    with b.client("alice") as c:
        job = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "dash-pods"})
    pod = job["acquisition"][0]["pod"]
    with httpx.Client(base_url=b.url) as http:
        assert http.post("/ui/login", data={"token": b.tokens["alice"]}).status_code == 303
        page = http.get("/ui/pods").text
    row = next(r for r in page.split("<tr ") if f'data-pod="{pod}"' in r)
    assert "clean in" in row and "dash-pods" in row, row
    if backend_kind == "kubernetes":
        assert all(f"{stage}:" in row for stage in STAGES), row
    else:
        assert not any(f"{stage}:" in row for stage in STAGES), row  # the local backend keeps no ready record
