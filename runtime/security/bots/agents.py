"""The known AI agents, crawlers and automation tools, kept as data (agents.toml).

A User-Agent is matched against every entry's pattern in one regular expression,
so the first listed entry whose pattern occurs at the leftmost place wins.
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
        for i, a in enumerate(self.agents):
            try:
                re.compile(a.pattern)
            except re.error as e:
                raise InvalidConfig(file, f"bad pattern {a.pattern!r}: {e}",
                                    f"agent[{i}].pattern") from None
        alternatives = "|".join(f"(?P<a{i}>{a.pattern})" for i, a in enumerate(self.agents))
        self._regex = re.compile(alternatives or "(?!)", re.IGNORECASE)

    def match(self, user_agent: str) -> Agent | None:
        """The agent `user_agent` names, or None."""
        m = self._regex.search(user_agent)
        if m is None or m.lastgroup is None:
            return None
        return self.agents[int(m.lastgroup[1:])]


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
