"""`auth`: who is calling. Sets ``ctx.principal`` from an API key
(``Authorization: Bearer efn_...`` or ``x-api-key``) or a JWT bearer token, and
refuses what the target's mode and the principal's scopes do not allow:

    mode (function: its ``auth``, else ``[auth] functions``; OpenAI API: ``[auth] openai``)
      none  anyone; a valid credential still sets the principal, an invalid one is ignored
      key   an active API key: 401 without one, 403 when no scope grants the target
      jwt   a JWT bearer token that verifies: 401 otherwise, 403 as for keys
      auto  (OpenAI API only) ``key`` once any key exists, else ``none``

A function is granted by ``*``, ``fn:<name glob>`` or ``route:<path glob>``; the
OpenAI API by ``*`` or any ``model:`` scope (the API checks the model itself).
Requests nothing serves pass on to `route` (its 404).

Between the PoPs of a topology, a model call a lower tier forwards for its caller
carries no credential of this PoP: the signed ``x-edgefn-tenant`` it carries
(`runtime.security.residency`, with the topology's ``[residency] secret``) admits
it to the OpenAI API here in place of a key, with no principal (the `residency`
stage names its tenant). Only a call with no credential is read that way. Its
caller's fair share of the model worker (``x-edgefn-client``) is honoured
(``ctx.forwarded_client``, with a credential or without) only when the topology
signed it for this request id; one it did not sign is ignored: the call counts in
its own caller's share, and no client picks another's.
"""

from __future__ import annotations

import fnmatch
import time
from urllib.parse import unquote

from edgefn_core.errors import Rejected
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result, Target
from runtime.pipeline.stages.refusals import Counter, refuse
from runtime.pipeline.targets import Targets
from runtime.security.jwt_auth import JwtVerifier, TokenInvalid
from runtime.security.keys import KeyRing, is_well_formed
from runtime.security.principal import Principal
from runtime.security.residency import CLIENT_HEADER, TENANT_HEADER, verify, verify_client
from runtime.security.settings import AuthSettings

CHALLENGE = [(b"www-authenticate", b'Bearer realm="edgefn"')]
MAX_CREDENTIAL = 8192
MAX_GRANTS = 4096  # (principal, target) scope decisions kept
# a request with no credential (`anonymous_refusal`): what `_authenticate` reads of one
_ANONYMOUS = Request(b"GET", b"/", b"", [], b"", "1.1", True, "")


class Auth:
    name = "auth"

    def __init__(self, settings: AuthSettings, keys: KeyRing, targets: Targets,
                 jwt: JwtVerifier | None = None, secret: str = "") -> None:
        """`secret`: the topology's ``[residency] secret`` ("" where there is none)."""
        self.settings = settings
        self.secret = secret
        self.keys = keys
        self.targets = targets
        self.jwt = jwt
        self.grants: dict[tuple[Principal, str, str], bool] = {}  # scope checks, cached
        # a refusal counted by the ratelimit stage after this one (`refusals`)
        self.on_refused: Counter | None = None

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        target = self.targets.resolve(request, ctx)
        if target is None:
            return call_next(request, ctx)
        if self.secret and target.kind == "openai":
            ctx.forwarded_client = self._client(request, ctx)
        mode = self._mode(target)
        if mode == "none":  # a warm-up too: it carries no credential, so it proves nobody
            if request.headers:
                ctx.principal = self._optional(request)
            return call_next(request, ctx)
        if ctx.quiet:  # a warm-up carries no credential; only the PoP can make one
            return call_next(request, ctx)
        try:
            forwarded = self._forwarded(request, ctx, target)
            if forwarded is not None:
                ctx.decide("auth", {"mode": mode, "result": "forwarded", "tenant": forwarded})
                return call_next(request, ctx)
            principal = self._authenticate(mode, request, target)
        except Rejected as e:
            ctx.decide("auth", {"mode": mode, "result": e.code})
            return refuse(self.on_refused, request, ctx, e)
        ctx.principal = principal
        ctx.decide("auth", {"mode": mode, "result": "ok", "key_id": principal.key_id,
                            "tenant": principal.tenant})
        return call_next(request, ctx)

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        nothing serves them, or its mode is ``none`` where no credential can prove
        anyone (no key was ever made, no ``[auth.jwt]``), so the principal stays
        None and nothing is recorded, and it is no model call that may carry a
        lower tier's signed fair share (``x-edgefn-client``). It changes with the
        key file (`plan_stamp`)."""
        return self.untouched_anonymous(target) and (
            target is None or (self.jwt is None and len(self.keys) == 0))

    def plan_stamp(self) -> int:
        """Changes when the keys are read again (`idle_for` depends on them)."""
        return self.keys.generation()

    def untouched_anonymous(self, target: Target | None) -> bool:
        """Whether a request for `target` that carries no credential (no
        ``Authorization``, no ``x-api-key``) goes on untouched, whatever keys exist:
        its mode is ``none`` (`_optional` finds no principal, nothing is recorded)
        and it is no model call (whose forwarded client this stage reads)."""
        if target is None:
            return True
        if self.secret and target.kind == "openai":
            return False  # it reads the forwarded client (`_client`)
        return self._mode(target) == "none"

    def anonymous_refusal(self, target: Target) -> tuple[str, Rejected] | None:
        """What a request for function `target` that carries no credential (no
        ``Authorization``, no ``x-api-key``) gets here where its mode asks for one
        (``key``, ``jwt``): the mode and the 401 `_authenticate` raises (recorded as
        ``{"mode", "result"}``; a ``ratelimit`` after this stage may count it first:
        `on_refused`); None where it goes on (mode ``none``, or not a function)."""
        if target.kind != "function":
            return None
        mode = self._mode(target)
        if mode == "none":
            return None
        try:
            self._authenticate(mode, _ANONYMOUS, target)
        except Rejected as e:
            return mode, e
        raise RuntimeError("auth admitted a request without a credential")

    def identifies(self, target: Target | None) -> bool:
        """Whether a request for `target` may come out of this stage with a principal
        (what a later stage's limits may depend on)."""
        return not self.idle_for(target)

    def _authenticate(self, mode: str, request: Request, target: Target) -> Principal:
        """Raises `Rejected`: 401 without a valid credential, 403 outside its scopes."""
        credential = _credential(request, mode == "jwt")
        if credential is None:
            if mode == "jwt":
                raise Rejected("unauthorized", 401, f"{_what(target)} needs a JWT: send "
                               "`Authorization: Bearer <token>`", CHALLENGE)
            raise Rejected("unauthorized", 401, f"{_what(target)} needs an API key: send "
                           "`Authorization: Bearer <key>` or `x-api-key: <key>`", CHALLENGE)
        principal = self._verify(mode, *credential)
        grant = (principal, target.kind, target.name)
        granted = self.grants.get(grant)
        if granted is None:
            if len(self.grants) >= MAX_GRANTS:
                self.grants.clear()
            granted = _grants(principal, target, request)
            if not any(s.startswith("route:") for s in principal.scopes):
                self.grants[grant] = granted  # a route scope depends on the path
        if not granted:
            raise Rejected("forbidden", 403, f"this credential's scopes do not include "
                           f"{_what(target)} (tenant {principal.tenant!r})")
        return principal

    def _forwarded(self, request: Request, ctx: Context, target: Target) -> str | None:
        """The tenant a lower tier of the topology forwarded this model call for, or
        None (not an OpenAI API call, a credential sent, no tenant header, no secret
        here, or a tenant header the topology did not sign)."""
        if target.kind != "openai" or not self.secret:
            return None
        value = request.header(TENANT_HEADER)
        try:
            if value is None or _credential(request) is not None:
                return None
        except Rejected:  # a credential was sent (twice): it is the one that counts
            return None
        try:
            return verify(self.secret, value.decode("latin-1"), ctx.request_id.decode())
        except Rejected:  # not signed here: a client's header; it gets the 401 and challenge
            return None

    def _client(self, request: Request, ctx: Context) -> str | None:
        """The fair share a lower tier of the topology signed for this model call
        (``x-edgefn-client``), or None: none sent, or one this topology did not
        sign for this request id (a client's own header, which picks no share)."""
        value = request.header(CLIENT_HEADER)
        if value is None:
            return None
        try:
            return verify_client(self.secret, value.decode("latin-1"), ctx.request_id.decode())
        except Rejected:
            return None

    def _mode(self, target: Target) -> str:
        if target.kind == "openai":
            mode = target.policy.auth or self.settings.openai
            if mode == "auto":
                return "key" if len(self.keys) else "none"
            return mode
        return target.policy.auth or self.settings.functions

    def _verify(self, mode: str, kind: str, value: str) -> Principal:
        """Raises `Rejected` (401) for a credential that does not prove anyone."""
        if mode == "jwt":
            if kind != "bearer" or self.jwt is None:
                raise Rejected("unauthorized", 401, "expected a JWT in `Authorization: Bearer`"
                               + ("" if self.jwt else " (this PoP has no [auth.jwt])"),
                               CHALLENGE)
            try:
                return self.jwt.verify(value)
            except TokenInvalid as e:
                raise Rejected("unauthorized", 401, str(e), CHALLENGE) from None
        if not is_well_formed(value):
            raise Rejected("unauthorized", 401, "malformed API key: expected `efn_<id>_<secret>`"
                           " as `edgefn keys create` prints it", CHALLENGE)
        record = self.keys.lookup(value)
        if record is None:
            raise Rejected("unauthorized", 401, "unknown API key", CHALLENGE)
        state = record.state(time.time())
        if state != "active":
            raise Rejected("unauthorized", 401, f"API key {record.id} is {state}", CHALLENGE)
        return self.keys.principal(record)

    def _optional(self, request: Request) -> Principal | None:
        """The principal a credential proves, if it proves one: where auth is off,
        the header may well be the function's own (Basic auth, a foreign token)."""
        try:
            credential = _credential(request)
            if credential is None:
                return None
            kind, value = credential
            mode = "jwt" if self.jwt is not None and not value.startswith("efn_") else "key"
            return self._verify(mode, kind, value)
        except Rejected:
            return None


def _credential(request: Request, jwt: bool = False) -> tuple[str, str] | None:
    """``("bearer" | "x-api-key", value)`` from the headers, or None, whatever their
    order (the first header of the two decided: a Basic before a valid key was a
    401, after it a 200). An ``x-api-key`` is read unless an `Authorization: Bearer`
    carries an edgefn key (``efn_...``), or a JWT is asked for (`jwt`); a Bearer of
    another token (a function's own) or an Authorization of another scheme (Basic)
    leaves it to be read. Raises `Rejected` (401) for an Authorization header that is
    not a Bearer token when no ``x-api-key`` is sent, and for two Bearer tokens or
    two ``x-api-key`` headers (the first was verified, and a function reading the
    other would have trusted a token no one checked); a Basic beside a Bearer is the
    function's own."""
    bearer = key = None
    other = False
    for name, value in request.headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer" or not token.strip():
                other = True
                continue
            if bearer is not None:
                raise Rejected("unauthorized", 401, "more than one `Authorization: Bearer` "
                               "header: send one credential", CHALLENGE)
            bearer = token.strip()
        elif name == b"x-api-key":
            if key is not None:
                raise Rejected("unauthorized", 401, "more than one `x-api-key` header: "
                               "send one credential", CHALLENGE)
            key = value.strip()
    if bearer is not None and (key is None or jwt or bearer.startswith(b"efn_")):
        return "bearer", _text(bearer)
    if key is not None:
        return "x-api-key", _text(key)
    if other:
        raise Rejected("unauthorized", 401, "expected `Authorization: Bearer <key>`",
                       CHALLENGE)
    return None


def _text(raw: bytes) -> str:
    if len(raw) > MAX_CREDENTIAL:
        raise Rejected("unauthorized", 401, f"credential longer than {MAX_CREDENTIAL} bytes",
                       CHALLENGE)
    return raw.decode("latin-1")


def _grants(principal: Principal, target: Target, request: Request) -> bool:
    if target.kind == "openai":
        return any(s == "*" or s.startswith("model:") for s in principal.scopes)
    if principal.allows("fn", target.name):
        return True
    path = scoped_path(request.path)
    return path is not None and any(s.startswith("route:")
                                    and fnmatch.fnmatchcase(path, unquote(s[6:]))
                                    for s in principal.scopes)


def scoped_path(raw: bytes) -> str | None:
    """The path a ``route:`` scope (itself percent-decoded) is matched against:
    percent-decoded as UTF-8; None (no
    route scope grants it) when a segment is ``.`` or ``..`` once decoded, which a
    function that normalises its path would read as another route (``/k/a/../b``,
    ``/k/a/%2e%2e/b`` and ``/k/a/..%2fb`` passed ``route:/k/a/*`` and served /k/b).
    None too for an encoded slash or backslash: the router splits the path as sent
    (``/pub%2fx`` passed ``route:/pub/*`` decoded and was routed to ``/``)."""
    lowered = raw.lower()
    if b"%2f" in lowered or b"%5c" in lowered:
        return None
    # UTF-8, as clients percent-encode it (latin-1 read /caf%C3%A9 as "cafÃ©": a
    # `route:/café/*` scope, or its percent-encoded form, never matched)
    path = unquote(raw.decode("latin-1"), encoding="utf-8", errors="replace")
    if any(seg in (".", "..") for seg in path.replace("\\", "/").split("/")):
        return None
    return path


def _what(target: Target) -> str:
    return "the OpenAI API" if target.kind == "openai" else f"function {target.name!r}"
