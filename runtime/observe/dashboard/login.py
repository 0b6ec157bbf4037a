"""`Logins`: one-time login tokens (`TOKEN_TTL` seconds, single use) that the
dashboard page exchanges for a session (`SESSION_TTL`), kept in memory; a PoP
restart logs everyone out."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable

from edgefn_core.errors import Rejected

TOKEN_TTL = 60.0
SESSION_TTL = 12 * 3600.0
MAX_PENDING = 1024  # login tokens not yet used; the oldest go first


class Logins:
    def __init__(self, clock: Callable[[], float] = time.time,
                 token_ttl: float = TOKEN_TTL, session_ttl: float = SESSION_TTL) -> None:
        self.clock = clock
        self.token_ttl, self.session_ttl = token_ttl, session_ttl
        self.tokens: dict[str, float] = {}  # token -> expiry
        self.sessions: dict[str, float] = {}  # session id -> expiry

    def issue(self) -> str:
        """A new one-time login token."""
        self._expire()
        while len(self.tokens) >= MAX_PENDING:
            del self.tokens[next(iter(self.tokens))]
        token = secrets.token_urlsafe(24)
        self.tokens[token] = self.clock() + self.token_ttl
        return token

    def redeem(self, token: str) -> str:
        """A session id for `token`, which is used up. Raises `Rejected` (401) for
        an unknown, already used or expired token."""
        expiry = self.tokens.pop(token, None)
        if expiry is None:
            raise Rejected("unauthorized", 401, "dashboard login token unknown or already used; "
                               "run `edgefn dashboard` for a new one")
        if self.clock() >= expiry:
            raise Rejected("unauthorized", 401, "dashboard login token expired (they last "
                               f"{self.token_ttl:g} s); run `edgefn dashboard` again")
        session = secrets.token_urlsafe(24)
        self.sessions[session] = self.clock() + self.session_ttl
        return session

    def valid(self, session: str | None) -> bool:
        """Whether `session` is a live session id."""
        if not session:
            return False
        for known, expiry in list(self.sessions.items()):
            if hmac.compare_digest(known, session):
                if self.clock() < expiry:
                    return True
                del self.sessions[known]
        return False

    def _expire(self) -> None:
        now = self.clock()
        self.tokens = {t: e for t, e in self.tokens.items() if e > now}
        self.sessions = {s: e for s, e in self.sessions.items() if e > now}
