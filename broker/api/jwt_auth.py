"""JWT bearer tokens (OIDC ID tokens, Kubernetes service-account tokens) verified against a JWKS.

Signature, audience and expiry are always checked (the issuer too when configured); the caller's name is
one claim of the token (`sub` by default). Only asymmetric algorithms are accepted, so a token signed
with the public key as an HMAC secret is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from broker.errors import Unauthorized

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY_S = 30.0
"""Clock skew tolerated on exp/nbf/iat between the issuer and this broker."""


@dataclass(frozen=True)
class JwtSettings:
    jwks: str
    """A JWKS file path, or an http(s) URL the broker fetches keys from (cached by PyJWT)."""
    audience: str
    issuer: str | None = None
    claim: str = "sub"


class JwtVerifier:
    def __init__(self, settings: JwtSettings) -> None:
        if not settings.audience:
            raise ValueError("JWT verification needs an audience (--jwt-audience)")
        self.settings = settings
        self._client: jwt.PyJWKClient | None = None
        self._keys: jwt.PyJWKSet | None = None
        if settings.jwks.startswith(("http://", "https://")):
            self._client = jwt.PyJWKClient(settings.jwks, cache_keys=True, lifespan=300)
        else:
            try:
                self._keys = jwt.PyJWKSet.from_dict(json.loads(Path(settings.jwks).read_text()))
            except (OSError, ValueError, jwt.PyJWTError) as exc:
                raise ValueError(f"cannot read JWKS {settings.jwks}: {exc}") from exc

    def _key(self, token: str) -> Any:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token).key
        assert self._keys is not None
        kid = jwt.get_unverified_header(token).get("kid")
        keys = [k for k in self._keys.keys if kid is None or k.key_id == kid]
        if len(keys) != 1:
            raise Unauthorized("no single key of the JWKS matches the token's kid")
        return keys[0].key

    def caller(self, token: str) -> str:
        """The caller named by a valid token's claim, or Unauthorized saying what failed."""
        return self.verify(token)[0]

    def verify(self, token: str) -> tuple[str, float]:
        """(the caller, the token's `exp`) of a valid token, or Unauthorized saying what failed."""
        s = self.settings
        try:
            claims = jwt.decode(token, self._key(token), algorithms=ALGORITHMS, audience=s.audience, issuer=s.issuer,
                                leeway=LEEWAY_S, options={"require": ["exp", "aud", s.claim]})
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("the token is not for this broker (audience)") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("the token's issuer is not trusted") from None
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token: {exc}") from None
        name = claims.get(s.claim)
        if not isinstance(name, str) or not name:
            raise Unauthorized(f"the token's {s.claim!r} claim is not a caller name")
        return name, float(claims["exp"])
