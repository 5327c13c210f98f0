"""A second caller sees nothing of the first through a real broker: pods, tags, jobs, metrics labels; hashed
tokens from `firepool token add` and JWTs checked against a local JWKS authenticate over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration

TAG = "notebooks/alices-secret-project.ipynb"


def test_a_second_caller_sees_none_of_the_first_callers_pods_tags_jobs_or_metrics(broker) -> None:
    alice, bob, ops = broker.client("alice"), broker.client("bob"), broker.client("ops")
    job = run_job(alice, {"pool": "cpu", "command": ["true"], "lease_tag": TAG})
    assert job["state"] == "SUCCEEDED"
    for path in ("/v1/pods", "/v1/pools", "/v1/jobs"):
        seen = bob.get(path)
        assert seen.status_code == 200 and "alice" not in seen.text and "secret-project" not in seen.text, path
    assert bob.get(f"/v1/jobs/{job['id']}").status_code == 404
    assert [p["lease_tag"] for p in alice.get("/v1/pods").json()["pods"]] == [TAG]
    assert {p["caller"] for p in ops.get("/v1/pods").json()["pods"]} >= {"alice"}
    assert [j["id"] for j in ops.get("/v1/jobs").json()["jobs"]] == [job["id"]]
    refused = httpx.get(broker.url + "/metrics")
    assert refused.status_code == 401 and refused.json()["error"]["class"] == "Unauthorized"
    assert bob.get("/metrics").status_code == 403
    metrics = ops.get("/metrics").text
    assert "firepool_pods{" in metrics and "alice" not in metrics


def test_hashed_tokens_from_token_add_and_jwts_authenticate_a_real_broker(broker_factory, tmp_path) -> None:
    tokens = tmp_path / "hashed.json"
    made = subprocess.run([sys.executable, "-m", "broker.cli", "token", "add", "dave", "--tokens", str(tokens)],
                          capture_output=True, text=True, check=True)
    token = made.stdout.strip()
    assert token and token not in tokens.read_text()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    b = broker_factory(extra=("--jwks", str(jwks), "--jwt-audience", "firepool"))
    # A second broker on the hashed file alone: the token printed once authenticates, nothing else does.
    h = broker_factory("hashed", extra=("--tokens", str(tokens)))
    assert httpx.get(h.url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json() == {"caller": "dave"}

    def whoami(bearer: str) -> httpx.Response:
        return httpx.get(b.url + "/v1/whoami", headers={"Authorization": f"Bearer {bearer}"})

    def sign(**claims: object) -> str:
        body = {"sub": "system:serviceaccount:rl:trainer", "aud": "firepool", "exp": time.time() + 300, **claims}
        return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})

    assert whoami(sign()).json() == {"caller": "system:serviceaccount:rl:trainer"}
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad in (sign(aud="elsewhere"), sign(exp=time.time() - 3600),
                jwt.encode({"sub": "x", "aud": "firepool", "exp": time.time() + 60}, other, algorithm="RS256",
                           headers={"kid": "k1"})):
        r = whoami(bad)
        assert r.status_code == 401 and r.json()["error"]["class"] == "Unauthorized", r.text
