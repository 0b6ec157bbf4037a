"""The known AI agents, crawlers and automation tools, kept as data (agents.toml).

A User-Agent is matched against each entry's pattern in turn, case-sensitively
(agents write their tokens one way; a pattern may start with ``(?i)``): the first
entry that matches wins. Separate searches of mostly literal patterns are about
fifteen times faster than one alternation of them all in ``re``.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct

from edgefn_core import tomlconf
from edgefn_core.errors import InvalidConfig

AgentKind = Literal["ai_agent", "ai_crawler", "search_crawler", "tool"]


class Agent(Struct, forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=100)]
    operator: Annotated[str, Meta(min_length=1, max_length=100)]
    pattern: Annotated[str, Meta(min_length=1, max_length=500)]
    kind: AgentKind


class AgentsFile(Struct, forbid_unknown_fields=True, frozen=True):
    agent: list[Agent]


class AgentList:
    """Known agents, matched by `match`."""

    def __init__(self, agents: list[Agent], file: str = "<agents>") -> None:
        """Raises `InvalidConfig` naming `file` when a pattern is not a valid regex."""
        self.agents = list(agents)
        self._patterns: list[tuple[re.Pattern[str], Agent]] = []
        for i, a in enumerate(self.agents):
            try:
                self._patterns.append((re.compile(a.pattern), a))
            except re.error as e:
                raise InvalidConfig(file, f"bad pattern {a.pattern!r}: {e}",
                                    f"agent[{i}].pattern") from None

    def match(self, user_agent: str) -> Agent | None:
        """The first agent whose pattern occurs in `user_agent`, or None."""
        for pattern, agent in self._patterns:
            if pattern.search(user_agent):
                return agent
        return None


def load(path: str | None = None) -> AgentList:
    """The agents in the TOML file `path` (default: the packaged agents.toml).
    Raises `InvalidConfig` naming the file and field."""
    if path is None:
        raw = resources.files(__package__).joinpath("agents.toml").read_bytes()
        label = "agents.toml (packaged)"
    else:
        label = path
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise InvalidConfig(path, f"cannot read: {e.strerror}", "bots.agents") from None
    return AgentList(tomlconf.decode(raw, AgentsFile, label).agent, label)
