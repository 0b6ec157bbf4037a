"""What the upstream engine forwards of a request's structured-output, tool and
sampling fields, and how it brings back an upstream's ``tool_calls`` and
``logprobs``: calls as the tool-call markup every engine writes
(`gpu_worker.protocol.TOOL_CALL_OPEN`), so the API reads them one way.
"""

from __future__ import annotations

from typing import Any

from ..protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Generate, TokenLogprob


def forwarded(req: Generate) -> dict[str, Any]:
    """The OpenAI body fields for `req`'s shaping (only those it sets)."""
    out: dict[str, Any] = {}
    for name in ("response_format", "tools", "tool_choice"):
        if getattr(req, name) is not None:
            out[name] = getattr(req, name)
    if req.tools and not req.parallel_tool_calls:
        out["parallel_tool_calls"] = False
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            out[name] = getattr(req, name)
    if req.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in req.logit_bias.items()}
    if req.logprobs is not None:
        out |= ({"logprobs": True, "top_logprobs": req.logprobs} if req.messages is not None
                else {"logprobs": req.logprobs})
    return out


class CallText:
    """An upstream's ``tool_calls`` (streamed deltas, or a whole message's list) as
    markup text."""

    def __init__(self) -> None:
        self.open = False  # a call's arguments are being written
        self.started = False  # a call was written (the next one follows a newline)

    def feed(self, calls: Any) -> str:
        """The text for these call entries; a new name starts a new call."""
        text = ""
        for call in calls if isinstance(calls, list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                continue
            if isinstance(fn.get("name"), str) and fn["name"]:
                text += self.close() + ("\n" if text or self.started else "")
                text += f'{TOOL_CALL_OPEN}{{"name": "{fn["name"]}", "arguments": '
                self.open = self.started = True
            if self.open and isinstance(fn.get("arguments"), str):
                text += fn["arguments"]
        return text

    def close(self) -> str:
        """The end of the open call, if one is open."""
        if not self.open:
            return ""
        self.open = False
        return "}" + TOOL_CALL_CLOSE


def token_logprobs(choice: dict[str, Any]) -> list[TokenLogprob]:
    """A chat choice's ``logprobs.content`` (or a completion's token lists) as
    `TokenLogprob`s; entries it cannot read are left out."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):
        return [TokenLogprob(_bytes(e), float(e["logprob"]), [
            (_bytes(a), float(a["logprob"])) for a in e.get("top_logprobs") or []])
                for e in lp["content"] if isinstance(e, dict) and "logprob" in e]
    tokens, values = lp.get("tokens") or [], lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or [{}] * len(tokens)
    return [TokenLogprob(t.encode(), float(v), [(k.encode(), float(x)) for k, x in top.items()])
            for t, v, top in zip(tokens, values, tops, strict=False)]


def _bytes(entry: dict[str, Any]) -> bytes:
    raw = entry.get("bytes")
    return bytes(raw) if isinstance(raw, list) else str(entry.get("token", "")).encode()
