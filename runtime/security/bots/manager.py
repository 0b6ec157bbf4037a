"""`BotManager`: a request's bot class (`judge`) and what its class may do
(`policy`, `enforce`).

Signals, in order: a Web Bot Auth signature when the request carries a
``Signature-Input`` (verified: ``verified_agent``; forged, expired, malformed or
replayed: ``abusive``, signal ``bad_signature`` / ``replayed_signature``, and the
policy for ``abusive`` decides; a key no trusted directory holds, or signatures
of another protocol (no ``web-bot-auth`` tag), only add ``unknown_key`` /
``not_web_bot_auth`` to what the headers say), else the User-Agent and header
consistency (`runtime.security.bots.classify`); then, when ``abusive_rate`` is
set, the client's request rate, counted per identity (the verified agent's, else
the client address): past it the class becomes ``abusive`` (signal ``rate``).

Actions: ``allow``; ``limit`` (the class's budget, counted per identity, so an
agent spread over many addresses is limited as one: 429 ``rate_limited`` with
Retry-After); ``challenge`` (429 ``challenge`` with a proof-of-work header unless
the request carries a valid solution, see `runtime.security.bots.pow`);
``block`` (403 ``bot_blocked``).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import limits

from edgefn_core.errors import InvalidConfig, Rejected
from edgefn_core.secret_file import secret_file
from runtime.net.message import Request
from runtime.security.bots import agents as agent_list
from runtime.security.bots.classify import Classifier
from runtime.security.bots.pow import CHALLENGE_HEADER, INSTRUCTIONS, SOLUTION_HEADER, Challenger
from runtime.security.bots.seen import SharedSeen
from runtime.security.bots.webbotauth import Verifier, load_directories
from runtime.security.ratelimit.addresses import Aggregator
from runtime.security.ratelimit.native import counters as new_counters
from runtime.security.settings import (
    BotAction,
    BotClass,
    BotOverride,
    BotPolicy,
    BotSettings,
    merge,
)

_CONFIG = "pop.toml [bots]"
_ABUSIVE = frozenset({"bad_signature", "replayed_signature"})


# (class, the verified agent's identity, signals, why a signature was refused): a plain
# tuple, as it is made on every request
type Verdict = tuple[BotClass, str | None, tuple[str, ...], str | None]


class BotManager:
    def __init__(self, settings: BotSettings, classifier: Classifier,
                 verifier: Verifier | None = None, *, secret: bytes | None = None,
                 used: SharedSeen | None = None,
                 clock: Callable[[], float] = time.time, counters: Any = None) -> None:
        """`verifier` None: no key directory is trusted (every signature is an
        unknown key). `secret` signs challenge nonces (default: random per process);
        `used` remembers solved ones (default: in this process). `counters`: where
        `abusive_rate` and the class budgets are counted (`native.counters`; default:
        this process's). Raises `InvalidConfig` when a rate in `settings` cannot be
        parsed."""
        self.settings = settings
        self.classifier = classifier
        self.verifier = verifier
        self.challenger = Challenger(settings.pow_difficulty, secret=secret, used=used)
        self.clock = clock
        # `limits`' algorithms on the ratelimit stage's counters (its MemoryStorage cost
        # 7-10 us a rule); with ``workers = N`` in the table they share
        self.counters = counters if counters is not None else new_counters()
        # (amount, window) of each rate of `abusive_rate`
        self._abusive_rate = [(r.amount, int(r.get_expiry())) for r in
                              (_rates(settings.abusive_rate, "bots.abusive_rate")
                               if settings.abusive_rate else [])]
        budgets = {**BotSettings().budgets, **settings.budgets}
        self._budgets = {c: _rates(r, f"bots.budgets.{c}") for c, r in budgets.items()}
        # a class budget is a moving window (exact) in one process; where the workers
        # share a table (``workers = N``), a sliding window in it, counted PoP-wide: a
        # moving window's hits would stay in each worker, N of them allowing N budgets
        self._budget_algorithm = "moving_window" if self.counters.table is None \
            else "sliding_window"
        self._policies: dict[BotOverride, BotPolicy] = {}
        # an IPv6 client has a /64 to itself: counted per address, it stepped round a
        # class budget or abusive_rate by changing its last 64 bits
        self._network = Aggregator(32, 64)

    @classmethod
    def from_settings(cls, settings: BotSettings, data_dir: Path | None = None,
                      workers: int = 1, table: str | None = None) -> BotManager:
        """Load the agents list and fetch the key directories now. With the PoP's
        `data_dir`, challenges are signed with DATA/bots.secret (made once: every
        worker, and a restarted PoP, takes the solutions of the others' challenges;
        a random secret per process answered "forged" to a solution that reached
        another worker), and with ``workers = N`` solved challenges and seen
        signatures are remembered in DATA/bots/ for all of them (replayed to another
        worker, they passed), and `abusive_rate` and the class budgets count in their
        shared `table` (`native.SharedTable`; the budgets as sliding windows there).
        Raises `InvalidConfig` naming the file or URL that cannot be used, OSError or
        ValueError for a table it cannot map."""
        shared = data_dir / "bots" if data_dir is not None and workers > 1 else None
        verifier = None
        if settings.directories:
            verifier = Verifier(load_directories(settings.directories),
                                settings.signature_max_age,
                                shared=shared / "signatures" if shared else None)
        secret = challenge_secret(data_dir) if data_dir is not None else None
        used = SharedSeen(shared / "pow", Challenger.TTL) if shared is not None else None
        return cls(settings, Classifier(agent_list.load(settings.agents)), verifier,
                   secret=secret, used=used, counters=new_counters(table=table))

    def judge(self, request: Request, client: str, count: bool = True) -> Verdict:
        """`request`'s class, the verified agent's identity, the signals used and
        why a signature was refused; `client` is its ``address:port``. `count`:
        count it toward ``abusive_rate`` (a warm-up is not counted)."""
        headers = dict(request.headers)
        if b"signature-input" in headers:  # RFC 9421 (a bare Signature is Cavage's)
            verdict = self._signed(request, headers)
        else:
            cls, signals = self.classifier.classify(headers)
            verdict = (cls, None, signals, None)
        if count and self._abusive_rate and self._too_fast(verdict[1]
                                                           or self._network(address(client))):
            return ("abusive", verdict[1], (*verdict[2], "rate"), verdict[3])
        return verdict

    def _too_fast(self, identity: str) -> bool:
        """Whether `identity` is past `abusive_rate` (each of its rates hit, as
        `limits`' fixed window hits them)."""
        hit, now = self.counters.hit, time.time()
        return not all([hit(("bots", amount, window, identity), "fixed_window", amount, window,
                            now)[0] for amount, window in self._abusive_rate])

    def policy(self, override: BotOverride | None) -> BotPolicy:
        """The PoP's policy with a target's ``[bots]`` `override` merged over it."""
        if override is None:
            return self.settings.policy
        merged = self._policies.get(override)
        if merged is None:
            merged = self._policies[override] = merge(self.settings.policy, override)
        return merged

    def enforce(self, action: BotAction, verdict: Verdict, client: str,
                request: Request) -> None:
        """Apply `action` to a request judged `verdict` from `client` (``address:port``;
        budgets count a verified agent by its identity, others by address). Raises
        `Rejected`: ``bot_blocked`` (403), ``rate_limited`` or ``challenge`` (429)."""
        cls, agent, signals, reason = verdict
        if action == "block":
            why = f" ({reason})" if reason else ""
            raise Rejected("bot_blocked", 403, f"requests from {cls} clients are "
                           f"blocked here{why}", detail={"class": cls, "signals": list(signals)})
        if action == "limit":
            self._limit(cls, agent or self._network(address(client)))
        elif action == "challenge":
            self._challenge(request)

    def _signed(self, request: Request, headers: dict[bytes, bytes]) -> Verdict:
        if self.verifier is None:
            cls, signals = self.classifier.classify(headers)
            return (cls, None, (*signals, "unknown_key"), "no key directory is trusted")
        try:
            verified = self.verifier.verify(request, self.clock())
        except Rejected as e:
            if e.code in _ABUSIVE:
                return ("abusive", None, (e.code,), str(e))
            cls, signals = self.classifier.classify(headers)
            return (cls, None, (*signals, e.code), str(e))
        return ("verified_agent", verified.identity, ("web_bot_auth",), None)

    def _limit(self, cls: BotClass, identity: str) -> None:
        now = time.time()
        algorithm = self._budget_algorithm
        for rate in self._budgets[cls]:
            window = int(rate.get_expiry())
            admitted, _, reset = self.counters.hit(("budget", rate.amount, window, cls, identity),
                                                   algorithm, rate.amount, window, now)
            if not admitted:
                retry = max(1, math.ceil(reset - now))
                raise Rejected("rate_limited", 429, f"too many requests from {identity} "
                               f"({cls}): its budget is {rate}; retry in {retry} s",
                               headers=[(b"retry-after", str(retry).encode())])

    def _challenge(self, request: Request) -> None:
        now = self.clock()
        solution = request.header(SOLUTION_HEADER)
        why = None
        if solution is not None:
            why = self.challenger.check(solution, now)
            if why is None:
                return
        challenge = self.challenger.issue(now)
        detail: dict[str, object] = {"challenge": challenge,
                                     "difficulty": self.challenger.difficulty,
                                     "instructions": INSTRUCTIONS}
        if why is not None:
            detail["solution"] = why
        raise Rejected("challenge", 429, "prove some work to continue: " + INSTRUCTIONS,
                       headers=[(CHALLENGE_HEADER, challenge.encode())], detail=detail)


def address(client: str) -> str:
    """The address of an ``address:port`` client (as `Context.ip`)."""
    return client.rpartition(":")[0] or client


def _rates(text: str, field: str) -> list[limits.RateLimitItem]:
    try:
        return limits.parse_many(text)
    except ValueError as e:
        raise InvalidConfig(_CONFIG, f"not a rate ({e})", field) from None


def challenge_secret(data_dir: Path) -> bytes:
    """DATA/bots.secret, made once (the parent of ``workers = N`` makes it before
    them). Raises `InvalidConfig` for an empty file (a random secret per process
    made solutions that reached another worker "forged")."""
    secret = secret_file(data_dir / "bots.secret", lambda: secrets.token_hex(32))
    if not secret:
        raise InvalidConfig(str(data_dir / "bots.secret"), "is empty: delete it (a new "
                            "secret is made at the next start)")
    return secret.encode()
