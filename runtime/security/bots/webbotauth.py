"""Web Bot Auth: an agent signs its requests (HTTP Message Signatures, RFC 9421)
with an Ed25519 key published in its key directory, so the PoP verifies who it
is instead of guessing from its User-Agent (IETF drafts web-bot-auth
architecture and http-message-signatures-directory).

A signed request carries

    Signature-Agent: "https://agent.example"         (optional: where its keys are)
    Signature-Input: sig1=("@authority" "signature-agent");created=...;expires=...;
                     keyid="<JWK thumbprint>";alg="ed25519";nonce="...";tag="web-bot-auth"
    Signature: sig1=:<base64 signature>:

`Verifier.verify` accepts it when the ``web-bot-auth`` signature verifies with a
key of a trusted directory (`KeyDirectory`, from ``[bots] directories``), covers
``@authority`` (and ``signature-agent`` when that header is sent), has ``created``
and ``expires``, is not older than ``signature_max_age``, and was not seen before
(its nonce, else its signature bytes, within max_age). The identity it proves is
the origin of the key's directory (``https://agent.example``) for a directory
fetched over HTTP, and the key's thumbprint for a local JWKS file.

`sign` is the agent's side, for tests and for trying it with curl:
``python -m runtime.security.bots.webbotauth --help``.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import http_sf
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from http_message_signatures import (
    HTTPMessageSignaturesException,
    HTTPMessageSigner,
    HTTPMessageVerifier,
    HTTPSignatureKeyResolver,
    MappingKeyResolver,
    algorithms,
)

from edgefn_core.errors import InvalidConfig, Rejected
from runtime.net.message import Request
from runtime.security.bots.seen import SeenSet, SharedSeen

TAG = "web-bot-auth"
WELL_KNOWN = "/.well-known/http-message-signatures-directory"
MAX_DIRECTORY_BYTES = 1 << 20
_FIELD = "bots.directories"


# -- keys and directories -------------------------------------------------------------------
def thumbprint(jwk: dict[str, Any]) -> str:
    """The RFC 7638 JWK thumbprint (SHA-256, base64url) of an Ed25519 (OKP) key."""
    canonical = json.dumps({"crv": jwk["crv"], "kty": jwk["kty"], "x": jwk["x"]},
                           separators=(",", ":"), sort_keys=True)
    return _b64(hashlib.sha256(canonical.encode()).digest())


def public_jwk(key: Ed25519PrivateKey | Ed25519PublicKey) -> dict[str, str]:
    """The public JWK of an Ed25519 key."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"kty": "OKP", "crv": "Ed25519", "x": _b64(raw)}


class KeyDirectory:
    """Trusted Ed25519 keys by thumbprint, each with the identity it proves."""

    def __init__(self) -> None:
        self.keys: dict[str, tuple[Ed25519PublicKey, str]] = {}

    def add(self, jwks: Any, identity: str | None, source: str) -> int:
        """Add the Ed25519 keys of the JWKS `jwks` (other key types are skipped);
        `identity` None: each key proves its own thumbprint. Returns how many were
        added; raises `InvalidConfig` naming `source` when the JWKS is malformed."""
        keys = jwks.get("keys") if isinstance(jwks, dict) else None
        if not isinstance(keys, list):
            raise InvalidConfig(source, "not a JWKS: expected {\"keys\": [...]}", _FIELD)
        added = 0
        for i, jwk in enumerate(keys):
            if isinstance(jwk, dict) and jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519":
                key = _public_key(jwk, f"{source}: keys[{i}]")
                keyid = thumbprint(jwk)
                self.keys[keyid] = (key, identity or keyid)
                added += 1
        return added


def load_directories(sources: list[str], timeout: float = 5.0) -> KeyDirectory:
    """The keys of every directory in `sources`: local JWKS files, or http(s) URLs
    fetched now (a bare origin means its ``/.well-known/...`` directory). Raises
    `InvalidConfig` naming the source when one cannot be read or holds no Ed25519 key."""
    directory = KeyDirectory()
    for source in sources:
        if source.startswith(("http://", "https://")):
            url = _directory_url(source)
            added = directory.add(_fetch(url, timeout), _origin(url), source)
        else:
            added = directory.add(_read(source), None, source)
        if added == 0:
            raise InvalidConfig(source, "the key directory holds no Ed25519 key", _FIELD)
    return directory


def _public_key(jwk: dict[str, Any], where: str) -> Ed25519PublicKey:
    raw = _unb64(jwk.get("x"))
    if raw is None or len(raw) != 32:
        raise InvalidConfig(where, "field `x` must be a base64url Ed25519 public key", _FIELD)
    return Ed25519PublicKey.from_public_bytes(raw)


def _directory_url(source: str) -> str:
    parts = urllib.parse.urlsplit(source)
    return source if parts.path not in ("", "/") else _origin(source) + WELL_KNOWN


def _fetch(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(MAX_DIRECTORY_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise InvalidConfig(url, f"cannot fetch the key directory: {e}", _FIELD) from None
    if len(body) > MAX_DIRECTORY_BYTES:
        raise InvalidConfig(url, f"the key directory is over {MAX_DIRECTORY_BYTES} bytes", _FIELD)
    return _json(body, url)


def _read(path: str) -> Any:
    try:
        return _json(Path(path).read_bytes(), path)
    except OSError as e:
        raise InvalidConfig(path, f"cannot read the key directory: {e.strerror}", _FIELD) from None


def _json(body: bytes, source: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as e:
        raise InvalidConfig(source, f"the key directory is not JSON: {e}", _FIELD) from None


# -- verifying ------------------------------------------------------------------------------
class Verified(NamedTuple):
    identity: str  # the directory's origin, or the key's thumbprint
    keyid: str


class Verifier:
    """Checks the Web Bot Auth signature of requests against `directory`."""

    def __init__(self, directory: KeyDirectory, max_age: float, scheme: str = "http",
                 capacity: int = 100_000, shared: Path | None = None) -> None:
        """`scheme`: how clients reach this listener (it decides ``@authority``'s
        default port). `capacity`: how many signatures the replay check remembers;
        `shared`: in an LMDB folder every process of the PoP checks (a signature
        replayed to another worker passed). Raises `lmdb.Error` for `shared`."""
        self.directory = directory
        self.max_age = max_age
        self.scheme = scheme
        self._max_age = datetime.timedelta(seconds=max_age)
        ttl = max_age + HTTPMessageVerifier.max_clock_skew.total_seconds()
        self._seen: SeenSet | SharedSeen = SharedSeen(shared, ttl, capacity) \
            if shared is not None else SeenSet(ttl, capacity)

    def verify(self, request: Request, now: float | None = None) -> Verified:
        """Who signed `request`. Raises `Rejected` with code ``bad_signature``
        (malformed, forged, expired, not covering what it must), ``replayed_signature``,
        ``unknown_key`` (no trusted directory holds the key), ``not_web_bot_auth``
        (well-formed signatures, none tagged ``web-bot-auth``: another protocol's) or
        ``replay_cache_full``; its message says why."""
        resolver = _Resolver(self.directory)
        message = _Message(request, self.scheme)
        try:
            if not _tagged(request):
                raise Rejected("not_web_bot_auth", 401, "the request's signatures are not "
                               f"tagged {TAG!r}: not Web Bot Auth")
            agent = _signature_agent(request.header(b"signature-agent"))
            required = ("@authority", "signature-agent") if agent else ("@authority",)
            verifier = HTTPMessageVerifier(signature_algorithm=algorithms.ED25519,
                                           key_resolver=resolver)
            results = verifier.verify(message, max_age=self._max_age, expect_tag=TAG,
                                      require_components=required)
        except (HTTPMessageSignaturesException, ValueError, TypeError, LookupError) as e:
            if resolver.missing is not None:
                raise _unknown(resolver.missing) from None
            raise Rejected("bad_signature", 401, f"Web Bot Auth: {e}") from None
        return self._accept(results[0].parameters, agent, request, now)

    def _accept(self, params: dict[str, Any], agent: str | None, request: Request,
                now: float | None) -> Verified:
        keyid = str(params["keyid"])
        if "expires" not in params:
            raise Rejected("bad_signature", 401, "Web Bot Auth: the signature has no `expires`")
        identity = self.directory.keys[keyid][1]
        if agent and identity.startswith(("http://", "https://")) and _origin(agent) != identity:
            raise Rejected("bad_signature", 401, f"Web Bot Auth: Signature-Agent names {agent} "
                           f"but the key is in {identity}'s directory")
        nonce = params.get("nonce")
        seen = (keyid + "\n" + nonce).encode() if nonce else _signature_bytes(request)
        now = time.time() if now is None else now
        claimed = self._seen.claim(seen, now)
        if claimed == "seen":
            raise Rejected("replayed_signature", 401, "Web Bot Auth: this signature (or its "
                           f"nonce) was already used within {self.max_age:g} s")
        if claimed == "full":
            raise Rejected("replay_cache_full", 503, "Web Bot Auth: too many recent "
                           "signatures to check this one for replay")
        return Verified(identity, keyid)


def _unknown(keyid: str) -> Rejected:
    return Rejected("unknown_key", 401, f"Web Bot Auth: no trusted key directory holds "
                    f"key {keyid[:64]!r}")


def _tagged(request: Request) -> bool:
    """Whether a ``Signature-Input`` member is tagged ``web-bot-auth``. Raises
    ValueError when the header is missing or not a structured dictionary."""
    lines = [v for k, v in request.headers if k == b"signature-input"]
    if not lines:
        raise ValueError('Expected "Signature-Input" header field to be present')
    parse: Any = http_sf.parse
    members = parse(b", ".join(lines), tltype="dictionary")
    return any(isinstance(params, dict) and params.get("tag") == TAG
               for _, params in members.values())


def _signature_agent(value: bytes | None) -> str | None:
    """The URL a ``Signature-Agent`` header names: a structured string (or token),
    or a dictionary's first member. Raises ValueError when it is neither."""
    if value is None:
        return None
    text = value.decode("latin-1")
    parse: Any = http_sf.parse
    try:
        parsed = parse(value, tltype="item")[0]
    except ValueError:
        members = parse(value, tltype="dictionary")
        parsed = next(iter(members.values()))[0] if members else None
    if not isinstance(parsed, str) or not parsed.startswith(("http://", "https://")):
        raise ValueError(f"Signature-Agent must name an http(s) URL, got {text[:100]!r}")
    return str(parsed)


def _signature_bytes(request: Request) -> bytes:
    return b"\n".join(v for k, v in request.headers if k == b"signature")


class _Resolver(HTTPSignatureKeyResolver):
    def __init__(self, directory: KeyDirectory) -> None:
        self.directory = directory
        self.missing: str | None = None

    def resolve_public_key(self, key_id: str) -> Ed25519PublicKey | None:
        entry = self.directory.keys.get(key_id)
        if entry is None:
            self.missing = key_id
            return None
        return entry[0]


class _Headers:
    """The request's header lines as the library reads them (str, in order)."""

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self._lines = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]

    def items(self) -> list[tuple[str, str]]:
        return self._lines


class _Message:
    def __init__(self, request: Request, scheme: str) -> None:
        self.method = request.method.decode("latin-1")
        query = b"?" + request.query if request.query else b""
        self.url = f"{scheme}://{(request.host + request.path + query).decode('latin-1')}"
        self.headers = _Headers(request.headers)


# -- signing (the agent's side) -------------------------------------------------------------
class _Outgoing:
    def __init__(self, method: str, url: str, headers: dict[str, str]) -> None:
        self.method, self.url, self.headers = method, url, headers


def sign(key: Ed25519PrivateKey, method: str, url: str, *, signature_agent: str | None = None,
         created: float | None = None, expires_in: float = 60.0, nonce: str | None = None,
         label: str = "sig1") -> dict[str, str]:
    """The headers that sign a request to `url` with `key` for Web Bot Auth:
    ``Signature-Input``, ``Signature`` and, when `signature_agent` (the agent's
    origin) is given, ``Signature-Agent``. `nonce` defaults to 32 random bytes."""
    keyid = thumbprint(public_jwk(key))
    headers = {"Signature-Agent": http_sf.ser(signature_agent)} if signature_agent else {}
    created = time.time() if created is None else created
    signer = HTTPMessageSigner(signature_algorithm=algorithms.ED25519,
                               key_resolver=MappingKeyResolver(public_keys={},
                                                               private_keys={keyid: key}))
    covered = ("@authority", "signature-agent") if signature_agent else ("@authority",)
    message = _Outgoing(method, url, headers)
    signer.sign(message, key_id=keyid, label=label, tag=TAG, covered_component_ids=covered,
                created=_when(created), expires=_when(created + expires_in),
                nonce=nonce or _b64(os.urandom(32)))
    return headers


def _when(t: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(t, datetime.UTC)


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: object) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), b"-_", validate=True)
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> None:
    """``--keygen KEY.pem``: write a new Ed25519 key and print its JWKS (serve it as
    your key directory). ``KEY.pem URL [--agent ORIGIN]``: print curl ``-H`` flags
    that sign a GET of URL."""
    p = argparse.ArgumentParser(prog="python -m runtime.security.bots.webbotauth",
                                description=main.__doc__)
    p.add_argument("key")
    p.add_argument("url", nargs="?")
    p.add_argument("--keygen", action="store_true")
    p.add_argument("--agent")
    args = p.parse_args(argv)
    if args.keygen:
        key = Ed25519PrivateKey.generate()
        # the private key: readable by its owner only (it was 0644), never overwritten
        try:
            fd = os.open(args.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            p.error(f"{args.key} exists: --keygen writes a new key file, it never replaces one")
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        print(json.dumps({"keys": [public_jwk(key)]}))
        return
    loaded = serialization.load_pem_private_key(Path(args.key).read_bytes(), None)
    if not isinstance(loaded, Ed25519PrivateKey) or not args.url:
        p.error("needs an Ed25519 PEM key and a URL")
    for name, value in sign(loaded, "GET", args.url, signature_agent=args.agent).items():
        print(f"-H '{name}: {value}'", end=" ")
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
