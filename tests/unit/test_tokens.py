"""Tokens: hashed and plain entries, admin marks, constant-time lookup, `firepool token add`, JWTs."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from broker.api.auth import Identity, TokenAuth, add_token, token_digest
from broker.api.jwt_auth import JwtSettings, JwtVerifier
from broker.cli import main
from broker.errors import Unauthorized


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_hashed_and_plain_entries_both_authenticate(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({token_digest("s3cret"): "alice", "plain-one": {"caller": "ops", "admin": True}}))
    auth = TokenAuth.from_file(path)
    assert auth.identify(bearer("s3cret")) == Identity("alice")
    assert auth.identify(bearer("plain-one")) == Identity("ops", admin=True)
    assert auth.plain_tokens == {"plain-one": "ops"}
    with pytest.raises(Unauthorized):
        auth.identify(bearer(token_digest("s3cret")))  # the stored digest is not itself a token


def test_a_plain_token_file_logs_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"plain": "alice"}))
    TokenAuth.from_file(path)
    assert "plain text" in caplog.text


@pytest.mark.parametrize("data", [
    {"sha256:abc": "alice"}, {"t": {"caller": "x", "admin": "yes"}}, {"t": {"name": "x"}}, {"t": ""}, {"t": 3},
])
def test_malformed_entries_are_refused(data: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        TokenAuth(data)


def test_token_add_prints_the_token_once_and_stores_only_its_hash(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens.json"
    assert main(["token", "add", "alice", "--tokens", str(path)]) == 0
    assert main(["token", "add", "ops", "--admin", "--tokens", str(path)]) == 0
    alice_token, ops_token = capsys.readouterr().out.split()
    stored = path.read_text()
    assert alice_token not in stored and ops_token not in stored
    assert set(json.loads(stored)) == {token_digest(alice_token), token_digest(ops_token)}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    auth = TokenAuth.from_file(path)
    assert auth.identify(bearer(alice_token)) == Identity("alice")
    assert auth.identify(bearer(ops_token)) == Identity("ops", admin=True)


def test_token_add_refuses_a_broken_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError):
        add_token(path, "alice")
    assert main(["token", "add", "alice", "--tokens", str(path)]) == 2


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> tuple[rsa.RSAPrivateKey, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return key, path


def sign(key: rsa.RSAPrivateKey, **claims: object) -> str:
    body = {"sub": "system:serviceaccount:rl:trainer", "aud": "firepool", "exp": time.time() + 600, **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})


def jwt_auth(jwks: Path, **kw: str) -> TokenAuth:
    return TokenAuth({"static": "alice"}, JwtVerifier(JwtSettings(str(jwks), "firepool", **kw)))


def test_a_valid_jwt_names_its_caller_by_the_configured_claim(issuer: tuple[rsa.RSAPrivateKey, Path]) -> None:
    key, jwks = issuer
    assert jwt_auth(jwks).caller(bearer(sign(key))) == "system:serviceaccount:rl:trainer"
    assert jwt_auth(jwks, claim="email").caller(bearer(sign(key, email="a@x.org"))) == "a@x.org"
    assert jwt_auth(jwks).caller(bearer("static")) == "alice"  # static tokens still work beside JWTs


@pytest.mark.parametrize(("claims", "why"), [({"aud": "someone-else"}, "audience"), ({"exp": time.time() - 3600}, "expired")])
def test_a_jwt_for_another_audience_or_expired_is_refused(issuer: tuple[rsa.RSAPrivateKey, Path],
                                                          claims: dict[str, object], why: str) -> None:
    key, jwks = issuer
    with pytest.raises(Unauthorized, match=why):
        jwt_auth(jwks).caller(bearer(sign(key, **claims)))


def test_a_jwt_without_an_expiry_is_refused(issuer: tuple[rsa.RSAPrivateKey, Path]) -> None:
    key, jwks = issuer
    token = jwt.encode({"sub": "x", "aud": "firepool"}, key, algorithm="RS256", headers={"kid": "k1"})
    with pytest.raises(Unauthorized, match="exp"):
        jwt_auth(jwks).caller(bearer(token))


def test_a_jwt_signed_by_another_key_or_with_hmac_is_refused(issuer: tuple[rsa.RSAPrivateKey, Path]) -> None:
    _, jwks = issuer
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(Unauthorized, match="invalid token"):
        jwt_auth(jwks).caller(bearer(sign(other)))
    forged = jwt.encode({"sub": "x", "aud": "firepool", "exp": time.time() + 60}, "s" * 40, algorithm="HS256",
                        headers={"kid": "k1"})
    with pytest.raises(Unauthorized):
        jwt_auth(jwks).caller(bearer(forged))


def test_a_jwt_with_a_wrong_issuer_is_refused_when_one_is_configured(issuer: tuple[rsa.RSAPrivateKey, Path]) -> None:
    key, jwks = issuer
    with pytest.raises(Unauthorized, match="issuer"):
        jwt_auth(jwks, issuer="https://oidc.example").caller(bearer(sign(key, iss="https://evil.example")))
    assert jwt_auth(jwks, issuer="https://oidc.example").caller(bearer(sign(key, iss="https://oidc.example")))


def test_the_local_token_file_must_be_private(tmp_path: Path) -> None:
    from broker.api.auth import local_token
    from broker.locations import InsecureFileError

    token = local_token(tmp_path)
    assert stat.S_IMODE((tmp_path / "token").stat().st_mode) == 0o600 and local_token(tmp_path) == token
    (tmp_path / "token").chmod(0o644)
    with pytest.raises(InsecureFileError, match="0644 are too open"):
        local_token(tmp_path)


def test_a_bad_entry_is_named_by_its_line_and_number_never_its_key(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({token_digest("a"): "alice", "secret-plain-token": {"caller": "x", "admin": "yes"}},
                               indent=2))
    with pytest.raises(ValueError) as caught:
        TokenAuth.from_file(path)
    assert "line 3" in str(caught.value) and "entry 2" in str(caught.value)
    assert "secret-plain-token" not in str(caught.value)


def test_token_rm_removes_every_token_of_a_caller(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens.json"
    for name in ("alice", "alice", "bob"):
        assert main(["token", "add", name, "--tokens", str(path)]) == 0
    assert main(["token", "rm", "alice", "--tokens", str(path)]) == 0
    assert list(json.loads(path.read_text()).values()) == ["bob"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert main(["token", "rm", "alice", "--tokens", str(path)]) == 2
    assert "no token for caller 'alice'" in capsys.readouterr().err
