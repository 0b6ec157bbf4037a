"""Continuous-batching policy for the llama.cpp engine: which waiting requests
run, what each decode step feeds, and when a sequence ends.

Pure Python: nothing here calls llama.cpp, starts a thread or sends output, so
each rule has a unit test without a model (the split vLLM makes between
``EngineCore``, the step, and the process around it).

- Requests belong to clients (`Generate.client`: an API key, a function's
  owner; None is one anonymous client). A client's *use* is the KV tokens its
  running sequences hold: the cache is what they contend for (a slot is cheap;
  a long stream is not), and what preemption frees.
- Admission takes, into free sequence slots, the first waiting request of the
  client using least (FIFO within a client, its preempted ones first; a tie
  goes to the request queued first) while its prompt plus `HEADROOM` tokens fits
  in the KV cache next to what the running sequences use (their prompts and
  the tokens generated so far, not their ``max_tokens``); a request that does
  not fit waits, and every other waits behind it. A lone sequence is admitted
  whatever its size.
- When that request does not fit, sequences of the client using most are
  preempted for it (`rebalance`), as long as that client still uses at least
  as much as the request's client will: another client's many hogs hold a
  fair share, not the whole cache. One client alone never preempts itself so.
- KV use grows as sequences generate. When the next step's tokens do not fit,
  running sequences of the client using most are preempted: within it one
  paused for credit first, else its most recently admitted; a lone sequence
  never is. A preempted sequence gives up its batch slot and goes back to the
  front of the queue; readmitted (before its client's new requests, once its
  reader has given it credit), it goes on where it stopped: its sampler,
  stop-text state and token count are kept, and nothing already sent is sent
  again.
- A preempted sequence keeps its KV cells (*parked*, under its own llama.cpp
  sequence id: there are more ids than batch slots) until something needs the
  room: a sequence admitted or growing, or an id for a new one. Then the
  longest parked give theirs up first (one paused for credit before one that
  may run), before any running sequence is preempted for cells. One whose cells
  are gone is recomputed (vLLM's recompute preemption): its prompt plus its
  output so far is the prompt it feeds again. So a hog that gives its slot to
  another client's short chat, and takes it back once the chat ends, costs no
  prefill however often that happens; only a shortage of cells does.
- No client starves: a client's use only falls while it waits (its running
  sequences end or are preempted), so its head becomes the least used's, and a
  head that does not fit holds every other request back until it does.
- A sequence paused for credit longer than `PAUSE_GRACE` seconds is preempted
  too when the queue's head cannot be admitted without its slot or cells, so
  slow readers never hold the model idle while others wait.
- Every running sequence with flow-control credit gets one new token per step;
  one without credit sits the step out.
- Prompts are fed in chunks within the step's token budget (llama.cpp's
  ``n_batch``), after the running sequences' tokens, the prompt with the fewest
  tokens left first. A step in which any sequence samples (a running one, or a
  prompt whose last token it feeds) feeds at most `prefill_chunk` prompt tokens:
  a decode call's time grows with its tokens, so a long prompt fed beside others
  costs their next token a small chunk's time, not a whole budget's (on two
  cores, 512 tokens of the 135M model take ~1 s). Alone, a prompt takes the
  whole budget.
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

from ..protocol import DEFAULT_MAX_TOKENS
from ..stops import StopText

if TYPE_CHECKING:
    from ..protocol import Generate, TokenLogprob
    from . import Sink

STEP_TOKENS = 512  # tokens per decode call (llama.cpp's n_batch)
PREFILL_CHUNK = 128  # prompt tokens a call feeds while some sequence waits on it for a token
MAX_SEQ_IDS = 256  # llama.cpp's LLAMA_MAX_SEQ: the most sequence ids a context takes
HEADROOM = 16  # KV tokens beyond its prompt that must be free to admit a sequence
PAUSE_GRACE = 1.0  # seconds paused for credit before a sequence yields to waiting ones

Item = tuple[int, int, int, bool]  # (token, position, sequence slot, wants logits)


def seq_ids_for(slots: int) -> int:
    """llama.cpp sequence ids for `slots` batch slots: as many again to park
    preempted sequences' cells in, within llama.cpp's bound."""
    return max(slots, min(2 * slots, MAX_SEQ_IDS))


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
                   req.max_tokens or DEFAULT_MAX_TOKENS)


class Seq:
    """One generation: its prompt, sampling parameters, KV slot and output state."""

    def __init__(self, req: Generate, sink: Sink, prompt: list[int],
                 adapter: str | None = None, scale: float = 1.0,
                 shaping: Shaping | None = None) -> None:
        self.rid = req.id
        self.client = req.client  # whose share it counts in
        self.sink = sink
        self.prompt = prompt  # to feed: the request's, then its output too once preempted
        self.prompt_tokens = len(prompt)  # the request's own (its usage)
        self.output: list[int] = []  # tokens sampled and fed back, re-fed once preempted
        self.preempted = False  # it ran before: its wait is not an admission wait
        self.adapter = adapter
        self.scale = scale
        self.max_tokens = req.max_tokens or DEFAULT_MAX_TOKENS  # (the engine sets it: `Generate`)
        self.temperature, self.top_p, self.top_k = req.temperature, req.top_p, req.top_k
        self.seed = req.seed if req.seed is not None else random.getrandbits(32)
        # the request it is a choice of (OpenAI's n: one Generate each, the same request
        # id, client and prompt), None where the request has no id; once one of its
        # choices was admitted, the others wait for their turn without `max_wait`
        # (`Scheduler.overdue`): they wait for room their siblings hold, not for the
        # model to come free
        self.group = None if req.request_id is None else (
            req.client, req.request_id, adapter, hash(tuple(prompt)))
        self.sibling_admitted = False
        # stop strings cut the answer's text, never its tool calls (`StopText`)
        self.stop = StopText(req.stop, calls=bool(req.tools) and req.tool_choice != "none")
        self.shaping = shaping
        self.logprobs = req.logprobs  # top alternatives per token; None: no logprobs
        self.pending: list[TokenLogprob] = []  # logprobs of tokens whose text is not sent yet
        self.credit = req.window  # chunks it may send before the client reads them
        self.paused_at = time.perf_counter()  # when its credit last ran out (or it began)
        self.slot = -1  # its llama.cpp sequence id while it runs or is parked
        self.fed = 0  # prompt tokens decoded so far
        self.pos = 0
        self.last = 0  # the token to decode next
        self.generated = 0
        self.sampler: Any = None  # owned by the driver, which frees it
        self.submitted = self.last_token_at = time.perf_counter()

    @property
    def footprint(self) -> int:
        """KV cache tokens it holds, or will hold once its whole prompt is fed."""
        return max(len(self.prompt), self.pos)

    @property
    def prefilled(self) -> bool:
        """Whether the whole prompt has been fed."""
        return self.fed == len(self.prompt)

    def advance(self, token: int, piece: bytes | None) -> tuple[str, str | None]:
        """Take the token just sampled (`piece` is its bytes, None for an end-of-
        generation token). Returns the text that may be sent now and the finish
        reason ("stop", "length"), or None while the sequence goes on."""
        self.generated += 1
        if piece is None:  # what the stop text held back, cut at a stop string there
            return self.stop.flush(), "stop"
        text = self.stop.feed(piece)
        if self.stop.stopped:
            return text, "stop"
        if self.generated >= self.max_tokens:
            # a stop string held back (a longer one could have begun before it) ends
            # the output there: that is a stop, not the length
            text += self.stop.flush()
            return text, "stop" if self.stop.stopped else "length"
        self.last = token
        self.output.append(token)
        return text, None

    def spend(self, now: float) -> None:
        """One chunk sent at `now` (a ``perf_counter`` time): one credit less."""
        self.credit -= 1
        if self.credit == 0:
            self.paused_at = now

    def rewind(self) -> None:
        """Drop its KV progress (its cells are gone): its prompt and output so far
        are fed again, and sampling the last of them gives its next token."""
        self.prompt = self.prompt[:self.prompt_tokens] + self.output
        self.fed = self.pos = 0


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

    `slots` sequences run at most; together they hold at most `kv_tokens` cache
    tokens (a lone sequence runs whatever its size: the engine refuses requests
    whose prompt plus ``max_tokens`` is larger than the context before they get
    here). Running and parked sequences each hold one of `seq_ids` llama.cpp
    sequence ids (`seq_ids_for(slots)` by default; the model's context must take
    that many); their cells together never exceed `kv_tokens` but for a lone
    running sequence. A new sequence waits at most `max_wait` seconds for its turn
    (`overdue`; None: no bound); a preempted one is never turned away, nor one
    whose sibling (another choice of its request: `Seq.group`) was admitted.

    Raises `ValueError` if `seq_ids` is less than `slots`.
    """

    def __init__(self, slots: int, kv_tokens: int, step_tokens: int = STEP_TOKENS,
                 max_wait: float | None = None, headroom: int = HEADROOM,
                 pause_grace: float = PAUSE_GRACE, seq_ids: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK) -> None:
        ids = seq_ids_for(slots) if seq_ids is None else seq_ids
        if ids < slots:
            raise ValueError(f"{ids} sequence ids for {slots} batch slots: at least one each")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.slots = slots
        self.kv_tokens = kv_tokens
        self.max_wait = max_wait
        self.step_tokens = step_tokens
        self.prefill_chunk = prefill_chunk
        # a token per slot at least: the step after an admission never preempts
        self.headroom = max(headroom, slots)
        self.pause_grace = pause_grace
        self.waiting: deque[Seq] = deque()
        self.preempted: dict[int, Seq] = {}  # the waiting sequences that ran before
        self.running: dict[int, Seq] = {}  # in admission order
        self.parked: dict[int, Seq] = {}  # preempted ones that kept their cells, oldest first
        self.free_ids = list(range(ids))[::-1]  # llama.cpp sequence ids no sequence holds
        self.dropped: list[int] = []  # ids whose cells the caller must clear (`take_dropped`)
        self.recomputed = 0  # sequences whose cells were dropped while they wait to go on

    @property
    def in_use(self) -> int:
        """KV tokens the running sequences hold, or will once their prompts are fed."""
        return sum(s.footprint for s in self.running.values())

    @property
    def cached(self) -> int:
        """KV tokens the parked sequences hold: room taken back whenever it is needed."""
        return sum(s.pos for s in self.parked.values())

    def add(self, seqs: Iterable[Seq]) -> None:
        """Queue new sequences behind those already waiting."""
        for s in seqs:
            if s.group is not None and self._sibling_admitted(s.group):
                s.sibling_admitted = True
            self.waiting.append(s)

    def _sibling_admitted(self, group: tuple[Any, ...]) -> bool:
        """Whether a sequence of `group` runs, or waits after it was admitted once
        (preempted) or after a sibling was."""
        return any(s.group == group for s in self.running.values()) or any(
            s.group == group and (s.preempted or s.sibling_admitted) for s in self.waiting)

    def credit(self, rid: int, n: int) -> None:
        """Give sequence `rid` (running, or waiting after a preemption) credit for `n`
        more chunks; other ids are ignored."""
        s = self.running.get(rid) or self.preempted.get(rid)
        if s is not None:
            s.credit += n

    def has_work(self, now: float | None = None) -> bool:
        """Whether a step may do something at `now` (a ``perf_counter`` time): admit
        the queue's head, preempt paused sequences for it (`evict_paused`), or run
        a sequence with credit. Otherwise the thread sleeps until something changes
        or `next_wake`."""
        now = time.perf_counter() if now is None else now
        head = self._head()
        return (head is not None and self._admits(head)) \
            or any(s.credit > 0 for s in self.running.values()) \
            or bool(self._paused_victims(now)) or bool(self._fair_victims())

    def use(self) -> dict[str | None, int]:
        """KV tokens each client's running sequences hold (or will, prompts fed)."""
        use: dict[str | None, int] = {}
        for s in self.running.values():
            use[s.client] = use.get(s.client, 0) + s.footprint
        return use

    def _head(self) -> Seq | None:
        """The waiting sequence to admit next: the first of the client using least
        (a tie: the one queued first), passing over preempted ones whose reader has
        given them no credit since (they would only pause again)."""
        use = self.use()
        head: Seq | None = None
        seen: set[str | None] = set()
        for s in self.waiting:
            if s.client in seen or (s.preempted and s.credit <= 0):
                continue
            seen.add(s.client)
            if head is None or use.get(s.client, 0) < use.get(head.client, 0):
                head = s
        return head

    def _admits(self, s: Seq) -> bool:
        """Whether `s` fits now: a free batch slot, and its cells plus the headroom
        next to what the running sequences use (or nothing runs). Parked cells do
        not count: they are given back for it."""
        return len(self.running) < self.slots and self._fits(s, self.in_use, len(self.running))

    def _fits(self, s: Seq, in_use: int, running: int) -> bool:
        return not running or in_use + s.footprint + self.headroom <= self.kv_tokens

    def admit(self) -> list[Seq]:
        """Move waiting sequences into free slots, the least used client's first
        (`_head`), while they fit. Returns those admitted, in order."""
        admitted: list[Seq] = []
        # while the head does not fit, other requests wait behind it, not overtake: so
        # a big request of the least used client is not starved by small ones
        while (s := self._head()) is not None and self._admits(s):
            self.waiting.remove(s)
            self.preempted.pop(s.rid, None)
            if self.parked.pop(s.rid, None) is None:  # parked: its id and cells are there
                s.slot = self._free_id()
            self.running[s.rid] = s
            self._reclaim(0)
            admitted.append(s)
            if s.group is not None:  # its request got its turn: the rest of it waits on it
                for w in self.waiting:
                    if w.group == s.group:
                        w.sibling_admitted = True
        return admitted

    def _free_id(self) -> int:
        """A sequence id for a sequence admitted: a free one, else a parked one's
        (its cells dropped). The caller made sure fewer than `slots` run."""
        if not self.free_ids:
            self._drop(self._next_to_drop())
        return self.free_ids.pop()

    def _reclaim(self, growth: int) -> None:
        """Drop parked sequences' cells (`_next_to_drop` first) until the running
        ones' cells and `growth` more fit with the rest parked."""
        while self.parked and self.in_use + growth + self.cached > self.kv_tokens:
            self._drop(self._next_to_drop())

    def _next_to_drop(self) -> Seq:
        """The parked sequence to drop first: the longest parked of those paused for
        credit (readmitted last), else of all. Raises `StopIteration` if none is."""
        first = next(iter(self.parked.values()))
        return next((s for s in self.parked.values() if s.credit <= 0), first)

    def _drop(self, s: Seq) -> None:
        """Take parked `s`'s cells back: its id is free once the caller clears them,
        and it is recomputed when readmitted."""
        self._unpark(s)
        s.rewind()
        self.recomputed += 1

    def _unpark(self, s: Seq) -> None:
        del self.parked[s.rid]
        self.free_ids.append(s.slot)
        self.dropped.append(s.slot)

    def take_dropped(self) -> list[int]:
        """The sequence ids whose KV cells the caller must clear before the next
        decode (a sequence admitted since may hold one already, but has decoded
        nothing yet), in the order they were dropped; each is named once."""
        dropped, self.dropped = self.dropped, []
        return dropped

    def make_room(self) -> list[Seq]:
        """Make room in the KV cache for the next step's new tokens (one for each
        sequence past its prompt with credit): parked sequences' cells go first
        (`take_dropped`), then running sequences are preempted, from the client
        using most: one paused for credit first (the longest paused), else the most
        recently admitted; never a lone one. Returns those preempted (their cells
        dropped as well where the room is still short)."""
        out: list[Seq] = []
        while True:
            self._reclaim(self._growth())
            if len(self.running) <= 1 or self.in_use + self._growth() <= self.kv_tokens:
                return out
            use = self.use()
            victim = self._victim(max(use, key=use.__getitem__))
            self._preempt(victim)
            out.append(victim)

    def _victim(self, client: str | None, besides: Iterable[Seq] = ()) -> Seq:
        """The running sequence of `client` (but `besides`) to preempt: the longest
        paused for credit, else the most recently admitted. Raises `IndexError` if
        there is none."""
        mine = [s for s in self.running.values() if s.client == client and s not in besides]
        paused = [s for s in mine if s.credit <= 0]
        return min(paused, key=lambda s: s.paused_at) if paused else mine[-1]

    def rebalance(self) -> list[Seq]:
        """Preempt sequences of the clients using most for the queue's head when it
        does not fit, if that leaves each of them using at least as much as the
        head's client will once admitted; none unless that lets the head in.
        Returns them, parked: their cells are dropped only where the head's
        admission needs them (`take_dropped`)."""
        victims = self._fair_victims()
        for s in victims:
            self._preempt(s)
        return victims

    def _fair_victims(self) -> list[Seq]:
        head = self._head()
        if head is None or self._admits(head):
            return []
        use = self.use()
        wanted = use.pop(head.client, 0) + head.footprint
        chosen: list[Seq] = []
        in_use, running = self.in_use, len(self.running)
        free = self.slots - running
        while use and running > 1:
            heavy = max(use, key=use.__getitem__)
            if use[heavy] <= wanted:  # so it still runs a sequence not chosen
                return []
            victim = self._victim(heavy, chosen)
            if use[heavy] - victim.footprint < wanted:
                return []  # the head's client would then use more than the one it took from
            chosen.append(victim)
            use[heavy] -= victim.footprint
            in_use, running, free = in_use - victim.footprint, running - 1, free + 1
            if free and self._fits(head, in_use, running):
                return chosen
        return []

    def _growth(self) -> int:
        return sum(1 for s in self.running.values() if s.credit > 0 and s.prefilled)

    def evict_paused(self, now: float) -> list[Seq]:
        """Preempt sequences paused for credit `pause_grace` seconds or more by `now`
        (a ``perf_counter`` time), the longest paused first, when that lets the
        queue's head in; none otherwise. Returns them as `rebalance` does."""
        victims = self._paused_victims(now)
        for s in victims:
            self._preempt(s)
        return victims

    def _paused_victims(self, now: float) -> list[Seq]:
        found = self._eviction()
        return found[1] if found is not None and found[0] <= now else []

    def _eviction(self) -> tuple[float, list[Seq]] | None:
        """The fewest longest-paused sequences whose slots and cells would let the
        queue's head in, and when (``perf_counter``) the last of them will have been
        paused `pause_grace`; None if the head fits already or no such set exists.
        `has_work` and `next_wake` both ask it: read at one instant each, a grace
        ending between the two calls could not leave the thread asleep for good."""
        head = self._head()
        if head is None or self._admits(head):
            return None
        paused = sorted((s for s in self.running.values() if s.credit <= 0),
                        key=lambda s: s.paused_at)
        in_use, running = self.in_use, len(self.running)
        for n, s in enumerate(paused, 1):
            in_use, running = in_use - s.footprint, running - 1
            if self._fits(head, in_use, running):
                return s.paused_at + self.pause_grace, paused[:n]
        return None

    def _preempt(self, s: Seq) -> None:
        """Take running `s` out of the batch to the queue's front, parked."""
        del self.running[s.rid]
        s.preempted = True
        self.waiting.appendleft(s)
        self.preempted[s.rid] = s
        self.parked[s.rid] = s

    def overdue(self, now: float) -> list[Seq]:
        """Take out of the queue the new sequences that have waited `max_wait`
        seconds or more by `now` (a ``perf_counter`` time), oldest first: under
        overload a request is told early that the model is busy, rather than timing
        out after minutes behind the others. A preempted sequence was admitted
        once (and has most likely streamed already, to a client that reads it): it
        waits for its turn again, however long. So does a later choice of a request
        one of whose choices was admitted (`Seq.group`): the model was not too busy
        for that request; its choices, each prefilling the whole prompt, may only fit
        in the KV cache one after another (n=3 with a 5k-token prompt in 8k tokens),
        and the request as a whole is bounded by its caller's timeouts."""
        if self.max_wait is None:
            return []
        cutoff = now - self.max_wait
        out = [s for s in self.waiting if _bounded(s) and s.submitted <= cutoff]
        for s in out:
            self.waiting.remove(s)
        return out

    def next_wake(self) -> float | None:
        """When (``perf_counter``) the scheduler has something to do without news:
        the oldest new waiting sequence becomes overdue, or sequences paused for
        credit may yield to the queue's head (`_eviction`); perhaps a time already
        past, which `has_work` then sees. None: nothing to wait for."""
        times: list[float] = []
        first = next((s for s in self.waiting if _bounded(s)), None)
        if first is not None and self.max_wait is not None:
            times.append(first.submitted + self.max_wait)
        if (found := self._eviction()) is not None:
            times.append(found[0])
        return min(times, default=None)

    def unqueue(self, rid: int) -> Seq | None:
        """Remove waiting sequence `rid` from the queue (a parked one's cells are
        dropped: `take_dropped`); None if it is not waiting."""
        for s in self.waiting:
            if s.rid == rid:
                if s.rid in self.parked:
                    self._unpark(s)
                self.waiting.remove(s)
                self.preempted.pop(rid, None)
                return s
        return None

    def release(self, s: Seq) -> None:
        """Take running sequence `s` out of the batch, freeing its slot, its sequence
        id and its KV budget (the caller clears its cells). Raises `KeyError` if it
        is not running."""
        del self.running[s.rid]
        self.free_ids.append(s.slot)

    def groups(self, per_seq: bool = False) -> list[list[Seq]]:
        """The running sequences with credit, grouped by adapter (one decode call
        each), or all in one group when the model selects adapters per sequence."""
        groups: dict[str | None, list[Seq]] = {}
        for s in self.running.values():
            if s.credit > 0:
                groups.setdefault(None if per_seq else s.adapter, []).append(s)
        return list(groups.values())

    def plan(self, group: list[Seq], sampling: bool = False) -> Step:
        """The next decode call for `group`: one token for each sequence past its
        prompt, then prompt chunks while the step's token budget lasts, the prompt
        with the fewest tokens left first (a short prompt's first token came only
        after a long one's whole prefill: 16 s behind 4,000 tokens on 2 cores).
        Once some sequence samples in the step, or in another group's call of the
        same iteration (`sampling`: one call per adapter), prompts get at most
        `prefill_chunk` tokens of it in all (a running stream's next token, or a
        short prompt's first, waited for 512 tokens of a long one). Advances the
        sequences' positions and prompt progress."""
        step = Step()
        prompts = []
        for s in group:
            if s.prefilled:
                step.feed(s, s.last, True)
            else:
                prompts.append(s)
        if len(prompts) > 1:
            prompts.sort(key=_prompt_left)
        fed = 0  # prompt tokens in the step
        for s in prompts:
            room = self.step_tokens - len(step.items)
            if sampling or step.outputs:
                room = min(room, self.prefill_chunk - fed)
            if room <= 0:
                break
            fed += _prefill(s, step, room)
        return step


def _bounded(s: Seq) -> bool:
    """Whether waiting `s` waits at most `max_wait`: neither it nor a sibling was
    admitted before (`Scheduler.overdue`)."""
    return not s.preempted and not s.sibling_admitted


def _prompt_left(s: Seq) -> int:
    return len(s.prompt) - s.fed


def _prefill(s: Seq, step: Step, room: int) -> int:
    """Feed up to `room` more prompt tokens of `s`, and say how many; the prompt's
    last one is sampled."""
    chunk = s.prompt[s.fed:s.fed + room]
    for token in chunk:
        s.fed += 1
        step.feed(s, token, s.prefilled)
    return len(chunk)
