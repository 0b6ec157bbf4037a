"""The bot manager's parts: which client is calling and what it may do.

    agents.py      the list of known AI agents, crawlers and tools (agents.toml)
    classify.py    a request's class from its User-Agent and headers (cached per UA)
    webbotauth.py  Web Bot Auth: RFC 9421 signatures checked against key directories
    seen.py        a bounded set of recently seen values (replayed signatures, used nonces)
    pow.py         the proof-of-work challenge: issue, check, solve
    manager.py     `BotManager`: all of the above and the per-class policy

The pipeline's ``bots`` stage (`runtime.pipeline.stages.bots`) is the only caller.
"""
