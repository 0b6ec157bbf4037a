"""`TokenBudgets`: what an AI call reserves, for whom, and its settlement.

A call is paid for by a key (the principal's ``tpm`` / ``max_streams``) and its
tenant (``[ratelimit.tenants.T]``); an ``ai`` binding call by its function's
tenant. At admission it reserves its prompt's tokens (counted with the model's
tokenizer) plus ``max_tokens`` (``default_max_tokens`` when it sets none); a
stream also takes a slot under each stream cap. The `Ticket` it gets is settled
with the real usage when the answer or stream ends, which refunds what was not
used and gives the slot back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from edgefn_core.errors import Rejected, WorkerDead, WorkerError
from runtime.security.principal import Principal
from runtime.security.ratelimit.budget import (
    WINDOW,
    BudgetStore,
    MemoryBudgetStore,
    Refusal,
    SharedBudgetStore,
)
from runtime.security.ratelimit.headers import Quota, fields, retry_after
from runtime.security.ratelimit.outage import Outage, StorageDown
from runtime.security.settings import RateLimitSettings

if TYPE_CHECKING:
    from gpu_worker.client import Generation, WorkerClient

log = logging.getLogger("edgefn.pop")
_settling: set[asyncio.Task[None]] = set()  # abandoned tickets being settled


class Payer:
    """Who a call is charged to: token buckets with their per-minute limits, and
    stream slots with their caps."""

    __slots__ = ("buckets", "caps", "limits", "names", "slots")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.buckets: list[str] = []
        self.limits: list[int] = []
        self.slots: list[str] = []
        self.caps: list[int] = []

    def charge(self, name: str, bucket: str, tpm: int | None, streams: int | None) -> None:
        if tpm is not None:
            self.names.append(name)
            self.buckets.append(bucket)
            self.limits.append(tpm)
        if streams is not None:
            self.slots.append(bucket)
            self.caps.append(streams)

    def __bool__(self) -> bool:
        return bool(self.buckets or self.slots)


class Ticket:
    """One admitted call's reservation. `settle` once with the real usage (more
    calls do nothing)."""

    def __init__(self, store: BudgetStore, payer: Payer, prompt: int, reserved: int,
                 window: int | None, stream: bool) -> None:
        """`prompt`: the tokens counted in the input; `reserved`: those plus the
        output allowed; `window`: where they were reserved (None: no token budget)."""
        self.store, self.payer, self.reserved, self.window = store, payer, reserved, window
        self.prompt, self.stream = prompt, stream
        self.settled = False

    async def settle(self, used: int | None) -> None:
        """Charge `used` tokens instead of the reservation; None (the usage is not
        known: a failure) keeps the whole reservation charged."""
        if self.settled:
            return
        self.settled = True
        try:
            if self.window is not None and used is not None:
                await self.store.settle(self.payer.buckets, self.window, used - self.reserved)
            if self.stream and self.payer.slots:
                await self.store.release(self.payer.slots)
        except StorageDown as e:  # the reservation stays charged; a slot expires in Redis
            log.warning("a token budget could not be settled: the store is unreachable (%s)",
                        e)

    def abandon(self) -> None:
        """Settle later as a failure (from a finalizer: a stream whose body was
        never read)."""
        if self.settled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop any more: the PoP and its memory are gone
            return
        task = loop.create_task(self.settle(None))
        _settling.add(task)
        task.add_done_callback(_settling.discard)


class TokenBudgets:
    """Reservations against ``[ratelimit]``'s tenants and each key's limits."""

    def __init__(self, settings: RateLimitSettings, store: BudgetStore | None = None,
                 table: str | None = None, worker: tuple[int, int] | None = None) -> None:
        """`store`: default, the one `settings.storage` names (memory, in `table` where
        ``workers = N`` share one, as `worker`: `store_for`, or Redis)."""
        self.settings = settings
        self.store = store if store is not None else store_for(settings.storage, table,
                                                               worker)
        self.outage = Outage(settings.on_storage_error, "token budgets")

    def payer(self, principal: Principal | None, tenant: str | None = None) -> Payer:
        """The buckets a call is charged to: the principal's key and tenant, else
        `tenant` (an ``ai`` binding call's function owner). Empty when none has a
        limit."""
        payer = Payer()
        if principal is not None:
            payer.charge("key-tpm", f"key:{principal.identity}", principal.tpm,
                         principal.max_streams)
            tenant = principal.tenant
        limits = self.settings.tenants.get(tenant) if tenant is not None else None
        if limits is not None:
            payer.charge("tenant-tpm", f"tenant:{tenant}", limits.tpm, limits.max_streams)
        return payer

    async def admit_ai(self, payer: Payer, client: WorkerClient, model: str, stream: bool,
                       max_tokens: int | None, caller: str | None = None,
                       hop: dict[str, Any] | None = None, **text: Any) -> Ticket | None:
        """`admit` for one model call, its prompt counted by the worker (`text`: what
        `WorkerClient.count_tokens` takes) in `caller`'s fair share (`model_client`;
        `hop`: the call's ``request_id`` and ``signed_client``, for an upstream that
        counts); None when `payer` has no limit. An engine that cannot count (an upstream
        server that serves no ``/tokenize``) reserves the input's UTF-8 JSON length,
        more than its tokens. Raises
        what `admit` raises and the worker's refusal of the input (`WorkerError`:
        unknown model, empty prompt)."""
        if not payer:
            return None

        async def count() -> int:
            try:
                return await client.count_tokens(model, client=caller, **(hop or {}), **text)
            except WorkerError as e:
                if e.code != "count_unsupported":
                    raise
                return len(msgspec.json.encode(text))

        return await self.admit(payer, count, max_tokens, stream)

    async def admit(self, payer: Payer, count: Callable[[], Awaitable[int]],
                    max_tokens: int | None, stream: bool) -> Ticket:
        """Reserve for one call. `count` gives the prompt's tokens (only called when
        a token budget applies); `max_tokens` None reserves ``default_max_tokens``.
        Raises `Rejected`: 429 ``too_many_streams``, 429 ``token_budget`` (with
        Retry-After) when the reservation does not fit now, 400 ``token_budget``
        when it can never fit; 503 ``ratelimit_unavailable`` when the store cannot be
        reached and ``on_storage_error = "closed"`` (with "open", an unmetered ticket);
        and what `count` raises."""
        try:
            return await self._admit(payer, count, max_tokens, stream)
        except StorageDown as e:
            self.outage.admit(e)  # raises Rejected (503) when closed
            return Ticket(self.store, payer, 0, 0, None, False)

    async def _admit(self, payer: Payer, count: Callable[[], Awaitable[int]],
                     max_tokens: int | None, stream: bool) -> Ticket:
        if stream and payer.slots:
            full = await self.store.acquire(payer.slots, payer.caps)
            if full is not None:
                raise Rejected("too_many_streams", 429, f"at most {payer.caps[full]} "
                               f"concurrent streams for {_who(payer.slots[full])}",
                               headers=[retry_after(1)])
        try:
            return await self._reserve(payer, count, max_tokens, stream)
        except BaseException:
            if stream and payer.slots:
                await self.store.release(payer.slots)
            raise

    async def _reserve(self, payer: Payer, count: Callable[[], Awaitable[int]],
                       max_tokens: int | None, stream: bool) -> Ticket:
        if not payer.buckets:
            return Ticket(self.store, payer, 0, 0, None, stream)
        prompt = await count()
        amount = prompt + (self.settings.default_max_tokens if max_tokens is None else max_tokens)
        smallest = min(range(len(payer.limits)), key=payer.limits.__getitem__)
        if amount > payer.limits[smallest]:
            why = "max_tokens" if max_tokens is not None else (
                f"{self.settings.default_max_tokens}, [ratelimit] default_max_tokens, as it "
                "sets no max_tokens")
            too_big = Rejected("token_budget", 400, f"this request reserves {amount} tokens "
                               f"(its prompt plus {why}), more than the "
                               f"{payer.limits[smallest]} per minute of "
                               f"{_who(payer.buckets[smallest])}: "
                               f"{'lower' if max_tokens is not None else 'set a lower'} "
                               "max_tokens")
            too_big.param = "max_tokens"  # type: ignore[attr-defined]  # OpenAI's `param`
            raise too_big
        got = await self.store.reserve(payer.buckets, payer.limits, amount)
        if isinstance(got, Refusal):
            raise self._refused(payer, got, amount)
        return Ticket(self.store, payer, prompt, amount, got, stream)

    def _refused(self, payer: Payer, r: Refusal, amount: int) -> Rejected:
        limit = payer.limits[r.index]
        quota = Quota(payer.names[r.index], limit, WINDOW, int(limit - r.used), r.retry_after)
        headers = [retry_after(r.retry_after)]
        if self.settings.headers:
            headers += fields([quota])
        return Rejected("token_budget", 429, f"token budget of {_who(payer.buckets[r.index])} "
                        f"exhausted: {int(r.used)} of {limit} tokens per minute in use, this "
                        f"request reserves {amount}", headers=headers)


def used_by(ticket: Ticket, gen: Generation | None, error: BaseException | None) -> int:
    """The tokens a generation is charged: its usage once it finished; none if
    the worker refused it (4xx, nothing read: nothing ran); what the client read
    if the worker died under it (`WorkerDead`: not the client's to pay for); its
    prompt and what was read if the worker failed it otherwise (a timeout: the
    prompt was read and generation ran); else, ended early by the client, its
    prompt, what was read and what may have been generated unread (one token a
    chunk, at most its window), never more than reserved."""
    if gen is not None and gen.done is not None:
        return gen.done.prompt_tokens + gen.done.completion_tokens
    if gen is None or (isinstance(error, WorkerError) and error.status < 500 and not gen.tokens):
        return 0
    if isinstance(error, WorkerDead):
        return min(ticket.reserved, gen.tokens)
    if isinstance(error, WorkerError) and error.status >= 500:
        return min(ticket.reserved, ticket.prompt + gen.tokens)
    return min(ticket.reserved, ticket.prompt + gen.tokens + gen.window)


def store_for(storage: str, table: str | None = None, worker: tuple[int, int] | None = None
              ) -> BudgetStore:
    """The budget store of a ``[ratelimit] storage`` URI (checked by `Limiter`); in
    memory, the shared `table` of ``workers = N`` where there is one, its stream slots
    held as `worker` (which, of how many; None: this process's own). Raises OSError or
    ValueError for a table it cannot map or a worker it cannot count."""
    if storage.startswith(("redis://", "rediss://", "redis+unix://")):
        from runtime.security.ratelimit.redis_budget import RedisBudgetStore

        return RedisBudgetStore(storage.replace("redis+unix://", "unix://", 1))
    if table is not None:
        from runtime.security.ratelimit.native import counters

        shared = counters(table=table)
        if shared.table is not None:  # (None: no native counters, logged)
            return SharedBudgetStore(shared, worker=worker)
    return MemoryBudgetStore()


def _who(bucket: str) -> str:
    kind, _, name = bucket.partition(":")
    return f"{kind} {name!r}"


async def settled_embedding(ticket: Ticket | None, pending: Awaitable[dict[str, Any]]
                            ) -> dict[str, Any]:
    """The result of an embedding call (``{"tokens", ...}``), with `ticket` settled
    for the tokens it read: none when the call fails."""
    try:
        out = await pending
    except BaseException:
        if ticket is not None:
            await ticket.settle(0)
        raise
    if ticket is not None:
        await ticket.settle(out["tokens"])
    return out
