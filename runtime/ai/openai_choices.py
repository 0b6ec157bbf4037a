"""The ``n`` choices of one completion: ``n`` generations run side by side in the
worker (its scheduler batches them as separate sequences), collected into
``choices[i]`` or streamed with each index's chunks interleaved, as OpenAI
streams them. Usage is OpenAI's: the prompt counted once, the completions summed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from edgefn_core.errors import WorkerError
from gpu_worker.client import Generation
from gpu_worker.protocol import Done
from runtime.ai.shaping import ChoiceStream
from runtime.ai.usage import UsageRecord
from runtime.net.openai_sse import DONE, Chunks, event
from runtime.security.ratelimit.admission import Ticket, used_by


def merged(dones: Sequence[Done]) -> Done:
    """One `Done` for all choices: the prompt once, the completions summed, the
    first choice's finish reason."""
    first = dones[0]
    return Done(first.id, first.finish_reason, first.prompt_tokens,
                sum(d.completion_tokens for d in dones))


def usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def charged(ticket: Ticket, gens: Sequence[Generation], error: BaseException | None) -> int:
    """The tokens `gens` are charged (see `used_by`), the shared prompt once."""
    each = [used_by(ticket, g, error) for g in gens]
    spent = sum(each) - ticket.prompt * (sum(1 for u in each if u) - 1)
    return max(0, min(spent, ticket.reserved)) if len(gens) > 1 else sum(each)


async def collect(gen: Generation, record: UsageRecord) -> tuple[str, Done]:
    """`Generation.collect`, noting when the first chunk came. Raises `WorkerError`."""
    parts = []
    async for chunk in gen:
        record.first_token()
        parts.append(chunk)
    assert gen.done is not None
    return "".join(parts) or gen.done.text, gen.done


async def collect_all(gens: Sequence[Generation], record: UsageRecord
                      ) -> list[tuple[str, Done]]:
    """Every choice's text and end, in order; the record gets their merged usage.
    Raises `WorkerError` (the first failure)."""
    results = await asyncio.gather(*(collect(g, record) for g in gens))
    record.finish(merged([done for _, done in results]))
    return list(results)


async def first(gen: Generation) -> str | None:
    """The first chunk, or None if the generation ended without output. Raises
    `WorkerError` (so the client gets a proper status before the stream starts)."""
    try:
        return await anext(gen)
    except StopAsyncIteration:
        return None
    except BaseException:
        await gen.aclose()
        raise


async def close_all(gens: Sequence[Generation]) -> None:
    for gen in gens:
        await gen.aclose()


async def sse(gens: Sequence[Generation], firsts: Sequence[str | None], chunks: Chunks,
              include_usage: bool, ticket: Ticket | None = None,
              record: UsageRecord | None = None, params: dict[str, Any] | None = None
              ) -> AsyncIterator[bytes]:
    """The SSE body of `gens` (`firsts`: the chunk each has given already): each
    round takes one chunk of every choice still running, shaped as `params` ask
    (tool call deltas, logprobs: `ChoiceStream`). A failure mid-stream becomes an
    ``error`` event (the status line has gone already); a client that goes away
    cancels every generation. Its end settles `ticket`."""
    shapes = [ChoiceStream(chunks, params or {}, i) for i in range(len(gens))]
    try:
        for opening in chunks.opening(len(gens)):
            yield opening
        for i, text in enumerate(firsts):
            if text is not None:
                for out in _shaped(shapes[i], chunks, text, gens[i]):
                    yield out
        async for piece in _interleaved(gens, chunks, shapes):
            yield piece
        done = merged([g.done for g in gens if g.done is not None])
        if include_usage:
            yield chunks.usage(usage(done))
        yield DONE
    except WorkerError as e:
        yield event({"error": {"message": str(e), "type": "server_error", "param": None,
                               "code": e.code}})
    finally:
        ended = [g.done for g in gens if g.done is not None]
        if record is not None:
            if len(ended) == len(gens):
                record.finish(merged(ended))
            else:
                record.finish(None, sum(g.tokens for g in gens))
        if ticket is not None:
            await ticket.settle(charged(ticket, gens, None))
        await close_all(gens)


async def _interleaved(gens: Sequence[Generation], chunks: Chunks,
                       shapes: Sequence[ChoiceStream]) -> AsyncIterator[bytes]:
    """Round robin over the running choices; each one's end is what its shaping
    still held, then its closing chunk."""
    running = list(range(len(gens)))
    while running:
        for i in list(running):
            try:
                text = await anext(gens[i])
            except StopAsyncIteration:
                running.remove(i)
                for out in shapes[i].end():
                    yield out
                done = gens[i].done
                yield chunks.closing(shapes[i].finish(done.finish_reason) if done else None, i)
                continue
            for out in _shaped(shapes[i], chunks, text, gens[i]):
                yield out


def _shaped(shape: ChoiceStream, chunks: Chunks, text: str, gen: Generation) -> list[bytes]:
    """The chunks for `text` of choice ``shape.index``: plain ones unless tools or
    logprobs shape them."""
    return [chunks.chunk(text, index=shape.index)] if shape.plain() else shape.events(text, gen)
