"""Dashboard login tokens: single use, expire after 60 s; sessions expire too."""

from __future__ import annotations

import pytest

from edgefn_core.errors import Rejected
from runtime.observe.dashboard.login import MAX_PENDING, Logins


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_gives_one_session_once() -> None:
    logins = Logins(Clock())
    token = logins.issue()
    sid = logins.redeem(token)
    assert logins.valid(sid) and not logins.valid(token)
    with pytest.raises(Rejected, match="unknown or already used") as e:
        logins.redeem(token)
    assert e.value.status == 401


def test_a_token_expires_after_60_seconds() -> None:
    clock = Clock()
    logins = Logins(clock)
    early, late = logins.issue(), logins.issue()
    clock.now += 59.9
    assert logins.valid(logins.redeem(early))
    clock.now += 0.1
    with pytest.raises(Rejected, match="expired"):
        logins.redeem(late)


@pytest.mark.parametrize("token", ["", "nope", "x" * 5000])
def test_unknown_tokens_are_refused(token: str) -> None:
    logins = Logins(Clock())
    logins.issue()
    with pytest.raises(Rejected, match="unknown"):
        logins.redeem(token)


def test_sessions_expire_and_bad_ids_are_invalid() -> None:
    clock = Clock()
    logins = Logins(clock, session_ttl=100)
    sid = logins.redeem(logins.issue())
    assert not logins.valid(None) and not logins.valid("") and not logins.valid(sid + "x")
    clock.now += 99.9
    assert logins.valid(sid)
    clock.now += 0.1
    assert not logins.valid(sid)


def test_pending_tokens_are_bounded() -> None:
    logins = Logins(Clock())
    first = logins.issue()
    for _ in range(MAX_PENDING):
        logins.issue()
    assert len(logins.tokens) == MAX_PENDING
    with pytest.raises(Rejected):
        logins.redeem(first)


def test_refusals_say_what_to_do_and_tokens_carry_192_bits() -> None:
    """Both refusals are 401 `unauthorized` naming the command that makes a new token;
    a token expired when another is issued is gone (unknown), not merely expired; tokens
    and session ids are 32 URL-safe characters (24 random bytes)."""
    clock = Clock()
    logins = Logins(clock)
    first, late = logins.issue(), logins.issue()
    assert len(first) == 32
    assert len(logins.redeem(first)) == 32
    clock.now += 60
    with pytest.raises(Rejected) as expired:
        logins.redeem(late)
    assert (expired.value.code, expired.value.status) == ("unauthorized", 401)
    assert str(expired.value) == ("dashboard login token expired (they last 60 s); run "
                                  "`edgefn dashboard` again")
    gone = logins.issue()
    clock.now += 60
    logins.issue()  # drops what expired by now
    with pytest.raises(Rejected) as unknown:
        logins.redeem(gone)
    assert (unknown.value.code, unknown.value.status) == ("unauthorized", 401)
    assert str(unknown.value) == ("dashboard login token unknown or already used; run "
                                  "`edgefn dashboard` for a new one")
