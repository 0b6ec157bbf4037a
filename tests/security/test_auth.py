"""API keys, JWTs and the auth stage: socket-free through the stage, end to end
over loopback with a Python function that reports `request.principal`."""

from __future__ import annotations

import base64
import http.client
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jwt as pyjwt
import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from edgefn_core.errors import InvalidConfig, NotFound, Rejected
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.auth import Auth
from runtime.pipeline.targets import Targets
from runtime.security import keys as keymod
from runtime.security.jwt_auth import JwtVerifier, TokenInvalid
from runtime.security.keys import KeyRing, KeyStore
from runtime.security.residency import sign
from runtime.security.settings import AuthSettings, JwtSettings, TargetPolicy
from tests.support import Running, pop_thread, python_function


# -- key store ------------------------------------------------------------------------------
def test_a_key_is_shown_once_and_stored_only_as_its_hash(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    key, record = store.create("acme", ("fn:*",), rpm=60)
    raw = (tmp_path / "keys.json").read_bytes()
    secret = key.split("_", 2)[2]  # efn_<id>_<secret>; the secret may hold "_" itself
    assert len(secret) == 43
    assert key.encode() not in raw and secret.encode() not in raw
    assert record.hash.encode() in raw and keymod.digest(key) == record.hash
    assert (tmp_path / "keys.json").stat().st_mode & 0o777 == 0o600
    assert keymod.is_well_formed(key) and key.startswith(f"efn_{record.id}_")
    assert KeyRing(store).lookup(key) == record


def test_revoke_keeps_the_key_listed_and_unknown_ids_are_not_found(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    _, a = store.create("acme", ("*",))
    _, b = store.create("beta", ("*",))
    revoked = store.revoke(a.id)
    assert revoked.state(time.time()) == "revoked"
    assert [k.state(time.time()) for k in store.read()] == ["revoked", "active"]
    assert store.read()[1] == b
    with pytest.raises(NotFound, match="no key 'nope'"):
        store.revoke("nope")


def test_a_ring_sees_changes_to_the_file_within_its_reload_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = KeyStore(tmp_path)
    ring = KeyRing(store)
    key, record = store.create("acme", ("*",))
    assert ring.lookup(key) is None  # checked less than RELOAD_INTERVAL ago
    clock = [time.monotonic() + keymod.RELOAD_INTERVAL]
    monkeypatch.setattr(keymod.time, "monotonic", lambda: clock[0])
    assert ring.lookup(key) == record
    store.revoke(record.id)
    clock[0] += keymod.RELOAD_INTERVAL
    found = ring.lookup(key)
    assert found is not None and found.state(time.time()) == "revoked"


def test_a_ring_keeps_answering_past_its_reload_interval_and_reads_only_on_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unchanged file crossing the interval was never tested (a `None` check time
    would have failed every key lookup after the first second)."""
    store = KeyStore(tmp_path)
    key, record = store.create("acme", ("*",))
    ring = KeyRing(store)
    reads: list[int] = []
    real_read = store.read
    monkeypatch.setattr(store, "read", lambda: reads.append(1) or real_read())
    clock = [time.monotonic()]
    monkeypatch.setattr(keymod.time, "monotonic", lambda: clock[0])
    for _ in range(3):  # the file unchanged: checked each interval, never read again
        clock[0] += keymod.RELOAD_INTERVAL
        assert ring.lookup(key) == record
    assert reads == []


def test_created_and_revoked_are_the_current_time(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    _, record = store.create("acme", ("*",))
    assert abs(record.created - time.time()) < 60
    revoked = store.revoke(record.id)
    assert revoked.revoked is not None and abs(revoked.revoked - time.time()) < 60


@pytest.mark.parametrize("limit", ["rpm", "tpm", "max_streams"])
def test_a_limit_under_one_is_refused_by_name(tmp_path: Path, limit: str) -> None:
    with pytest.raises(ValueError, match=rf"^{limit} must be 1 or more, got 0$"):
        KeyStore(tmp_path).create("a", ("*",), **{limit: 0})


def test_a_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "keys.json").write_text("{not json")
    with pytest.raises(InvalidConfig, match=r"keys\.json: not a key file"):
        KeyStore(tmp_path).read()


# -- the stage, without sockets ---------------------------------------------------------------
class Fn:
    """A function target as `Targets` resolves it."""

    kind = "function"
    tenant = "acme"

    def __init__(self, name: str, auth: str | None = None) -> None:
        self.name = name
        self.label = f"{name}@1"
        self.policy = TargetPolicy(auth=auth)  # type: ignore[arg-type]


class OpenAITarget:
    kind, name, label, tenant = "openai", "openai", "openai", None
    policy = TargetPolicy()


def stage(tmp_path: Path, target: Any, settings: AuthSettings | None = None,
          jwt: JwtVerifier | None = None) -> tuple[Auth, KeyStore]:
    """The stage over an empty router, with `target` serving every path (None:
    nothing does)."""
    store = KeyStore(tmp_path)
    targets = Targets(SimpleNamespace(router=Router(), canaries={}))  # type: ignore[arg-type]
    if target is not None:
        targets.resolve = lambda request, ctx: _set(ctx, target)  # type: ignore[method-assign]
    return Auth(settings or AuthSettings(), KeyRing(store), targets, jwt), store


def _set(ctx: Context, target: Any) -> Any:
    ctx.target = target
    return target


def call(auth: Auth, headers: list[tuple[bytes, bytes]] | None = None,
         path: bytes = b"/x") -> tuple[Context, Response]:
    request = Request(b"GET", path, b"", headers or [], b"h", "1.1", True, "1.2.3.4:5")
    ctx = Context(request.client)
    response = auth(request, ctx, lambda r, c: Response(200, [], b"ok"))
    assert isinstance(response, Response)
    return ctx, response


def refused(auth: Auth, headers: list[tuple[bytes, bytes]] | None = None,
            path: bytes = b"/x") -> Rejected:
    with pytest.raises(Rejected) as err:
        call(auth, headers, path)
    return err.value


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


def test_key_mode_admits_a_valid_key_by_either_header_and_sets_the_principal(
        tmp_path: Path) -> None:
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    key, record = store.create("acme", ("fn:chat",), tpm=500)
    auth.keys.reload()
    for headers in (bearer(key), [(b"x-api-key", key.encode())]):
        ctx, response = call(auth, headers)
        assert response.body == b"ok"
        assert ctx.principal == record.principal() and ctx.principal.tpm == 500
        assert ctx.decisions == {"auth": {"mode": "key", "result": "ok", "key_id": record.id,
                                          "tenant": "acme"}}


def test_the_credential_read_does_not_depend_on_the_headers_order(tmp_path: Path) -> None:
    """A Basic Authorization (the function's own) beside a valid `x-api-key` was a 401
    when it came first and a 200 after; a Bearer beside an `x-api-key` won only when
    it came first. Now a Bearer wins over an `x-api-key` and a Basic leaves it to be
    read, in either order."""
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    key, record = store.create("acme", ("fn:chat",))
    auth.keys.reload()
    basic = (b"authorization", b"Basic dXNlcjpwdw==")
    api = (b"x-api-key", key.encode())
    for headers in ([basic, api], [api, basic]):
        ctx, response = call(auth, headers)
        assert response.body == b"ok" and ctx.principal == record.principal(), headers
    bogus = (b"authorization", b"Bearer efn_" + b"a" * 12 + b"_" + b"b" * 43)
    for headers in ([bogus, api], [api, bogus]):
        err = refused(auth, headers)
        assert (err.status, "unknown API key") == (401, str(err)), headers
    for headers in ([basic, *bearer(key)], [*bearer(key), basic]):
        assert call(auth, headers)[0].principal == record.principal(), headers
    # a Bearer of the function's own (no edgefn key) leaves the x-api-key to be read
    theirs = bearer("sk-theirs")[0]
    for headers in ([theirs, api], [api, theirs]):
        assert call(auth, headers)[0].principal == record.principal(), headers


def test_two_credentials_of_one_kind_are_refused_not_one_of_them_picked(
        tmp_path: Path) -> None:
    """Two Bearer tokens (or two `x-api-key` headers): the first was verified and
    the second handed on, so a function reading the other one (a JWT it passes on,
    a WASM guest's own choice of the two) trusted a credential no one checked.
    Refused with a 401 naming the header, whatever is in them (a Basic beside a
    Bearer is the function's own: read as before); where auth is off the function
    gets the request as sent and no principal."""
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    key, record = store.create("acme", ("fn:chat",))
    other, _ = store.create("beta", ("fn:chat",))
    auth.keys.reload()
    off, _ = stage(tmp_path, Fn("open", auth="none"))  # the same keys
    off.keys.reload()
    assert call(off, bearer(key))[0].principal == record.principal()  # one: it proves
    for name, values in ((b"authorization", (f"Bearer {key}", f"Bearer {other}")),
                         (b"authorization", (f"Bearer {key}", "bearer eyJ.a.b")),
                         (b"authorization", ("Bearer sk-theirs", f"Bearer {key}")),
                         (b"x-api-key", (key, key)), (b"x-api-key", (other, key))):
        headers = [(name, v.encode()) for v in values]
        for sent in (headers, [(b"x-api-key", key.encode()), *headers]
                     if name == b"authorization" else headers):
            err = refused(auth, sent)
            assert (err.status, err.code) == (401, "unauthorized"), sent
            said = "Authorization: Bearer" if name == b"authorization" else "x-api-key"
            assert f"more than one `{said}` header" in str(err), sent
        ctx, response = call(off, headers)
        assert response.body == b"ok" and ctx.principal is None
    assert call(auth, [*bearer(key), (b"x-api-key", other.encode())])[0].principal == \
        record.principal()  # one of each: the Bearer's key


@pytest.mark.parametrize(("headers", "words"), [
    ([], "needs an API key"),
    ([(b"authorization", b"Basic dXNlcjpwdw==")], "expected `Authorization: Bearer <key>`"),
    ([(b"authorization", b"Bearer")], "expected `Authorization: Bearer <key>`"),
    ([(b"authorization", b"Bearer sk-not-ours")], "malformed API key"),
    ([(b"x-api-key", b"efn_" + b"a" * 12 + b"_" + b"b" * 43)], "unknown API key"),
    ([(b"x-api-key", b"x" * 9000)], "longer than 8192 bytes"),
    ([(b"x-api-key", "efn_\u00e9".encode())], "malformed API key"),
])
def test_key_mode_refuses_what_proves_no_one_with_401(
        tmp_path: Path, headers: list[tuple[bytes, bytes]], words: str) -> None:
    auth, _ = stage(tmp_path, Fn("chat", auth="key"))
    err = refused(auth, headers)
    assert (err.status, err.code) == (401, "unauthorized") and words in str(err)
    assert (b"www-authenticate", b'Bearer realm="edgefn"') in err.headers


def test_revoked_and_expired_keys_are_401_naming_their_state(tmp_path: Path) -> None:
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    revoked, r = store.create("acme", ("*",))
    store.revoke(r.id)
    expired, e = store.create("acme", ("*",), expires=time.time() - 1)
    auth.keys.reload()
    challenge = (b"www-authenticate", b'Bearer realm="edgefn"')
    for key, words in ((revoked, f"API key {r.id} is revoked"),
                       (expired, f"API key {e.id} is expired")):
        err = refused(auth, bearer(key))
        assert words in str(err) and (err.status, err.code) == (401, "unauthorized")
        assert challenge in err.headers  # every 401 carries it (mutation testing)


@pytest.mark.parametrize(("scopes", "ok"), [
    (("fn:chat",), True), (("fn:ch*",), True), (("*",), True), (("route:/x*",), True),
    (("fn:other",), False), (("model:*",), False), (("route:/y*",), False),
    (("admin:deploy",), False)])
def test_scopes_decide_between_the_function_and_403(
        tmp_path: Path, scopes: tuple[str, ...], ok: bool) -> None:
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    key, _ = store.create("acme", scopes)
    auth.keys.reload()
    if ok:
        assert call(auth, bearer(key))[1].body == b"ok"
    else:
        err = refused(auth, bearer(key))
        assert (err.status, err.code) == (403, "forbidden")
        assert "function 'chat'" in str(err) and "tenant 'acme'" in str(err)


def test_none_mode_sets_a_valid_principal_and_ignores_foreign_credentials(
        tmp_path: Path) -> None:
    auth, store = stage(tmp_path, Fn("open"))
    key, record = store.create("acme", ("fn:other",))
    auth.keys.reload()
    ctx, response = call(auth, bearer(key))
    assert response.body == b"ok" and ctx.principal == record.principal()
    for foreign in ([(b"authorization", b"Basic dXNlcjpwdw==")], bearer("sk-theirs"), []):
        ctx, response = call(auth, foreign)
        assert response.body == b"ok" and ctx.principal is None


def test_the_pop_default_mode_applies_to_functions_that_say_nothing(tmp_path: Path) -> None:
    auth, _ = stage(tmp_path, Fn("quiet"), AuthSettings(functions="key"))
    assert refused(auth).status == 401
    auth, _ = stage(tmp_path, Fn("loud", auth="none"), AuthSettings(functions="key"))
    assert call(auth)[1].body == b"ok"


def test_the_openai_api_asks_for_a_key_once_any_key_exists(tmp_path: Path) -> None:
    auth, store = stage(tmp_path, OpenAITarget())
    assert call(auth)[1].body == b"ok"  # auto, no keys yet
    fn_only, _ = store.create("acme", ("fn:*",))
    models, _ = store.create("acme", ("model:smollm2*",))
    auth.keys.reload()
    assert refused(auth).status == 401
    assert refused(auth, bearer(fn_only)).status == 403
    assert call(auth, bearer(models))[1].body == b"ok"
    for record in store.read():  # every key revoked: still a key (it opened to anyone)
        store.revoke(record.id)
    auth.keys.reload()
    assert refused(auth).status == 401 and refused(auth, bearer(models)).status == 401
    auth, _ = stage(tmp_path, OpenAITarget(), AuthSettings(openai="none"))
    assert call(auth)[1].body == b"ok"


def test_unrouted_requests_pass_on_to_route(tmp_path: Path) -> None:
    auth, _ = stage(tmp_path, None, AuthSettings(functions="key"))
    assert call(auth, path=b"/nothing-here")[1].body == b"ok"


# -- JWT --------------------------------------------------------------------------------------
@pytest.fixture
def es256(tmp_path: Path) -> tuple[Any, Path]:
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(pyjwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "ES256"}]}))
    return private, path


def token(key: Any, alg: str = "ES256", kid: str | None = "k1", **claims: Any) -> str:
    body = {"tenant": "acme", "sub": "user-7", "scope": "fn:chat model:*",
            "exp": int(time.time()) + 60, "iss": "https://idp.test", **claims}
    return pyjwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=alg,
                        headers={"kid": kid} if kid else None)


def test_jwt_mode_verifies_es256_against_the_jwks(tmp_path: Path,
                                                  es256: tuple[Any, Path]) -> None:
    private, jwks = es256
    verifier = JwtVerifier(JwtSettings(jwks=str(jwks), issuer="https://idp.test"))
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"), jwt=verifier)
    ctx, _ = call(auth, bearer(token(private)))
    assert ctx.principal is not None
    assert (ctx.principal.kind, ctx.principal.tenant, ctx.principal.subject,
            ctx.principal.scopes) == ("jwt", "acme", "user-7", ("fn:chat", "model:*"))
    # beside an x-api-key (in either order), the JWT is what jwt mode reads
    other = (b"x-api-key", b"efn_" + b"a" * 12 + b"_" + b"b" * 43)
    for headers in ([other, *bearer(token(private))], [*bearer(token(private)), other]):
        assert call(auth, headers)[0].principal == ctx.principal, headers


@pytest.mark.parametrize(("make", "words"), [
    (lambda k: token(k, exp=int(time.time()) - 120), "expired"),
    (lambda k: token(k, iss="https://evil.test"), "issuer"),
    (lambda k: token(k, tenant=None), "no 'tenant' claim"),
    (lambda k: token(k, tenant="acme\nx"), "'tenant' claim is no tenant name"),  # broke
    (lambda k: token(k, tenant='Acme "Corp"'), "'tenant' claim is no tenant name"),  # tables
    (lambda k: token(k, kid="k2"), "no key with kid 'k2'"),
    (lambda k: token(ec.generate_private_key(ec.SECP256R1())), "Signature verification"),
    (lambda k: token(k, exp=None), 'missing the "exp" claim'),
    (lambda k: token("shared-secret-that-is-long-enough-32b", alg="HS256"), "HS256"),
    (lambda k: pyjwt.encode({"tenant": "acme", "exp": int(time.time()) + 60}, None,
                            algorithm="none"), "algorithm 'none' is not accepted"),
    (lambda k: "not.a.jwt", "invalid token"),
])
def test_jwts_that_do_not_verify_are_401_saying_why(tmp_path: Path, es256: tuple[Any, Path],
                                                    make: Any, words: str) -> None:
    private, jwks = es256
    verifier = JwtVerifier(JwtSettings(jwks=str(jwks), issuer="https://idp.test"))
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"), jwt=verifier)
    err = refused(auth, bearer(make(private)))
    assert (err.status, err.code) == (401, "unauthorized") and words in str(err), str(err)
    assert (b"www-authenticate", b'Bearer realm="edgefn"') in err.headers


def test_hs256_uses_the_secret_from_the_environment(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s" * 40
    monkeypatch.setenv("EDGEFN_TEST_JWT", secret)
    verifier = JwtVerifier(JwtSettings(secret_env="EDGEFN_TEST_JWT", algorithms=["HS256"]))
    assert verifier.verify(token(secret, alg="HS256", kid=None)).tenant == "acme"
    with pytest.raises(TokenInvalid, match="Signature verification"):
        verifier.verify(token("t" * 40, alg="HS256", kid=None))
    monkeypatch.delenv("EDGEFN_TEST_JWT")
    with pytest.raises(InvalidConfig, match="'EDGEFN_TEST_JWT' is not set"):
        JwtVerifier(JwtSettings(secret_env="EDGEFN_TEST_JWT", algorithms=["HS256"]))


def test_a_jwt_config_that_can_verify_no_token_is_refused_naming_why(
        es256: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A JWKS of ES256 keys with only HS256 allowed and no secret started, and then every
    token was a 401; `algorithms = []` with a secret said "needs `jwks` or
    `secret_env`", which was given; a secret with HS256 not allowed was ignored."""
    _, jwks = es256
    monkeypatch.setenv("EDGEFN_TEST_JWT", "s" * 40)
    for settings, words in (
            (JwtSettings(jwks=str(jwks), algorithms=["HS256"]),
             "no key for the allowed algorithms (HS256): the JWKS holds ES256 keys"),
            (JwtSettings(jwks=str(jwks), algorithms=["RS256"]),
             "no key for the allowed algorithms (RS256)"),
            (JwtSettings(secret_env="EDGEFN_TEST_JWT", algorithms=[]),
             "allow at least one of HS256, RS256, ES256"),
            (JwtSettings(secret_env="EDGEFN_TEST_JWT"),
             "`secret_env` is an HS256 secret, but `algorithms` (RS256, ES256) does not "
             "allow HS256")):
        with pytest.raises(InvalidConfig) as e:
            JwtVerifier(settings)
        assert e.value.field == "auth.jwt.algorithms" and words in e.value.reason, e.value
    JwtVerifier(JwtSettings(jwks=str(jwks), secret_env="EDGEFN_TEST_JWT",
                            algorithms=["HS256", "RS256"]))  # HS256 has its secret


def test_a_jwks_file_that_cannot_be_loaded_is_an_invalid_config(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"keys": [{"kty": "nope"}]}')
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(InvalidConfig, match=r"auth\.jwt\.jwks"):
            JwtVerifier(JwtSettings(jwks=str(path)))


# -- end to end -------------------------------------------------------------------------------
WHO = """
from edgefn import Response

def handle(request, env):
    p = request.principal
    return Response.json(None if p is None else {"tenant": p.tenant, "kind": p.kind,
                          "key_id": p.key_id, "scopes": list(p.scopes)})
"""


@pytest.fixture
def authed(tmp_path: Path) -> Any:
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(python_function(tmp_path, "who", WHO, extra='auth = "key"\n'))
        pop.deploy(python_function(tmp_path, "open", WHO))
        yield pop


def test_a_python_function_sees_the_principal_and_a_revoke_takes_effect(
        authed: Running) -> None:
    store = KeyStore(authed.data)
    key, record = store.create("acme", ("fn:who", "fn:open"))
    authed.admin.request("POST", "/v1/keys/reload")
    status, headers, body = authed.get("/who", headers={"authorization": f"Bearer {key}"})
    assert status == 200, body
    assert json.loads(body) == {"tenant": "acme", "kind": "key", "key_id": record.id,
                                "scopes": ["fn:who", "fn:open"]}
    assert json.loads(authed.get("/open")[2]) is None
    assert json.loads(authed.get("/open", headers={"x-api-key": key})[2])["tenant"] == "acme"
    status, headers, body = authed.get("/who")
    error = msgspec.json.decode(body)["error"]
    assert status == 401 and error["kind"] == "unauthorized"
    assert headers["www-authenticate"] == 'Bearer realm="edgefn"'
    assert headers["x-request-id"] and "x-edgefn-function" not in headers
    store.revoke(record.id)
    authed.admin.request("POST", "/v1/keys/reload")
    status, _, body = authed.get("/who", headers={"x-api-key": key})
    assert status == 401 and b"revoked" in body


def test_the_cli_creates_lists_and_revokes_keys(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.cli.main import main

    data = str(tmp_path / "d")
    assert main(["keys", "create", "--data", data, "--tenant", "acme", "--scopes",
                 "fn:*,model:*", "--tpm", "900", "--expires", "2d", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["tpm"] == 900 and created["state"] == "active"
    assert 2 * 86400 - 60 < created["expires"] - time.time() <= 2 * 86400
    assert keymod.is_well_formed(created["key"])
    [stored] = KeyStore(Path(data)).read()
    assert stored.id == created["id"] and stored.hash == keymod.digest(created["key"])
    # a bad --expires is a bad flag value: exit status 2, the flag named, like the others
    # (it was 1, found after parsing); expired when made, a traceback (year 10000), 8.6e15 s
    for when in ("yesterday", "0d", "0m", "9999-12-31T23:59:59", "99999999999d",
                 "2000-01-01T00:00:00"):
        assert main(["keys", "create", "--data", data, "--tenant", "a", "--scopes", "fn:*",
                     "--expires", when]) == 2, when
        assert "argument --expires: " in capsys.readouterr().err
    for bad, words in ((["--tenant", "Bad Name", "--scopes", "*"], "--tenant"),
                       (["--tenant", "a", "--scopes", "fn"], "--scopes"),
                       (["--tenant", "a", "--scopes", "admin:bogus"], "grants no admin"),
                       (["--tenant", "a", "--scopes", "fn:*,admin:delet"], "grants no admin")):
        assert main(["keys", "create", "--data", data, *bad]) == 1
        assert words in capsys.readouterr().err
    for limit in ("--rpm", "--tpm", "--max-streams"):  # a limit that refuses everything
        for value in ("0", "-5"):
            assert main(["keys", "create", "--data", data, "--tenant", "a", "--scopes", "*",
                         limit, value]) == 2
            assert "must be 1 or more" in capsys.readouterr().err
    with pytest.raises(ValueError, match="rpm must be 1 or more, got 0"):
        KeyStore(Path(data)).create("a", ("*",), rpm=0)
    assert len(KeyStore(Path(data)).read()) == 1  # nothing stored
    (Path(data) / "keys.json").write_text((Path(data) / "keys.json").read_text().replace(
        '"tpm": 900', '"tpm": -5'))  # a file edited by hand does not load with it
    with pytest.raises(InvalidConfig, match="tpm"):
        KeyStore(Path(data)).read()
    (Path(data) / "keys.json").write_text((Path(data) / "keys.json").read_text().replace(
        '"tpm": -5', '"tpm": 900'))
    assert main(["keys", "revoke", "--data", data, stored.id]) == 0
    assert main(["keys", "ls", "--data", data, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (row["id"], row["state"]) == (stored.id, "revoked") and "key" not in row
    assert main(["keys", "revoke", "--data", data, "0" * 12]) == 1


def test_admin_keys_act_for_their_tenant_within_their_admin_scopes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefn_core.errors import AdminError
    from runtime.admin.client import AdminClient

    with pop_thread(tmp_path / "data") as pop:
        store = KeyStore(pop.data)
        deployer, _ = store.create("acme", ("admin:deploy", "admin:read"))
        other, _ = store.create("beta", ("admin:*",))
        pop.admin.request("POST", "/v1/keys/reload")
        mine = python_function(tmp_path / "a", "mine", WHO, extra='owner = "acme"\n')
        monkeypatch.setenv("EDGEFN_API_KEY", deployer)
        acme = AdminClient(pop.data)
        assert acme.deploy(mine)["name"] == "mine"
        assert [f["name"] for f in acme.request("GET", "/v1/functions")["functions"]] == ["mine"]
        with pytest.raises(AdminError) as err:  # no owner: the function's own name
            acme.deploy(python_function(tmp_path / "b", "loose", WHO))
        assert (err.value.status, err.value.code) == (403, "not_owner")
        assert "set owner = 'acme' in edgefn.toml (it sets none)" in str(err.value)
        with pytest.raises(AdminError) as err:
            acme.request("DELETE", "/v1/functions/mine")
        assert (err.value.status, err.value.code) == (403, "forbidden")
        assert "no scope admin:delete" in str(err.value)
        renamed = python_function(tmp_path / "c", "mine2", WHO, extra='owner = "acme"\n')
        with pytest.raises(AdminError) as err:  # a deploy replacing it deletes it too
            acme.deploy(renamed, replaces="mine")
        assert (err.value.status, err.value.code) == (403, "forbidden")
        assert "no scope admin:delete" in str(err.value)
        monkeypatch.setenv("EDGEFN_API_KEY", other)
        with pytest.raises(AdminError) as err:
            AdminClient(pop.data).request("DELETE", "/v1/functions/mine")
        assert (err.value.status, err.value.code) == (403, "not_owner")
        monkeypatch.setenv("EDGEFN_API_KEY", "efn_" + "0" * 12 + "_" + "x" * 43)
        with pytest.raises(AdminError) as err:
            AdminClient(pop.data).request("GET", "/v1/functions")
        assert err.value.status == 401
        assert pop.get("/mine")[0] == 200  # still served


def test_a_tenants_key_reaches_only_its_own_functions_and_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scope is chosen from the path as it is routed (``%6bv`` is ``kv``), and a
    tenant's key lists, reads and changes only its tenant's functions, namespaces
    and indexes (or what their owner granted it)."""
    from edgefn_core.errors import AdminError
    from runtime.admin.client import AdminClient

    def refused(client: AdminClient, method: str, path: str, body: object = None) -> str:
        with pytest.raises(AdminError) as err:
            client.request(method, path, b"" if body is None else _j(body))
        assert err.value.status == 403, (path, err.value)
        return str(err.value.code)

    with pop_thread(tmp_path / "data") as pop:
        store = KeyStore(pop.data)
        reader, _ = store.create("beta", ("admin:read",))
        beta, _ = store.create("beta", ("admin:*",))
        pop.admin.request("POST", "/v1/keys/reload")
        for name, kv in (("versions", "acmedata"), ("reads", "shared")):
            pop.deploy(python_function(tmp_path / "a", name, WHO, extra=(
                f'owner = "acme"\n[bindings]\nkv = ["{kv}"]\n'
                '[bindings.share.kv]\nshared = { read = ["beta"] }\n' if kv == "shared" else
                f'owner = "acme"\n[bindings]\nkv = ["{kv}"]\n')))
        for ns in ("acmedata", "shared"):
            pop.admin.request("POST", f"/v1/kv/{ns}/put", _j({"key": "k", "value": "c2VjcmV0"}))
        monkeypatch.setenv("EDGEFN_API_KEY", reader)
        r = AdminClient(pop.data)
        for path in ("/v1/%6bv/acmedata/get", "/v1/%6Bv/acmedata/put", "/v1/%64ashboard/login",
                     "/v1/%76ectors/x/stats", "/v1/%63ache/purge"):
            assert refused(r, "POST", path, {"key": "k"}) == "forbidden"
        assert refused(r, "POST", "/v1/functions/reads/%72ollback") == "forbidden"
        monkeypatch.setenv("EDGEFN_API_KEY", beta)
        b = AdminClient(pop.data)
        assert b.request("GET", "/v1/functions")["functions"] == []
        assert refused(b, "GET", "/v1/functions/reads/versions") == "not_owner"
        assert refused(b, "POST", "/v1/dashboard/login") == "not_owner"  # every tenant's
        assert refused(b, "DELETE", "/v1/functions/versions") == "not_owner"
        assert refused(b, "POST", "/v1/kv/acmedata/get", {"key": "k"}) == "not_owner"
        assert refused(b, "POST", "/v1/kv/acmedata/list", {}) == "not_owner"
        assert refused(b, "POST", "/v1/kv/nobody/put", {"key": "k", "value": "eA=="}) \
            == "not_owner"  # unclaimed: a later owner's function would read what it planted
        got = b.request("POST", "/v1/kv/shared/get", _j({"key": "k"}))
        assert got["result"]["value"] == "c2VjcmV0"  # granted read
        assert refused(b, "POST", "/v1/kv/shared/put", {"key": "k", "value": "eA=="}) \
            == "not_owner"
        assert pop.get("/versions")[0] == 200  # still served
        # a name acme used before: beta sees the events of its own version only
        assert pop.get("/reads?card=4111")[0] == 200
        pop.admin.request("DELETE", "/v1/functions/reads")
        b.deploy(python_function(tmp_path / "b", "reads", WHO, extra='owner = "beta"\n'))
        assert pop.get("/reads?mine=1")[0] == 200
        seen = b.request("GET", "/v1/events?function=reads&limit=1000")["events"]
        assert [e["query"] for e in seen] == ["mine=1"]
        assert {e["owner"] for e in seen} == {"beta"}
        monkeypatch.delenv("EDGEFN_API_KEY")
        got = AdminClient(pop.data).request("POST", "/v1/kv/acmedata/get", _j({"key": "k"}))
        assert got["result"]["value"] == "c2VjcmV0"  # untouched; the operator reaches any store


def _j(body: object) -> bytes:
    return json.dumps(body).encode()


WHO_C = r"""
#include "edgefn.h"
int64_t handle(const edgefn_request *req) {
    edgefn_str t = edgefn_principal(req, "tenant"), k = edgefn_principal(req, "key_id");
    edgefn_str p = edgefn_param(req, "x");
    char out[256];
    uint32_t n = 0;
    for (uint32_t i = 0; i < t.len; i++) out[n++] = t.ptr[i];
    out[n++] = '/';
    for (uint32_t i = 0; i < k.len; i++) out[n++] = k.ptr[i];
    out[n++] = '/';
    for (uint32_t i = 0; i < p.len; i++) out[n++] = p.ptr[i];
    return edgefn_respond(200, "text/plain", out, n);
}
"""


def test_a_c_reactor_reads_the_principal_after_the_params(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from tests.support import in_ci

    if shutil.which("clang") is None:
        if in_ci():
            raise AssertionError("clang is missing: `make toolchains` installs it")
        pytest.skip("clang is missing: run `make toolchains`")
    sdk = Path(__file__).resolve().parents[2] / "functions" / "sdk" / "c"
    fn = tmp_path / "who-c"
    fn.mkdir()
    (fn / "who.c").write_text(WHO_C)
    subprocess.run(["clang", "--target=wasm32", "-O2", "-nostdlib", "-Wl,--no-entry",
                    "-Wl,--allow-undefined", f"-I{sdk}", "-o", str(fn / "who.wasm"),
                    str(fn / "who.c")], check=True)
    (fn / "edgefn.toml").write_text('name = "who-c"\nruntime = "wasm"\nentry = "who.wasm"\n'
                                    'routes = ["/who-c/:x"]\n')
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(fn)
        key, record = KeyStore(pop.data).create("acme", ("fn:who-c",))
        pop.admin.request("POST", "/v1/keys/reload")
        assert pop.get("/who-c/7")[2] == b"//7"  # anonymous: no principal section
        assert pop.get("/who-c/8", headers={"x-api-key": key})[2] == f"acme/{record.id}/8".encode()


def test_limits_show_lists_rules_tenants_and_active_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.cli.main import main

    data = tmp_path / "data"
    (tmp_path / "pop.toml").write_text(
        'data = "data"\n[ratelimit]\nipv4_prefix = 24\n[[ratelimit.rules]]\nby = "ip"\n'
        'limit = "100/minute"\n[ratelimit.tenants.acme]\ntpm = 5000\nmax_streams = 2\n')
    store = KeyStore(data)
    _, kept = store.create("acme", ("*",), rpm=60)
    _, gone = store.create("acme", ("*",), rpm=1)
    store.revoke(gone.id)
    assert main(["limits", "show", "--config", str(tmp_path / "pop.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ip_aggregation"] == "/24 /64"  # an IPv6 client's /64 is one client
    assert out["rules"] == [{"by": "ip", "limit": "100/minute", "algorithm": "sliding_window"}]
    assert out["tenants"] == {"acme": {"rpm": None, "tpm": 5000, "max_streams": 2}}
    assert [k["id"] for k in out["keys"]] == [kept.id] and out["keys"][0]["rpm"] == 60
    # --data given beside --config wins over the file's data (even the default name)
    other = tmp_path / ".edgefn"
    _, theirs = KeyStore(other).create("beta", ("*",), rpm=7)
    assert main(["limits", "show", "--config", str(tmp_path / "pop.toml"), "--data",
                 str(other), "--json"]) == 0
    assert [k["id"] for k in json.loads(capsys.readouterr().out)["keys"]] == [theirs.id]


def test_limits_show_asks_the_running_pop_and_lists_functions_limits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --config it printed the defaults, not what the PoP on the data dir
    enforces, and never a function's own [[rate_limits]]."""
    from runtime.cli.main import main

    with pop_thread(tmp_path / "data", **{"ratelimit.ipv4_prefix": 24}) as pop:
        pop.deploy(python_function(tmp_path, "rl", WHO, extra=(
            '[[rate_limits]]\nby = "ip"\nlimit = "3/minute"\n')))
        KeyStore(pop.data).create("acme", ("*",), rpm=60)
        assert main(["limits", "show", "--data", str(pop.data), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["ip_aggregation"].startswith("/24 ")  # the running PoP's own config
        assert out["functions"] == {"rl": [{"by": "ip", "limit": "3/minute",
                                            "algorithm": "sliding_window"}]}
        assert [k["rpm"] for k in out["keys"]] == [60]
        assert main(["limits", "show", "--data", str(pop.data)]) == 0
        assert "function rl: 3/minute per ip (sliding_window)" in capsys.readouterr().out


def test_a_verified_jwt_is_remembered_only_until_it_expires(es256: tuple[Any, Path]) -> None:
    private, jwks = es256
    verifier = JwtVerifier(JwtSettings(jwks=str(jwks), leeway_seconds=0))
    long_lived = token(private)
    assert verifier.verify(long_lived) is verifier.verify(long_lived)
    short = token(private, exp=int(time.time()) + 1)
    assert verifier.verify(short).tenant == "acme"
    time.sleep(max(0.0, pyjwt.decode(short, options={"verify_signature": False})["exp"]
                   - time.time()) + 0.2)
    with pytest.raises(TokenInvalid, match="expired"):
        verifier.verify(short)


def test_a_route_scope_is_decided_per_path_not_remembered_per_function(tmp_path: Path) -> None:
    auth, store = stage(tmp_path, Fn("site", auth="key"))
    key, _ = store.create("acme", ("route:/x*",))
    auth.keys.reload()
    for _ in range(2):  # twice: a remembered decision must not leak to the other path
        assert call(auth, bearer(key), path=b"/x/1")[1].body == b"ok"
        assert refused(auth, bearer(key), path=b"/y/1").status == 403
    fn_key, _ = store.create("acme", ("fn:site",))
    auth.keys.reload()
    for path in (b"/x/1", b"/y/1", b"/x/1"):
        assert call(auth, bearer(fn_key), path=path)[1].body == b"ok"
    assert len(auth.grants) == 1  # the function-wide scope's decision, kept


@pytest.mark.parametrize("path", [b"/x/a/../b", b"/x/a/%2e%2e/b", b"/x/a/..%2fb",
                                  b"/x/./../y", b"/x/a/%2E%2E/b"])
def test_a_route_scope_is_not_escaped_with_dot_segments(tmp_path: Path, path: bytes) -> None:
    """A function that normalises its path read these as another route: /x/b, /y."""
    auth, store = stage(tmp_path, Fn("site", auth="key"))
    key, _ = store.create("acme", ("route:/x/*",))
    auth.keys.reload()
    assert call(auth, bearer(key), path=b"/x/a/b")[1].body == b"ok"
    assert call(auth, bearer(key), path=b"/x/a%20b")[1].body == b"ok"  # decoded, still /x/
    assert refused(auth, bearer(key), path=path).status == 403


@pytest.mark.parametrize("path", [b"/pub%2fx", b"/pub%2Fanything", b"/pub%2f"])
def test_a_route_scope_is_not_escaped_with_an_encoded_slash(tmp_path: Path, path: bytes) -> None:
    """Decoded, these are /pub/...; the router matched them as sent (not /pub, so
    they reached the function at / with a key scoped to route:/pub/*)."""
    auth, store = stage(tmp_path, Fn("site", auth="key"))
    key, _ = store.create("acme", ("route:/pub/*",))
    auth.keys.reload()
    assert call(auth, bearer(key), path=b"/pub/x")[1].body == b"ok"
    assert refused(auth, bearer(key), path=path).status == 403
    spaced, _ = store.create("acme", ("route:/my docs/*",))  # a decoded scope still grants
    auth.keys.reload()
    assert call(auth, bearer(spaced), path=b"/my%20docs/x")[1].body == b"ok"


def test_a_route_scope_of_a_path_beyond_ascii_matches_as_clients_send_it(
        tmp_path: Path) -> None:
    """The path was decoded as latin-1 (/caf%C3%A9 read "cafÃ©"): no `route:` scope,
    written either way, ever granted it."""
    auth, store = stage(tmp_path, Fn("site", auth="key"))
    plain, _ = store.create("acme", ("route:/café/*",))
    encoded, _ = store.create("acme", ("route:/caf%C3%A9/*",))
    auth.keys.reload()
    for key in (plain, encoded):
        assert call(auth, bearer(key), path=b"/caf%C3%A9/menu")[1].body == b"ok"
        assert refused(auth, bearer(key), path=b"/cafe/menu").status == 403


def test_jwt_mode_takes_only_a_bearer_token(tmp_path: Path, es256: tuple[Any, Path]) -> None:
    private, jwks = es256
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"),
                    jwt=JwtVerifier(JwtSettings(jwks=str(jwks))))
    err = refused(auth, [(b"x-api-key", token(private).encode())])
    assert err.status == 401 and "expected a JWT in `Authorization: Bearer`" in str(err)
    err = refused(auth, [])  # it said "needs an API key" in JWT mode too
    assert err.status == 401 and "function 'chat' needs a JWT: send `Authorization: Bearer " \
        "<token>`" in str(err)
    assert (b"www-authenticate", b'Bearer realm="edgefn"') in err.headers
    auth, _ = stage(tmp_path, Fn("chat", auth="jwt"))  # a PoP without [auth.jwt]
    err = refused(auth, bearer(token(private)))
    assert "this PoP has no [auth.jwt]" in str(err) and err.headers
    err = refused(stage(tmp_path, Fn("chat", auth="jwt"),
                        jwt=JwtVerifier(JwtSettings(jwks=str(jwks))))[0], bearer("nope"))
    assert (b"www-authenticate", b'Bearer realm="edgefn"') in err.headers


def test_a_keys_limits_reach_its_principal_once_per_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    _, record = store.create("acme", ("fn:*",), rpm=60, tpm=5000, max_streams=3)
    assert (record.rpm, record.tpm, record.max_streams) == (60, 5000, 3)
    assert store.read() == [record]
    ring = KeyRing(store)
    who = ring.principal(record)
    assert (who.rpm, who.tpm, who.max_streams, who.key_id) == (60, 5000, 3, record.id)
    assert ring.principal(record) is who  # made once: caches downstream key on it
    at = record.created + 10
    assert msgspec.structs.replace(record, expires=at).state(at) == "expired"
    assert msgspec.structs.replace(record, expires=at).state(at - 0.001) == "active"


def test_a_corrupted_key_file_keeps_the_keys_a_pop_had(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = KeyStore(tmp_path)
    key, record = store.create("acme", ("*",))
    ring = KeyRing(store)
    (tmp_path / "keys.json").write_text("{broken")
    clock = [time.monotonic() + keymod.RELOAD_INTERVAL]
    monkeypatch.setattr(keymod.time, "monotonic", lambda: clock[0])
    assert ring.lookup(key) == record
    assert "keeping the previous keys" in caplog.text and "not a key file" in caplog.text


def test_a_refusal_is_recorded_for_the_events_stage(tmp_path: Path) -> None:
    auth, store = stage(tmp_path, Fn("chat", auth="key"))
    key, _ = store.create("acme", ("fn:other",))
    auth.keys.reload()
    for headers, result in (([], "unauthorized"), (bearer(key), "forbidden")):
        request = Request(b"GET", b"/x", b"", headers, b"h", "1.1", True, "1.2.3.4:5")
        ctx = Context(request.client)
        with pytest.raises(Rejected):
            auth(request, ctx, lambda r, c: Response(200, [], b"ok"))
        assert ctx.decisions == {"auth": {"mode": "key", "result": result}}
        assert ctx.principal is None


def test_where_auth_is_off_a_jwt_or_a_key_still_names_the_caller(
        tmp_path: Path, es256: tuple[Any, Path]) -> None:
    private, jwks = es256
    auth, store = stage(tmp_path, Fn("open"), jwt=JwtVerifier(JwtSettings(jwks=str(jwks))))
    key, record = store.create("beta", ("fn:*",))
    auth.keys.reload()
    ctx, _ = call(auth, bearer(token(private)))
    assert ctx.principal is not None and (ctx.principal.kind, ctx.principal.tenant) == (
        "jwt", "acme")
    ctx, _ = call(auth, bearer(key))
    assert ctx.principal == record.principal()
    ctx, _ = call(auth, bearer(token(ec.generate_private_key(ec.SECP256R1()))))
    assert ctx.principal is None  # a token that does not verify names no one


SECRET = "topology-secret-0123456789"


def forwarded(tmp_path: Path, target: Any, secret: str = SECRET) -> tuple[Auth, KeyStore]:
    """The stage of a tier above an edge: a key exists, so its OpenAI API asks for one."""
    auth, store = stage(tmp_path, target)
    auth.secret = secret
    store.create("ops", ("*",))
    auth.keys.reload()
    return auth, store


def hop(auth: Auth, tenant_header: str, rid: bytes = b"rid-1",
        headers: list[tuple[bytes, bytes]] | None = None) -> tuple[Context, Response]:
    """A call as a lower tier forwards it: its request id and signed tenant."""
    request = Request(b"POST", b"/v1/chat/completions", b"",
                      [(b"x-edgefn-tenant", tenant_header.encode()), *(headers or [])], b"h",
                      "1.1", True, "10.0.0.2:5")
    ctx = Context(request.client)
    ctx.request_id = rid
    response = auth(request, ctx, lambda r, c: Response(200, [], b"ok"))
    assert isinstance(response, Response)
    return ctx, response


def test_a_model_call_a_lower_tier_forwarded_needs_no_key_of_this_pop(tmp_path: Path) -> None:
    """An upper tier with API keys answered 401 to every call its edges forwarded for
    their callers: the topology's signed tenant admits it (no principal: the
    residency stage names the tenant)."""
    auth, _ = forwarded(tmp_path, OpenAITarget())
    ctx, response = hop(auth, sign(SECRET, "globex", "rid-1"))
    assert response.body == b"ok" and ctx.principal is None
    assert ctx.decisions == {"auth": {"mode": "key", "result": "forwarded", "tenant": "globex"}}
    # signed for another request, or with another secret: not admitted (the 401 and its
    # challenge, as for any call without a key)
    for value in (sign(SECRET, "globex", "rid-2"), sign("another-secret-0123456", "globex",
                                                         "rid-1"), "globex;00"):
        with pytest.raises(Rejected) as err:
            hop(auth, value)
        assert err.value.status == 401 and err.value.headers


def test_only_a_call_without_a_credential_to_the_openai_api_is_read_as_forwarded(
        tmp_path: Path) -> None:
    value = sign(SECRET, "globex", "rid-1")
    auth, store = forwarded(tmp_path, Fn("chat", auth="key"))
    with pytest.raises(Rejected) as err:  # a function is never called across tiers
        hop(auth, value)
    assert err.value.status == 401
    auth, store = forwarded(tmp_path, OpenAITarget())
    key, record = store.create("acme", ("*",))
    auth.keys.reload()
    ctx, _ = hop(auth, "anything", headers=bearer(key))  # the key decides, not the header
    assert ctx.principal == record.principal()
    auth, _ = forwarded(tmp_path, OpenAITarget(), secret="")  # no topology secret here
    with pytest.raises(Rejected) as err:
        hop(auth, value)
    assert err.value.status == 401


# -- what mutation testing found unchecked (`make mutate`) -------------------------------------
def test_refusals_count_against_the_per_ip_limit_without_sockets(tmp_path: Path) -> None:
    """A credential-guessing flood got 401 after 401, never a 429, when `auth` did not
    tell the `ratelimit` stage after it (only an end-to-end test saw it)."""
    from runtime.pipeline.stages.ratelimit import RateLimit
    from runtime.security.settings import RateLimitSettings, RateRule

    auth, _ = stage(tmp_path, Fn("locked", auth="key"))
    limits = RateLimit(RateLimitSettings(rules=[RateRule("ip", "2/minute")]), auth.targets)
    auth.on_refused = limits.refused
    try:
        got = []
        for ip in ("10.0.0.1",) * 3 + ("10.0.0.9",):
            request = Request(b"GET", b"/x", b"", [(b"x-api-key", b"efn_wrong")], b"h", "1.1",
                              True, f"{ip}:5")
            with pytest.raises(Rejected) as err:
                auth(request, Context(request.client), lambda r, c: Response(200, [], b"ok"))
            got.append(err.value.status)
        assert got == [401, 401, 429, 401]
    finally:
        limits.close()


def test_a_refusal_counted_remotely_answers_its_429_or_else_the_401(tmp_path: Path) -> None:
    """The count on a shared store (Redis) is awaited: its 429 wins, else the 401."""
    import asyncio

    auth, _ = stage(tmp_path, Fn("chat", auth="key"))
    too_many = Rejected("rate_limited", 429, "slow down")
    for over, want in ((too_many, 429), (None, 401)):
        async def count(value: Rejected | None = over) -> Rejected | None:
            return value

        auth.on_refused = lambda r, c, count=count: count()  # type: ignore[misc]
        request = Request(b"GET", b"/x", b"", [], b"h", "1.1", True, "1.2.3.4:5")
        result = auth(request, Context(request.client), lambda r, c: Response(200, [], b"ok"))
        assert not isinstance(result, Response)
        with pytest.raises(Rejected) as err:
            asyncio.run(result)  # type: ignore[arg-type]
        assert err.value.status == want


def test_an_upper_tier_still_asks_for_a_key_and_a_key_wins_over_a_signed_tenant(
        tmp_path: Path) -> None:
    auth, store = forwarded(tmp_path, OpenAITarget())
    err = refused(auth)  # no key, no tenant header: the 401 and its challenge
    assert (err.status, err.code) == (401, "unauthorized")
    assert (b"www-authenticate", b'Bearer realm="edgefn"') in err.headers
    key, record = store.create("acme", ("*",))
    auth.keys.reload()
    ctx, _ = hop(auth, sign(SECRET, "globex", "rid-1"), headers=bearer(key))
    assert ctx.principal == record.principal()  # its scopes and limits, not globex's
    assert ctx.decisions is not None and ctx.decisions["auth"]["result"] == "ok"


def test_the_topology_secret_the_pop_builds_the_stage_with_admits_forwarded_calls(
        tmp_path: Path) -> None:
    """Tests set `auth.secret` afterwards; the PoP passes it to the constructor."""
    store = KeyStore(tmp_path)
    targets = Targets(SimpleNamespace(router=Router(), canaries={}))  # type: ignore[arg-type]
    targets.resolve = lambda request, ctx: _set(ctx, OpenAITarget())  # type: ignore[method-assign]
    assert Auth(AuthSettings(), KeyRing(store), targets).secret == ""
    auth = Auth(AuthSettings(), KeyRing(store), targets, None, SECRET)
    store.create("ops", ("*",))
    auth.keys.reload()
    ctx, _ = hop(auth, sign(SECRET, "globex", "rid-1"))
    assert ctx.decisions is not None and ctx.decisions["auth"]["result"] == "forwarded"


@pytest.mark.parametrize("path", [b"/x/..\\y", b"/x/a\\..\\..\\y", b"/x/a%5cb", b"/x/a%5Cb",
                                  b"/x/./y"])
def test_a_route_scope_is_not_escaped_with_backslashes(tmp_path: Path, path: bytes) -> None:
    auth, store = stage(tmp_path, Fn("site", auth="key"))
    key, _ = store.create("acme", ("route:/x/*",))
    auth.keys.reload()
    assert refused(auth, bearer(key), path=path).status == 403


def test_what_passes_the_stage_is_the_request_and_context_it_was_given(
        tmp_path: Path) -> None:
    """A forwarded hop and a warm-up take their own branches past the checks."""
    seen: list[tuple[Request, Context]] = []

    def record(r: Request, c: Context) -> Response:
        seen.append((r, c))
        return Response(200, [], b"ok")

    auth, _ = forwarded(tmp_path, OpenAITarget())
    request = Request(b"POST", b"/v1/chat/completions", b"",
                      [(b"x-edgefn-tenant", sign(SECRET, "globex", "rid-1").encode())], b"h",
                      "1.1", True, "10.0.0.2:5")
    ctx = Context(request.client)
    ctx.request_id = b"rid-1"
    auth(request, ctx, record)
    locked, _ = stage(tmp_path / "q", Fn("locked", auth="key"))
    quiet = Request(b"GET", b"/x", b"", [], b"h", "1.1", True, "1.2.3.4:5")
    ctx2 = Context(quiet.client)
    ctx2.quiet = True  # the PoP's warm-up: no credential, not refused
    locked(quiet, ctx2, record)
    assert seen == [(request, ctx), (quiet, ctx2)]


def test_every_jwt_mode_401_carries_the_challenge(tmp_path: Path) -> None:
    auth, _ = stage(tmp_path, Fn("chat", auth="key"))
    challenge = (b"www-authenticate", b'Bearer realm="edgefn"')
    jwt_auth, _ = stage(tmp_path / "jwt", Fn("chat", auth="jwt"))
    for headers in ([], bearer("a.b.c"), [(b"x-api-key", b"a.b.c")]):
        err = refused(jwt_auth, headers)
        assert (err.status, err.code) == (401, "unauthorized") and challenge in err.headers
    exactly = refused(auth, [(b"x-api-key", b"x" * 8192)])  # at the limit: read, then refused
    assert "malformed API key" in str(exactly) and "longer than" not in str(exactly)


HEADERS_SEEN = """
import json
from edgefn import Response

def handle(request, env):
    p = request.principal
    body = json.dumps({"key_id": p.key_id if p else None,
                       "credentials": [[k, v] for k, v in request.headers.items()
                                       if k in ("authorization", "x-api-key")]})
    return Response(body, headers={"cache-control": "s-maxage=60", "vary": "authorization"})
"""


def raw_get(pop: Running, path: str, headers: list[tuple[str, str]]) -> dict[str, Any]:
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    try:
        conn.putrequest("GET", path)
        for name, value in headers:
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]
    finally:
        conn.close()


def test_no_edgefn_key_reaches_a_function_and_the_cache_still_varies_by_it(
        tmp_path: Path) -> None:
    """The README says the key never reaches a function: the function got it as sent (a
    third party's collected its callers' keys), a valid key behind a Basic line too,
    and keys this PoP does not know. They are taken out as the request is handed to
    the function, after the HTTP cache, whose `Vary: Authorization` still tells one
    key's stored answer from another's within a tenant."""
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(python_function(tmp_path, "keyed", HEADERS_SEEN, extra='auth = "key"\n'))
        pop.deploy(python_function(tmp_path, "open", HEADERS_SEEN))
        store = KeyStore(pop.data)
        one, first = store.create("acme", ("fn:*",))
        two, second = store.create("acme", ("fn:*",))
        pop.admin.request("POST", "/v1/keys/reload")
        for header in ("authorization", "x-api-key"):
            value = f"Bearer {one}" if header == "authorization" else one
            got = raw_get(pop, f"/keyed?h={header}", [(header, value)])
            assert got == {"key_id": first.id, "credentials": []}
        # the cache varies by the key: each key its own stored answer
        for key, record in ((one, first), (two, second), (one, first)):
            got = raw_get(pop, "/keyed?c=1", [("authorization", f"Bearer {key}")])
            assert got["key_id"] == record.id
        basic = ("authorization", "Basic dXNlcjpwdw==")  # the function's own: kept
        unknown = "efn_" + "a" * 12 + "_" + "b" * 43
        for sent in ([basic, ("x-api-key", one)], [("x-api-key", unknown)],
                     [("authorization", f"bearer {unknown}")]):
            got = raw_get(pop, "/open", sent)
            assert got["credentials"] == ([list(basic)] if basic in sent else []), sent
        # a key in any other form (it reached the function: only `Bearer efn_` and
        # the bare key were dropped)
        wrapped = [f"Token {one}", f"ApiKey {one}", f"Bearer\t{one}", f"{one} extra",
                   f'Token token="{one}"', f"ApiKey key={one}", f'Bearer "{one}"',
                   "Basic " + base64.b64encode(f"{one}:".encode()).decode(),
                   "Basic " + base64.b64encode(f"user:{one}".encode()).decode(),
                   "Basic " + base64.b64encode(f"us:{one}".encode()).decode().rstrip("="),
                   "Basic " + base64.urlsafe_b64encode(f"u?:>{one}".encode()).decode()]
        for value in wrapped:
            got = raw_get(pop, "/open", [("authorization", value)])
            assert got["credentials"] == [], value


COOKIE_SEEN = """
import json
from edgefn import Response

def handle(request, env):
    return Response(json.dumps({"cookie": request.headers.get("cookie")}))
"""


def test_the_dashboards_session_cookie_never_reaches_a_function(tmp_path: Path) -> None:
    """The dashboard's session cookie has path /dashboard, and browsers send a host's
    cookies to all its ports: a function routed under /dashboard/ on the public port
    got the operator's session. It is taken out of the function's copy of the
    request (the other cookies kept, in order); a cookie merely named like it stays."""
    from runtime.observe.dashboard.serve import COOKIE
    from runtime.pipeline.stages.dispatch import OPERATOR_COOKIE
    assert COOKIE.encode() == OPERATOR_COOKIE  # one name, held in two places
    fn = python_function(tmp_path, "cookies", COOKIE_SEEN)
    manifest = fn / "edgefn.toml"
    manifest.write_text(manifest.read_text().replace(
        'routes = ["/cookies"]', 'routes = ["/cookies", "/dashboard/app"]'))
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(fn)
        for path in ("/dashboard/app", "/cookies"):
            for sent, seen in (("a=1; edgefn_dash=S3CR3T; b=2", "a=1; b=2"),
                               ("edgefn_dash=S3CR3T", None),
                               ("edgefn_dash=S3CR3T;a=1 ;  edgefn_dash = x", "a=1"),
                               ("edgefn_dashboard=1; x=edgefn_dash", "edgefn_dashboard=1; x=edgefn_dash"),
                               ("a=1", "a=1")):
                got = raw_get(pop, path, [("cookie", sent)])
                assert got == {"cookie": seen}, (path, sent)


def test_a_tenants_key_writes_to_its_stores_within_their_owners_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's key with `admin:kv`/`admin:vectors` wrote past its owner's quota
    (18.9 MB against 1 MiB in a QA run): the admin API held only functions to it.
    A tenant's key is held to it as its functions are; the operator is not."""
    from edgefn_core.errors import AdminError
    from runtime.admin.client import AdminClient

    big = base64.b64encode(b"x" * (600 << 10)).decode()  # two fit under 1 MiB, three do not
    with pop_thread(tmp_path / "data", **{"stores.kv_owner_quota_mb": 1,
                                          "stores.vectors_owner_quota_mb": 1}) as pop:
        pop.deploy(python_function(tmp_path, "owned", WHO, extra=(
            'owner = "atk"\n[bindings]\nkv = ["atkdata"]\nvectors = ["atkvec"]\n')))
        key, _ = KeyStore(pop.data).create("atk", ("admin:kv", "admin:vectors"))
        pop.admin.request("POST", "/v1/keys/reload")
        monkeypatch.setenv("EDGEFN_API_KEY", key)
        tenant = AdminClient(pop.data)
        tenant.request("POST", "/v1/kv/atkdata/put", _j({"key": "a", "value": big}))
        with pytest.raises(AdminError) as err:
            for name in ("b", "c"):
                tenant.request("POST", "/v1/kv/atkdata/put", _j({"key": name, "value": big}))
        assert "quota" in str(err.value) and "'atk'" in str(err.value), err.value
        rows = [{"id": f"v{i}", "vector": [0.5] * 384} for i in range(700)]  # 1.07 MB
        with pytest.raises(AdminError) as err:
            tenant.request("POST", "/v1/vectors/atkvec/upsert", _j({"items": rows}))
        assert "quota" in str(err.value), err.value
        monkeypatch.delenv("EDGEFN_API_KEY")
        operator = AdminClient(pop.data)  # not held to it
        for name in ("b", "c"):
            operator.request("POST", "/v1/kv/atkdata/put", _j({"key": name, "value": big}))
        operator.request("POST", "/v1/vectors/atkvec/upsert", _j({"items": rows}))
