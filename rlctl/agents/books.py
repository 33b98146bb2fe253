"""The controller's bounded books: what a run whose units come and go for weeks keeps of the units and agents gone and
of its scale events — the latest few by name, every one counted — versus one entry per unit, agent or event the job
ever had. One rule (`keep`: the scaler's first samples, failed starts and units given up on follow it too), one
book over it (`Book`), three of them:

    Book.add(name, value) ──▶ kept by name, the newest last ──▶ beyond `keep`, the oldest let go (counted: `let_go`)
    LeftBook  the names of the rollout units gone for good (`CoreState.left`): the plan's pinned, the latest LEFT_KEPT
    GoneBook  the agents gone once their `Peer` left (`ControllerAgent._prune`): counted per end state and role,
              the latest GONE_KEPT by name
    ScaleLog  the scale events (`UnitStarts._scale_event`): counted per direction, the latest SCALE_EVENTS_KEPT listed
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# the units gone kept by name beyond the plan's: a late message of one (a weights_applied, the bye of a unit retired
# after a drain, a report still in the inbox) comes within transport.unreachable_timeout_s of its going (then a unit
# that hears nothing leaves by itself: rlctl.agents.common), long before this many more units went (GONE_KEPT's)
LEFT_KEPT = 1024
# the gone agents kept by name: a lost unit that says hello again is refused by name, and it only does so within
# transport.unreachable_timeout_s of its loss (then it leaves by itself: rlctl.agents.common), long before this many
# more agents went; summary.json lists these by name, the others by count
GONE_KEPT = 1024
# the scale events listed: the status reply shows the last 10; summary.json the rest of these (a run that added or
# removed more units than this says how many it left out, and counts every one per direction)
SCALE_EVENTS_KEPT = 256


def keep(latest: dict[K, V], name: K, value: V, *, kept: int) -> int:
    """`latest[name] = value`, the newest, and the oldest entries dropped beyond `kept`; how many were dropped."""
    latest.pop(name, None)
    latest[name] = value
    dropped = 0
    while len(latest) > kept:
        del latest[next(iter(latest))]
        dropped += 1
    return dropped


class Book(Generic[K, V]):
    """The latest `keep` entries by name, oldest first (a name added again is the newest); those let go beyond `keep`
    are counted (`let_go`)."""

    def __init__(self, *, keep: int) -> None:
        self.keep = keep
        self.named: dict[K, V] = {}
        self.let_go = 0  # entries no longer kept: beyond `keep`, the oldest

    def add(self, name: K, value: V) -> None:
        self.let_go += keep(self.named, name, value, kept=self.keep)

    def pop(self, name: K) -> V | None:
        """The entry of `name`, no longer kept (nor counted as let go); None where none is kept."""
        return self.named.pop(name, None)

    def __len__(self) -> int:
        """The entries kept."""
        return len(self.named)


class LeftBook(Book[str, None]):
    """Names of units gone for good (`CoreState.left`): what tells a late message of a unit gone from one the job never
    had (`known`). Every one of `pinned` (the plan's units, which the scaler pins: it tells them from units not joined
    yet by this book for the whole run) and the latest `keep` of the others, in the order they went; those let go are
    counted (`total`).

        _forget_unit: a unit gone ──▶ add(name) ──▶ kept by name: the plan's, for good; the others, the latest keep
                                                   (older ones: counted only, `num_joined`)
        join of that name ──▶ discard(name): a new agent's now;   known(name) / _told_to_stop(name) ──▶ name in book
    """

    def __init__(self, *, keep: int = LEFT_KEPT, pinned: Collection[str] = ()) -> None:
        super().__init__(keep=keep)
        self.pinned = frozenset(pinned)
        self._pinned_left: set[str] = set()

    def pin(self, names: Iterable[str]) -> None:
        """Keep each of `names` by name for good once gone (`UnitStarts`: the plan's units), from before any went."""
        assert not self, "units are pinned before any is gone"
        self.pinned = frozenset(names)

    def add(self, name: str, value: None = None) -> None:
        if name in self.pinned:
            self._pinned_left.add(name)
        else:
            super().add(name, None)

    def discard(self, name: str) -> None:
        """`name` is a new agent's (it joined): no longer a unit gone."""
        self._pinned_left.discard(name)
        self.pop(name)

    @property
    def total(self) -> int:
        """The units gone for good, those no longer kept by name among them."""
        return len(self) + self.let_go

    def __contains__(self, name: object) -> bool:
        return name in self.named or name in self._pinned_left

    def __iter__(self) -> Iterator[str]:
        yield from self._pinned_left
        yield from self.named

    def __len__(self) -> int:
        """The names kept."""
        return len(self._pinned_left) + len(self.named)


@dataclass(frozen=True, slots=True)
class GoneAgent:
    """What the controller keeps of an agent gone (lost or stopped) once the metrics row after it went is written
    and its record left `peers` (`ControllerAgent._prune`): how it ended, for the status reply's counts and for a lost
    unit that says hello again, and its role and last busy seconds for summary.json."""

    role: str
    state: str  # stopped | lost
    busy_s: float


class GoneBook(Book[str, GoneAgent]):
    """The agents gone before the last metrics row, once their `Peer` left: what the status reply, summary.json and a
    lost unit that says hello again need of them. Counted per end state and per role (busy seconds summed), every
    one; the latest `keep` by name (in the order they went).

        _prune: an agent gone ──▶ add(name, GoneAgent) ──▶ counted (end state; role's busy seconds) ──▶ kept by name,
                                                           the latest keep (older ones: still counted, no name)
        _hello of that name ──▶ get(name): a lost unit is told to stop;  a new agent of it ──▶ taken(name): unlisted,
                                                                           a lost one still counted, a stopped one not
    """

    def __init__(self, *, keep: int = GONE_KEPT) -> None:
        super().__init__(keep=keep)
        self.ended: Counter[str] = Counter()  # end state → agents
        self.agents: Counter[str] = Counter()  # role → agents
        self.busy_s: dict[str, float] = {}  # role → their busy seconds, summed

    def add(self, name: str, agent: GoneAgent) -> None:
        self.pop(name)
        self._count(agent, 1)
        super().add(name, agent)  # (one let go: counted still)

    def get(self, name: str) -> GoneAgent | None:
        return self.named.get(name)

    def pop(self, name: str) -> GoneAgent | None:
        """The gone one of `name` is no longer listed nor counted (one of the latest)."""
        agent = super().pop(name)
        if agent is not None:
            self._count(agent, -1)
        return agent

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


class ScaleLog(Book[int, dict[str, Any]]):
    """The scale events a run keeps for the status reply and summary.json (dicts with a `direction`: out | in): every
    one counted per direction, the latest `keep` listed in order (by their number in the run), so that a run whose
    units come and go for weeks neither holds every event it had nor writes them all into each summary.

        Scaler._scale_event ──▶ append(event) ──▶ counted (`totals`) ──▶ listed, the latest `keep` (older: counted only)
        a resumed run ──▶ ScaleLog(the scale events of the job's history it continues)
        status: latest(10);  summary.json: scale_events (listed), scale_events_unlisted, scale_totals
    """

    def __init__(self, events: Iterable[dict[str, Any]] = (), *, keep: int = SCALE_EVENTS_KEPT) -> None:
        super().__init__(keep=keep)
        self.totals: Counter[str] = Counter()  # direction → events
        for e in events:
            self.append(e)

    def append(self, event: dict[str, Any]) -> None:
        self.totals[str(event.get("direction", ""))] += 1
        self.add(len(self) + self.let_go, event)

    def latest(self, n: int | None = None) -> list[dict[str, Any]]:
        """The latest `n` listed (None: every one listed), oldest first."""
        listed = list(self.named.values())
        return listed if n is None else listed[-n:] if n > 0 else []

    def unlisted(self) -> int:
        """The events counted that are no longer listed."""
        return self.let_go

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.named.values())
