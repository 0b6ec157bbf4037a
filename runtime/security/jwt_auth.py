"""JWT bearer tokens, verified with PyJWT: RS256/ES256 against the keys of a JWKS
file (picked by the token's ``kid``), HS256 against a secret from the
environment. The expiry, not-before, issuer and audience claims are checked
(with `JwtSettings.leeway_seconds`); the tenant and scopes come from the claims
the settings name."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import jwt

from edgefn_core.errors import InvalidConfig
from runtime.security.principal import TENANT, Principal
from runtime.security.settings import JwtSettings

MAX_VERIFIED = 4096  # verified tokens remembered; all dropped when full


class TokenInvalid(Exception):
    """A token that does not verify; the message says why (it goes to the client)."""


class JwtVerifier:
    def __init__(self, settings: JwtSettings, label: str = "pop.toml") -> None:
        """Raises `InvalidConfig` (naming ``auth.jwt.*``) for a JWKS file that cannot
        be read, a missing secret variable, or no key for the allowed algorithms."""
        self.settings = settings
        self.keys: dict[str | None, Any] = {}  # kid -> PyJWK (None: the only key)
        self.secret: bytes | None = None
        self.verified: dict[str, tuple[Principal, float]] = {}  # token -> (who, until)
        allowed = settings.algorithms
        if not allowed:
            raise InvalidConfig(label, "allow at least one of HS256, RS256, ES256",
                                "auth.jwt.algorithms")
        if settings.secret_env and "HS256" not in allowed:
            raise InvalidConfig(label, f"`secret_env` is an HS256 secret, but `algorithms` "
                                f"({', '.join(allowed)}) does not allow HS256",
                                "auth.jwt.algorithms")
        if settings.jwks:
            self._load_jwks(Path(settings.jwks), label)
        if settings.secret_env:
            secret = os.environ.get(settings.secret_env)
            if not secret:
                raise InvalidConfig(label, f"the environment variable {settings.secret_env!r} "
                                    "is not set", "auth.jwt.secret_env")
            self.secret = secret.encode()
        if not self.keys and self.secret is None:
            raise InvalidConfig(label, "JWT auth needs `jwks` (RS256/ES256) or `secret_env` "
                                "(HS256)", "auth.jwt")
        kinds = {k.algorithm_name for k in self.keys.values()}
        if self.secret is None and not kinds & set(allowed):
            raise InvalidConfig(label, f"no key for the allowed algorithms ({', '.join(allowed)})"
                                f": the JWKS holds {', '.join(sorted(kinds))} keys, and HS256 "
                                "needs `secret_env`", "auth.jwt.algorithms")

    def _load_jwks(self, path: Path, label: str) -> None:
        try:
            jwks = jwt.PyJWKSet.from_json(path.read_text())
        except (OSError, jwt.PyJWKSetError, ValueError) as e:
            raise InvalidConfig(label, f"cannot load the JWKS file {str(path)!r}: {e}",
                                "auth.jwt.jwks") from None
        for k in jwks.keys:
            self.keys[k.key_id] = k
        if len(jwks.keys) == 1:
            self.keys[None] = jwks.keys[0]

    def verify(self, token: str) -> Principal:
        """Raises `TokenInvalid` saying why the token is refused. A token that
        verified is remembered until it expires (one principal per token, so the
        caches keyed on principals stay small)."""
        hit = self.verified.get(token)
        if hit is not None:
            if time.time() < hit[1]:
                return hit[0]
            del self.verified[token]
        principal, expires = self._verify(token)
        if len(self.verified) >= MAX_VERIFIED:
            self.verified.clear()
        self.verified[token] = (principal, expires)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if alg not in s.algorithms:
                raise TokenInvalid(f"algorithm {alg!r} is not accepted")
            key = self._key(alg, header.get("kid"))
            claims = jwt.decode(token, key, algorithms=[alg], issuer=s.issuer,
                                audience=s.audience, leeway=s.leeway_seconds,
                                options={"require": ["exp"]})
        except jwt.InvalidTokenError as e:
            raise TokenInvalid(f"invalid token: {e}") from None
        return self._principal(claims), float(claims["exp"]) + s.leeway_seconds

    def _key(self, alg: str, kid: object) -> Any:
        if alg == "HS256":
            if self.secret is None:
                raise TokenInvalid("HS256 tokens are not accepted (no secret configured)")
            return self.secret
        key = self.keys.get(kid if isinstance(kid, str) else None)
        if key is None:
            raise TokenInvalid(f"no key with kid {kid!r} in the JWKS")
        return key

    def _principal(self, claims: dict[str, Any]) -> Principal:
        s = self.settings
        tenant = claims.get(s.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise TokenInvalid(f"the token has no {s.tenant_claim!r} claim naming the tenant")
        if TENANT.match(tenant) is None:  # it goes in labels, tables, logs and file names
            raise TokenInvalid(f"the token's {s.tenant_claim!r} claim is no tenant name "
                               "(lower-case letters, digits, _ and -, at most 63)")
        raw = claims.get(s.scopes_claim, ())
        scopes = tuple(raw.split() if isinstance(raw, str) else
                       [x for x in raw if isinstance(x, str)] if isinstance(raw, list) else ())
        sub = claims.get("sub")
        return Principal("jwt", tenant, scopes, subject=sub if isinstance(sub, str) else None)
