"""Which JWKS key verifies a token without a ``kid``: with one key in the JWKS,
that key (an IdP with one signing key often leaves ``kid`` out); with several,
none: picking one (the first) would make the token's key a guess, so the token
is refused (401) naming the missing kid. A token that names its kid is verified
with that key whatever the JWKS holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jwt as pyjwt
from cryptography.hazmat.primitives.asymmetric import ec

from runtime.security.jwt_auth import JwtVerifier
from runtime.security.settings import JwtSettings
from tests.security.test_auth import Fn, bearer, call, refused, stage, token


def jwks(tmp_path: Path, n: int) -> tuple[list[Any], Path]:
    """`n` ES256 private keys and a JWKS file of their public keys, kids k1..kN."""
    private = [ec.generate_private_key(ec.SECP256R1()) for _ in range(n)]
    keys = [{**json.loads(pyjwt.algorithms.ECAlgorithm.to_jwk(p.public_key())),
             "kid": f"k{i + 1}", "use": "sig", "alg": "ES256"} for i, p in enumerate(private)]
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return private, path


def verifier(path: Path) -> JwtVerifier:
    return JwtVerifier(JwtSettings(jwks=str(path), issuer="https://idp.test"))


def test_a_token_without_kid_is_refused_against_several_keys(tmp_path: Path) -> None:
    (first, second), path = jwks(tmp_path, 2)
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"), jwt=verifier(path))
    for key in (first, second):  # signed by either: no key is picked for it
        err = refused(auth, bearer(token(key, kid=None)))
        assert (err.status, err.code) == (401, "unauthorized")
        assert "no key with kid None in the JWKS" in str(err), str(err)
    for key, kid in ((first, "k1"), (second, "k2")):  # naming its kid: verified
        ctx, response = call(auth, bearer(token(key, kid=kid)))
        assert response.status == 200
        assert ctx.principal is not None and ctx.principal.tenant == "acme"


def test_a_token_without_kid_is_verified_by_the_only_key(tmp_path: Path) -> None:
    (only,), path = jwks(tmp_path, 1)
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"), jwt=verifier(path))
    ctx, response = call(auth, bearer(token(only, kid=None)))
    assert response.status == 200
    assert ctx.principal is not None and (ctx.principal.kind, ctx.principal.tenant) == (
        "jwt", "acme")
    other = ec.generate_private_key(ec.SECP256R1())  # the only key, not any key
    err = refused(auth, bearer(token(other, kid=None)))
    assert err.status == 401 and "Signature verification" in str(err), str(err)
