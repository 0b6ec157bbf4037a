"""Continuous-batching policy for the llama.cpp engine: which waiting requests
run, what each decode step feeds, and when a sequence ends.

Pure Python: nothing here calls llama.cpp, starts a thread or sends output, so
each rule has a unit test without a model (the split vLLM makes between
``EngineCore``, the step, and the process around it).

- Admission is FIFO into free sequence slots while a request's prompt plus
  ``max_tokens`` fits in the KV cache next to what is already running; the
  first request that does not fit waits, and everything behind it waits too.
- Every running sequence with flow-control credit gets one new token per step;
  one without credit sits the step out (it keeps its slot and KV budget).
- Prompts are fed in chunks within the step's token budget (llama.cpp's
  ``n_batch``), after the running sequences' tokens, so a long prompt never
  stalls the streams already running.
- Sequences are grouped by LoRA adapter where llama.cpp applies an adapter to a
  whole context (a stock build): each group is its own decode call. The build
  .ci/llama-wheel patches selects the adapter per sequence, so one call runs all.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..stops import StopText

if TYPE_CHECKING:
    from ..protocol import Generate, TokenLogprob
    from . import Sink

STEP_TOKENS = 512  # tokens per decode call (llama.cpp's n_batch)

Item = tuple[int, int, int, bool]  # (token, position, sequence slot, wants logits)


class Shaping(NamedTuple):
    """What a request asks of its sampler beyond temperature and top-k/top-p."""

    grammar: str | None  # GBNF (`constrain.grammar_for`)
    logit_bias: dict[int, float]
    presence_penalty: float
    frequency_penalty: float
    penalty_window: int  # the last tokens penalties look at: all of the output


def shaping_of(req: Generate, grammar: str | None) -> Shaping | None:
    """`req`'s shaping, or None where it asks for none (the plain, cheaper chain)."""
    if grammar is None and not req.logit_bias and not (req.presence_penalty
                                                       or req.frequency_penalty):
        return None
    return Shaping(grammar, req.logit_bias, req.presence_penalty, req.frequency_penalty,
                   req.max_tokens)


class Seq:
    """One generation: its prompt, sampling parameters, KV slot and output state."""

    def __init__(self, req: Generate, sink: Sink, prompt: list[int],
                 adapter: str | None = None, scale: float = 1.0,
                 shaping: Shaping | None = None) -> None:
        self.rid = req.id
        self.sink = sink
        self.prompt = prompt
        self.adapter = adapter
        self.scale = scale
        self.max_tokens = req.max_tokens
        self.temperature, self.top_p, self.top_k = req.temperature, req.top_p, req.top_k
        self.seed = req.seed if req.seed is not None else random.getrandbits(32)
        self.stop = StopText(req.stop)
        self.shaping = shaping
        self.logprobs = req.logprobs  # top alternatives per token; None: no logprobs
        self.pending: list[TokenLogprob] = []  # logprobs of tokens whose text is not sent yet
        self.credit = req.window  # chunks it may send before the client reads them
        self.slot = -1
        self.fed = 0  # prompt tokens decoded so far
        self.pos = 0
        self.last = 0  # the token to decode next
        self.generated = 0
        self.sampler: Any = None  # owned by the driver, which frees it
        self.submitted = self.last_token_at = time.perf_counter()

    @property
    def reserve(self) -> int:
        """KV cache tokens this sequence may fill: its prompt plus ``max_tokens``."""
        return len(self.prompt) + self.max_tokens

    @property
    def prefilled(self) -> bool:
        """Whether the whole prompt has been fed."""
        return self.fed == len(self.prompt)

    def advance(self, token: int, piece: bytes | None) -> tuple[str, str | None]:
        """Take the token just sampled (`piece` is its bytes, None for an end-of-
        generation token). Returns the text that may be sent now and the finish
        reason ("stop", "length"), or None while the sequence goes on."""
        self.generated += 1
        if piece is None:
            return "", "stop"
        text = self.stop.feed(piece)
        if self.stop.stopped:
            return text, "stop"
        if self.generated >= self.max_tokens:
            return text, "length"
        self.last = token
        return text, None


class Step:
    """One decode call: the tokens to feed and which rows' logits are sampled."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.outputs: list[tuple[Seq, int]] = []  # (sequence, row to sample)

    def feed(self, s: Seq, token: int, logits: bool) -> None:
        """Append `token` at `s`'s next position; `logits` marks a row to sample."""
        if logits:
            self.outputs.append((s, len(self.items)))
        self.items.append((token, s.pos, s.slot, logits))
        s.pos += 1


class Scheduler:
    """The waiting queue, the running set, the sequence slots and the KV budget.

    `slots` sequences run at most; together they reserve at most `kv_tokens`
    cache tokens (a lone sequence is admitted whatever its size: the engine
    refuses requests larger than the context before they get here). A sequence
    waits at most `max_wait` seconds for its turn (`overdue`; None: no bound).
    """

    def __init__(self, slots: int, kv_tokens: int, step_tokens: int = STEP_TOKENS,
                 max_wait: float | None = None) -> None:
        self.kv_tokens = kv_tokens
        self.max_wait = max_wait
        self.step_tokens = step_tokens
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}
        self.free_slots = list(range(slots))
        self.reserved = 0  # KV tokens reserved by the running sequences

    def add(self, seqs: Iterable[Seq]) -> None:
        """Queue new sequences behind those already waiting."""
        self.waiting.extend(seqs)

    def credit(self, rid: int, n: int) -> None:
        """Give running sequence `rid` credit for `n` more chunks; other ids are ignored."""
        if rid in self.running:
            self.running[rid].credit += n

    def has_work(self) -> bool:
        """Whether a step may do something: a waiting sequence that `admit` would take
        now (a free slot, and room in the KV budget), or a running sequence with
        credit. Otherwise the thread sleeps until something changes."""
        return self._can_admit() or any(s.credit > 0 for s in self.running.values())

    def _can_admit(self) -> bool:
        if not (self.waiting and self.free_slots):
            return False
        return not self.running or self.reserved + self.waiting[0].reserve <= self.kv_tokens

    def admit(self) -> list[Seq]:
        """Move waiting sequences into free slots, FIFO, while they fit the KV budget.
        Returns those admitted, in order."""
        admitted: list[Seq] = []
        # FIFO: while the head does not fit, later requests wait behind it, not overtake
        while self._can_admit():
            s = self.waiting.popleft()
            s.slot = self.free_slots.pop()
            self.reserved += s.reserve
            self.running[s.rid] = s
            admitted.append(s)
        return admitted

    def overdue(self, now: float) -> list[Seq]:
        """Take out of the queue the sequences that have waited `max_wait` seconds
        or more by `now` (a ``perf_counter`` time), oldest first: under overload a
        request is told early that the model is busy, rather than timing out after
        minutes behind the others."""
        out: list[Seq] = []
        if self.max_wait is None:
            return out
        cutoff = now - self.max_wait
        while self.waiting and self.waiting[0].submitted <= cutoff:  # FIFO: oldest first
            out.append(self.waiting.popleft())
        return out

    def next_overdue(self) -> float | None:
        """When (``perf_counter``) the oldest waiting sequence becomes overdue; None
        if none is waiting or waits are not bounded."""
        if self.max_wait is None or not self.waiting:
            return None
        return self.waiting[0].submitted + self.max_wait

    def unqueue(self, rid: int) -> Seq | None:
        """Remove waiting sequence `rid` from the queue; None if it is not waiting."""
        for s in self.waiting:
            if s.rid == rid:
                self.waiting.remove(s)
                return s
        return None

    def release(self, s: Seq) -> None:
        """Take running sequence `s` out of the batch, freeing its slot and KV budget.
        Raises `KeyError` if it is not running."""
        del self.running[s.rid]
        self.free_slots.append(s.slot)
        self.reserved -= s.reserve

    def groups(self, per_seq: bool = False) -> list[list[Seq]]:
        """The running sequences with credit, grouped by adapter (one decode call
        each), or all in one group when the model selects adapters per sequence."""
        groups: dict[str | None, list[Seq]] = {}
        for s in self.running.values():
            if s.credit > 0:
                groups.setdefault(None if per_seq else s.adapter, []).append(s)
        return list(groups.values())

    def plan(self, group: list[Seq]) -> Step:
        """The next decode call for `group`: one token for each sequence past its
        prompt, then prompt chunks while the step's token budget lasts. Advances
        the sequences' positions and prompt progress."""
        step = Step()
        for s in group:
            if s.prefilled:
                step.feed(s, s.last, True)
        for s in group:
            room = self.step_tokens - len(step.items)
            if not s.prefilled and room > 0:
                _prefill(s, step, room)
        return step


def _prefill(s: Seq, step: Step, room: int) -> None:
    """Feed up to `room` more prompt tokens of `s`; the prompt's last one is sampled."""
    for token in s.prompt[s.fed:s.fed + room]:
        s.fed += 1
        step.feed(s, token, s.prefilled)
