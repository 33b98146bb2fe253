"""The controller's record of the agents gone (lost or stopped) before the last metrics row, once their `Peer` left
(`ControllerAgent._prune`): what the status reply, summary.json and a lost unit that says hello again need of them,
in a size that does not grow with the agents a run of weeks ever had.

    _prune: an agent gone ──▶ add(name, GoneAgent) ──▶ counted (end state; role's busy seconds) ──▶ kept by name,
                                                       the latest GONE_KEPT (older ones: still counted, no name)
    _hello of that name ──▶ get(name): a lost unit is told to stop;  a new agent of it ──▶ taken(name): unlisted,
                                                                       a lost one still counted, a stopped one not
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# the gone agents kept by name: a lost unit that says hello again is refused by name, and it only does so within
# transport.unreachable_timeout_s of its loss (then it leaves by itself: rlctl.agents.common), long before this many
# more agents went; summary.json lists these by name, the others by count
GONE_KEPT = 1024


@dataclass(frozen=True, slots=True)
class GoneAgent:
    """What the controller keeps of an agent gone (lost or stopped) once the metrics row after it went is written
    and its record left `peers` (`ControllerAgent._prune`): how it ended, for the status reply's counts and for a lost
    unit that says hello again, and its role and last busy seconds for summary.json."""

    role: str
    state: str  # stopped | lost
    busy_s: float


class GoneBook:
    """The agents gone: counted per end state and per role (busy seconds summed), every one; the latest `keep` by
    name (in the order they went)."""

    def __init__(self, *, keep: int = GONE_KEPT) -> None:
        self.keep = keep
        self.named: dict[str, GoneAgent] = {}
        self.ended: Counter[str] = Counter()  # end state → agents
        self.agents: Counter[str] = Counter()  # role → agents
        self.busy_s: dict[str, float] = {}  # role → their busy seconds, summed

    def add(self, name: str, agent: GoneAgent) -> None:
        self.pop(name)
        self.named[name] = agent
        self._count(agent, 1)
        while len(self.named) > self.keep:
            del self.named[next(iter(self.named))]  # counted still

    def get(self, name: str) -> GoneAgent | None:
        return self.named.get(name)

    def pop(self, name: str) -> None:
        """The gone one of `name` is no longer listed nor counted (one of the latest)."""
        agent = self.named.pop(name, None)
        if agent is not None:
            self._count(agent, -1)

    def taken(self, name: str, *, replaced: GoneAgent | None = None) -> None:
        """A new agent's hello took `name`: the gone one of that name is no longer listed by it. A lost one still
        counts (an agent the run lost, no longer named), a stopped one no longer does (its name joins again: the unit
        scaled in, scaled out). `replaced`: the record of that name in the controller's peers that the hello replaced
        (never pruned), counted here as gone the same way."""
        agent = self.named.pop(name, None)
        if agent is not None and agent.state != "lost":
            self._count(agent, -1)
        if replaced is not None and replaced.state == "lost":
            self._count(replaced, 1)

    def unlisted(self) -> int:
        """The agents counted that are no longer kept by name."""
        return sum(self.agents.values()) - len(self.named)

    def _count(self, a: GoneAgent, sign: int) -> None:
        self.ended[a.state] += sign
        self.agents[a.role] += sign
        self.busy_s[a.role] = self.busy_s.get(a.role, 0.0) + sign * a.busy_s
