"""The proof-of-work challenge of the ``challenge`` action.

A refused client gets a 429 with

    x-edgefn-challenge: <nonce>; difficulty=<bits>

and passes by retrying with

    x-edgefn-pow: <nonce>:<solution>

where ``sha256("<nonce>:<solution>")`` starts with `difficulty` zero bits. The
nonce is stateless: its expiry, its difficulty and an HMAC of both under the
PoP's secret, so any nonce this PoP issued can be checked without storing it; a
solved nonce is remembered until it expires, so it passes once.

`solve` is the client's side (``python -m runtime.security.bots.pow '<challenge>'``
prints the header to send).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
import struct
import sys

from runtime.security.bots.seen import SeenSet, SharedSeen

CHALLENGE_HEADER = b"x-edgefn-challenge"
SOLUTION_HEADER = b"x-edgefn-pow"
_MAC_BYTES = 16
_NONCE_BYTES = 8 + 1 + 8 + _MAC_BYTES  # expiry, difficulty, random, mac
INSTRUCTIONS = (
    "find a string S such that sha256('<nonce>:' + S) starts with <difficulty> zero bits "
    "(<nonce> and <difficulty> from the x-edgefn-challenge header), then retry the request "
    "with the header 'x-edgefn-pow: <nonce>:S'; a nonce is valid once, until it expires. "
    "`python -m runtime.security.bots.pow '<x-edgefn-challenge value>'` prints the header.")


class Challenger:
    """Issues and checks challenges of `difficulty` bits, valid for `ttl` seconds."""

    TTL = 120.0  # seconds a challenge is valid

    def __init__(self, difficulty: int, ttl: float = TTL, secret: bytes | None = None,
                 capacity: int = 100_000, used: SeenSet | SharedSeen | None = None) -> None:
        """`secret`: what signs nonces (random by default: one process's own);
        `used`: where solved nonces are remembered (the PoP's `SharedSeen` when
        several processes check solutions)."""
        self.difficulty = difficulty
        self.ttl = ttl
        self._secret = secret or os.urandom(32)
        self._used = used if used is not None else SeenSet(ttl, capacity)

    def issue(self, now: float) -> str:
        """A fresh challenge header value: ``<nonce>; difficulty=<bits>``."""
        head = struct.pack(">dB", now + self.ttl, self.difficulty) + os.urandom(8)
        mac = hmac.digest(self._secret, head, "sha256")[:_MAC_BYTES]
        nonce = base64.urlsafe_b64encode(head + mac).rstrip(b"=").decode()
        return f"{nonce}; difficulty={self.difficulty}"

    def check(self, value: bytes, now: float) -> str | None:
        """Why the ``x-edgefn-pow`` header `value` does not pass (``malformed``,
        ``forged``, ``expired``, ``wrong``, ``reused``; ``busy`` when too many solved
        nonces are still alive to remember one more), or None when it passes (its
        nonce is then used up)."""
        nonce, sep, solution = value.partition(b":")
        raw = _unb64(nonce)
        if not sep or raw is None or len(raw) != _NONCE_BYTES or len(solution) > 128:
            return "malformed"
        head, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, hmac.digest(self._secret, head, "sha256")[:_MAC_BYTES]):
            return "forged"
        expiry, difficulty = struct.unpack(">dB", head[:9])
        if expiry < now:
            return "expired"
        if not solves(value, difficulty):
            return "wrong"
        claimed = self._used.claim(raw, now)  # the bytes: one nonce has one spelling
        return {None: None, "seen": "reused", "full": "busy"}[claimed]


def solves(candidate: bytes, difficulty: int) -> bool:
    """Whether sha256(`candidate`) starts with `difficulty` zero bits."""
    digest = hashlib.sha256(candidate).digest()
    return int.from_bytes(digest) >> (256 - difficulty) == 0


def solve(challenge: str) -> str:
    """The ``x-edgefn-pow`` header value answering the ``x-edgefn-challenge`` value
    `challenge`. Raises ValueError when it is not ``<nonce>; difficulty=<bits>``."""
    nonce, _, param = challenge.partition(";")
    name, _, bits = param.strip().partition("=")
    if name != "difficulty" or not bits.isdigit() or not nonce.strip():
        raise ValueError(f"not an x-edgefn-challenge value: {challenge!r}")
    prefix, difficulty = nonce.strip().encode() + b":", int(bits)
    for n in itertools.count():
        candidate = prefix + str(n).encode()
        if solves(candidate, difficulty):
            return candidate.decode()
    raise AssertionError("unreachable")


def _unb64(text: bytes) -> bytes | None:
    try:
        return base64.b64decode(text + b"=" * (-len(text) % 4), b"-_", validate=True)
    except ValueError:
        return None


if __name__ == "__main__":
    print(f"{SOLUTION_HEADER.decode()}: {solve(sys.argv[1])}")
