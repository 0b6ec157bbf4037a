"""The proof-of-work challenge: solved passes once, anything else does not."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from runtime.security.bots import pow
from runtime.security.bots.pow import Challenger

NOW = 1_800_000_000.0


def nonce_of(challenge: str) -> str:
    return challenge.split(";")[0]


def test_a_solution_passes_once() -> None:
    c = Challenger(difficulty=8)
    challenge = c.issue(NOW)
    assert challenge.endswith("; difficulty=8")
    answer = pow.solve(challenge)
    assert answer.startswith(nonce_of(challenge) + ":")
    digest = hashlib.sha256(answer.encode()).digest()
    assert digest[0] == 0  # 8 leading zero bits
    assert c.check(answer.encode(), NOW + 1) is None
    assert c.check(answer.encode(), NOW + 2) == "reused"


def test_a_wrong_solution_fails() -> None:
    c = Challenger(difficulty=12)
    nonce = nonce_of(c.issue(NOW))
    wrong = next(f"{nonce}:{n}" for n in range(10_000)
                 if not pow.solves(f"{nonce}:{n}".encode(), 12))
    assert c.check(wrong.encode(), NOW) == "wrong"


def test_the_difficulty_is_the_issuers_not_the_clients() -> None:
    # the difficulty is inside the signed nonce: lowering it forges the nonce
    c = Challenger(difficulty=16)
    raw = bytearray(pow._unb64(nonce_of(c.issue(NOW)).encode()) or b"")
    raw[8] = 1  # the difficulty byte, after the 8-byte expiry
    lowered = pow.base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    assert c.check(pow.solve(f"{lowered}; difficulty=1").encode(), NOW) == "forged"


def test_an_expired_or_foreign_or_garbled_nonce_fails() -> None:
    c = Challenger(difficulty=4, ttl=10)
    answer = pow.solve(c.issue(NOW))
    assert c.check(answer.encode(), NOW + 11) == "expired"
    other = Challenger(difficulty=4)  # another secret: another PoP, or a forger
    assert other.check(pow.solve(c.issue(NOW)).encode(), NOW) == "forged"
    nonce, _, solution = pow.solve(c.issue(NOW)).partition(":")
    flipped = ("A" if nonce[5] != "A" else "B").join((nonce[:5], nonce[6:]))
    assert c.check(f"{flipped}:{solution}".encode(), NOW) == "forged"


@pytest.mark.parametrize("value", [b"", b"no-colon", b":", b"@@@@:1", b"AAAA:1",
                                   b"\xff\xfe:1", b"x" * 10_000 + b":1"])
def test_malformed_solutions_fail(value: bytes) -> None:
    assert Challenger(difficulty=4).check(value, NOW) == "malformed"


def test_a_nonce_has_one_spelling() -> None:
    # base64 that decodes to the same bytes with junk in it is not a second nonce
    c = Challenger(difficulty=4)
    answer = pow.solve(c.issue(NOW))
    assert c.check(answer.encode(), NOW) is None
    nonce, _, _ = answer.partition(":")
    respelled = pow.solve(f"{nonce}==; difficulty=4")
    assert c.check(respelled.encode(), NOW) == "malformed"


def test_solve_refuses_what_is_not_a_challenge() -> None:
    for bad in ("", "abc", "abc; level=3", "abc; difficulty=x", "; difficulty=3"):
        with pytest.raises(ValueError, match="not an x-edgefn-challenge"):
            pow.solve(bad)


def test_the_helper_prints_the_header_to_send() -> None:
    c = Challenger(difficulty=6)
    challenge = c.issue(NOW)
    out = subprocess.run([sys.executable, "-m", "runtime.security.bots.pow", challenge],
                         capture_output=True, text=True, check=True).stdout.strip()
    name, _, value = out.partition(": ")
    assert name == "x-edgefn-pow" and c.check(value.encode(), NOW) is None


def test_used_nonces_are_bounded() -> None:
    c = Challenger(difficulty=1, capacity=2)
    answers = [pow.solve(c.issue(NOW)).encode() for _ in range(3)]
    assert [c.check(a, NOW) for a in answers] == [None, None, "busy"]
    assert c.check(answers[0], NOW) == "reused"
    # once the first two expire there is room again
    assert c.check(pow.solve(c.issue(NOW + 200)).encode(), NOW + 200) is None


def test_solves_counts_leading_zero_bits_exactly() -> None:
    # a digest starting 0x01: exactly 7 zero bits; 0x00 0x80: exactly 8
    seven = next(c for n in range(100_000) if hashlib.sha256(c := b"n:%d" % n).digest()[0] == 1)
    eight = next(c for n in range(1_000_000)
                 if hashlib.sha256(c := b"n:%d" % n).digest()[:2] >= b"\x00\x80"
                 and hashlib.sha256(c).digest()[0] == 0)
    assert pow.solves(seven, 7) and not pow.solves(seven, 8)
    assert pow.solves(eight, 8) and not pow.solves(eight, 9)
