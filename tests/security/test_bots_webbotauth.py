"""Web Bot Auth without sockets: signatures verified, forged, replayed, expired,
malformed; key directories loaded from files (and over HTTP in test_bots_e2e)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefn_core.errors import InvalidConfig, Rejected
from runtime.security.bots import webbotauth
from runtime.security.bots.webbotauth import Verifier
from tests.security.bots_helpers import HOST, directory, request, served_directory, signed

AGENT = "https://agent.example"
KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()


def verifier(max_age: float = 60.0, capacity: int = 1000) -> Verifier:
    return Verifier(directory((KEY, AGENT)), max_age, capacity=capacity)


def refused(v: Verifier, req: object, now: float | None = None) -> Rejected:
    with pytest.raises(Rejected) as info:
        v.verify(req, now)  # type: ignore[arg-type]
    return info.value


def test_a_signed_agent_is_verified_as_its_directory() -> None:
    v = verifier()
    got = v.verify(signed(KEY, agent=AGENT))
    assert got == (AGENT, webbotauth.thumbprint(webbotauth.public_jwk(KEY)))
    # without Signature-Agent the directory still names it
    assert v.verify(signed(KEY)).identity == AGENT
    # the dictionary form of Signature-Agent (newer drafts) names it too
    msg = webbotauth._Outgoing("GET", f"http://{HOST.decode()}/fn",
                               {"Signature-Agent": f'sig1="{AGENT}"'})
    _signer().sign(msg, key_id=_keyid(KEY), label="sig1", tag="web-bot-auth", nonce="dict",
                   covered_component_ids=("@authority", "signature-agent"),
                   expires=webbotauth._when(time.time() + 60))
    assert v.verify(request("/fn", msg.headers)).identity == AGENT


def test_a_key_from_a_file_proves_its_thumbprint() -> None:
    v = Verifier(directory((KEY, None)), 60)
    keyid = webbotauth.thumbprint(webbotauth.public_jwk(KEY))
    assert v.verify(signed(KEY)).identity == keyid


def test_the_thumbprint_is_rfc7638s() -> None:
    # RFC 8037 appendix A.3: the thumbprint of its Ed25519 example key
    jwk = {"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
    assert webbotauth.thumbprint(jwk) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_a_forged_signature_is_refused() -> None:
    v = verifier()
    good = signed(KEY, agent=AGENT)
    forged = signed(OTHER, agent=AGENT)  # another key claiming KEY's keyid
    keyid = webbotauth.thumbprint(webbotauth.public_jwk(KEY))
    other = webbotauth.thumbprint(webbotauth.public_jwk(OTHER))
    forged.headers = [(k, v.replace(other.encode(), keyid.encode())) for k, v in forged.headers]
    assert refused(v, forged).code == "bad_signature"
    # a valid signature over another authority does not cover this request
    moved = signed(KEY, agent=AGENT)
    moved.host = b"elsewhere.test"
    assert refused(v, moved).code == "bad_signature"
    # a changed Signature-Agent breaks the signature that covers it
    swapped = [(k, b'"https://evil.example"' if k == b"signature-agent" else v)
               for k, v in good.headers]
    good.headers = swapped
    assert refused(v, good).code == "bad_signature"


def test_a_replayed_signature_is_refused() -> None:
    v = verifier()
    req = signed(KEY, agent=AGENT)
    v.verify(req)
    err = refused(v, req)
    assert (err.code, err.status) == ("replayed_signature", 401)
    # the same nonce under a fresh signature is a replay too
    assert refused(v, signed(KEY, agent=AGENT, nonce=_nonce(req))).code == "replayed_signature"


def test_without_a_nonce_the_signature_bytes_are_the_replay_key() -> None:
    v = verifier()

    def unnonced(created: float) -> object:
        msg = webbotauth._Outgoing("GET", f"http://{HOST.decode()}/fn", {})
        _signer().sign(msg, key_id=_keyid(KEY), tag="web-bot-auth",
                       covered_component_ids=("@authority",), created=webbotauth._when(created),
                       expires=webbotauth._when(created + 60))
        assert "nonce" not in msg.headers["Signature-Input"]
        return request("/fn", msg.headers)

    now = time.time()
    first = unnonced(now)
    v.verify(first)  # type: ignore[arg-type]
    assert refused(v, first).code == "replayed_signature"
    v.verify(unnonced(now - 1))  # type: ignore[arg-type]  # another signature


def test_replays_are_refused_until_the_signature_is_too_old_anyway() -> None:
    v = verifier(max_age=30)
    now = time.time()
    req = signed(KEY, created=now)
    v.verify(req, now)
    assert refused(v, req, now + 20).code == "replayed_signature"
    # past max_age the signature itself is too old, so the replay set may forget it
    assert refused(v, signed(KEY, created=now - 40, nonce="x")).code == "bad_signature"


def test_an_expired_or_old_or_future_signature_is_refused() -> None:
    v = verifier(max_age=60)
    now = time.time()
    expired = signed(KEY, created=now - 30, expires_in=10)  # expired 20 s ago
    assert "expires" in str(refused(v, expired))
    old = signed(KEY, created=now - 120, expires_in=3600)  # older than max_age
    assert "age" in str(refused(v, old))
    future = signed(KEY, created=now + 60)
    assert "future" in str(refused(v, future))
    assert v.verify(signed(KEY, created=now - 50)).identity == AGENT  # within max_age


def test_the_signature_must_cover_the_authority_and_the_agent() -> None:
    v = verifier()
    url = f"http://{HOST.decode()}/fn"
    for covered, agent in ((("@method",), None), (("@authority",), AGENT)):
        headers = {"Signature-Agent": f'"{agent}"'} if agent else {}
        msg = webbotauth._Outgoing("GET", url, headers)
        _signer().sign(msg, key_id=_keyid(KEY), label="sig1", tag="web-bot-auth",
                    covered_component_ids=covered, nonce=f"n-{covered}",
                    expires=webbotauth._when(time.time() + 60))
        err = refused(v, request("/fn", headers))
        assert err.code == "bad_signature" and "not covered" in str(err)


def test_a_signature_without_expires_is_refused_and_one_without_the_tag_is_not_ours() -> None:
    v = verifier()
    url = f"http://{HOST.decode()}/fn"
    signer = _signer()
    no_expiry = webbotauth._Outgoing("GET", url, {})
    signer.sign(no_expiry, key_id=_keyid(KEY), tag="web-bot-auth",
                covered_component_ids=("@authority",))
    assert "expires" in str(refused(v, request("/fn", no_expiry.headers)))
    untagged = webbotauth._Outgoing("GET", url, {})
    signer.sign(untagged, key_id=_keyid(KEY), covered_component_ids=("@authority",),
                expires=webbotauth._when(time.time() + 60))
    err = refused(v, request("/fn", untagged.headers))  # another protocol's signature
    assert (err.code, str(err)) == ("not_web_bot_auth", "the request's signatures are not "
                                    "tagged 'web-bot-auth': not Web Bot Auth")


def test_signature_agent_must_name_the_keys_directory() -> None:
    v = verifier()
    err = refused(v, signed(KEY, agent="https://someone-else.example"))
    assert err.code == "bad_signature" and "someone-else" in str(err)


def test_an_unknown_key_is_not_a_forgery() -> None:
    err = refused(verifier(), signed(OTHER, agent=AGENT))
    assert err.code == "unknown_key"


def test_a_full_replay_set_fails_closed() -> None:
    v = verifier(capacity=2)
    v.verify(signed(KEY))
    v.verify(signed(KEY))
    assert refused(v, signed(KEY)).code == "replay_cache_full"


SIG_INPUT = ('sig1=("@authority");created={c};expires={e};keyid="{k}";alg="ed25519";'
             'nonce="n";tag="web-bot-auth"')


@pytest.mark.parametrize("headers", [
    {"signature-input": "sig1=(", "signature": "sig1=:AAAA:"},
    {"signature-input": "not a dictionary ;;;", "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT, "signature": "sig1=:not base64 at all:"},
    {"signature-input": SIG_INPUT, "signature": "sig1=:AAAA:"},  # wrong length
    {"signature-input": SIG_INPUT, "signature": "sig2=:AAAA:"},  # labels differ
    {"signature-input": SIG_INPUT},  # no Signature
    {"signature": "sig1=:AAAA:"},  # no Signature-Input
    {"signature-input": SIG_INPUT.replace('alg="ed25519"', 'alg="hmac-sha256"'),
     "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT.replace("created={c}", 'created="soon"'),
     "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT.replace("created={c}", "created=99999999999999"),
     "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT.replace('("@authority")', '("@authority" "@authority")'),
     "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT.replace('("@authority")', '("@query-param";name="x")'),
     "signature": "sig1=:AAAA:"},
    {"signature-input": SIG_INPUT, "signature": "sig1=:AAAA:",
     "signature-agent": "not a url"},
    {"signature-input": SIG_INPUT, "signature": "sig1=:AAAA:", "signature-agent": '"ftp://x"'},
    {"signature-input": SIG_INPUT, "signature": "sig1=:AAAA:", "signature-agent": "a=(("},
    {"signature-input": SIG_INPUT, "signature": "sig1=:AAAA:", "signature-agent": "\xff\xfe"},
    {"signature-input": "sig1=();tag=\"web-bot-auth\"", "signature": "sig1=:AAAA:"},
])
def test_malformed_signature_headers_are_a_clear_refusal(headers: dict[str, str]) -> None:
    now = int(time.time())
    filled = {k: v.format(c=now, e=now + 60, k=_keyid(KEY)) for k, v in headers.items()}
    err = refused(verifier(), request("/fn", filled))
    assert (err.code, err.status) == ("bad_signature", 401)
    assert str(err).startswith("Web Bot Auth: ")


def test_a_request_without_a_host_is_refused_not_crashed() -> None:
    req = signed(KEY)
    req.host = b""
    assert refused(verifier(), req).code == "bad_signature"
    req.host = b"bad host\x01"
    assert refused(verifier(), req).code == "bad_signature"


# -- key directories --------------------------------------------------------------------------
def test_directories_load_from_files_and_urls(tmp_path: Path) -> None:
    jwks = {"keys": [webbotauth.public_jwk(KEY), {"kty": "RSA", "n": "x", "e": "AQAB"}]}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    with served_directory({"keys": [webbotauth.public_jwk(OTHER)]}) as origin:
        keys = webbotauth.load_directories([str(path), origin])
    assert keys.keys[_keyid(KEY)][1] == _keyid(KEY)  # the RSA key is skipped
    assert keys.keys[_keyid(OTHER)][1] == origin
    assert len(keys.keys) == 2


@pytest.mark.parametrize(("content", "message"), [
    (b"{not json", "not JSON"),
    (b'{"keys": 3}', "not a JWKS"),
    (b'[1, 2]', "not a JWKS"),
    (b'{"keys": []}', "no Ed25519 key"),
    (b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "short"}]}', "field `x`"),
    (b'{"keys": [{"kty": "OKP", "crv": "Ed25519"}]}', "field `x`"),
])
def test_a_bad_directory_file_names_itself(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(content)
    with pytest.raises(InvalidConfig, match=message) as info:
        webbotauth.load_directories([str(path)])
    assert str(path) in str(info.value) and info.value.field == "bots.directories"


def test_an_unreachable_or_missing_directory_names_itself(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="cannot read"):
        webbotauth.load_directories([str(tmp_path / "missing.json")])
    with (served_directory({"keys": []}) as origin,
          pytest.raises(InvalidConfig, match="cannot fetch")):
        webbotauth.load_directories([origin + "/nowhere.json"])  # a 404
    with pytest.raises(InvalidConfig, match="cannot fetch"):
        webbotauth.load_directories([origin], timeout=2)  # the server is gone


def _signer() -> webbotauth.HTTPMessageSigner:
    return webbotauth.HTTPMessageSigner(
        signature_algorithm=webbotauth.algorithms.ED25519,
        key_resolver=webbotauth.MappingKeyResolver(public_keys={},
                                                   private_keys={_keyid(KEY): KEY}))


def _keyid(key: Ed25519PrivateKey) -> str:
    return webbotauth.thumbprint(webbotauth.public_jwk(key))


def _nonce(req: object) -> str:
    value = dict(req.headers)[b"signature-input"].decode()  # type: ignore[attr-defined]
    return value.split('nonce="')[1].split('"')[0]


def test_sign_makes_a_fresh_nonce_of_32_bytes() -> None:
    a, b = _nonce(signed(KEY)), _nonce(signed(KEY))
    assert a != b and len(base64.urlsafe_b64decode(a + "=")) == 32


def test_a_directory_over_a_mebibyte_is_refused() -> None:
    padded = {"keys": [webbotauth.public_jwk(KEY)], "pad": "x" * webbotauth.MAX_DIRECTORY_BYTES}
    with (served_directory(padded) as origin,
          pytest.raises(InvalidConfig, match="over 1048576 bytes")):
        webbotauth.load_directories([origin])
    small = {"keys": [webbotauth.public_jwk(KEY)], "pad": "x" * 1000}
    with served_directory(small) as origin:
        assert len(webbotauth.load_directories([origin]).keys) == 1


def test_the_command_line_makes_a_key_and_signs_for_curl(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    module = [sys.executable, "-m", "runtime.security.bots.webbotauth"]
    pem = tmp_path / "agent.pem"
    jwks = json.loads(subprocess.run([*module, str(pem), "--keygen"], capture_output=True,
                                     text=True, check=True).stdout)
    assert pem.stat().st_mode & 0o777 == 0o600  # a private key: its owner's only
    again = subprocess.run([*module, str(pem), "--keygen"], capture_output=True, text=True)
    assert again.returncode == 2 and "never replaces one" in again.stderr
    out = subprocess.run([*module, str(pem), f"http://{HOST.decode()}/fn", "--agent", AGENT],
                         capture_output=True, text=True, check=True).stdout
    flags = dict(re.findall(r"-H '([^:]+): ([^']*)'", out))
    assert set(flags) == {"Signature-Agent", "Signature-Input", "Signature"}
    keys = webbotauth.KeyDirectory()
    keys.add(jwks, AGENT, "printed")
    assert Verifier(keys, 60).verify(request("/fn", flags)).identity == AGENT
    bad = subprocess.run([*module, str(pem)], capture_output=True, text=True)
    assert bad.returncode == 2 and "needs an Ed25519 PEM key and a URL" in bad.stderr
