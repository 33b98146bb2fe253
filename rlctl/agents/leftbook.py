"""The names of the rollout units gone for good (lost, or retired after a drain) that the controller core keeps
(`CoreState.left`): what tells a late message of a unit gone from one the job never had (`known`), in a size that
does not grow with the units a run of weeks ever had.

    _forget_unit: a unit gone ──▶ add(name) ──▶ kept by name: the plan's, for good; the others, the latest LEFT_KEPT
                                               (older ones: counted only, `num_joined`)
    join of that name ──▶ discard(name): a new agent's now;   known(name) / _told_to_stop(name) ──▶ name in book
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

# the units gone kept by name beyond the plan's: a late message of one (a weights_applied, the bye of a unit retired
# after a drain, a report still in the inbox) comes within transport.unreachable_timeout_s of its going (then a unit
# that hears nothing leaves by itself: rlctl.agents.common), long before this many more units went (`GONE_KEPT`'s)
LEFT_KEPT = 1024


class LeftBook:
    """Names of units gone for good: every one of `pinned` (the plan's units, which the scaler tells from units not
    joined yet by this book for the whole run) and the latest `keep` of the others, in the order they went; those
    let go are counted (`total`)."""

    def __init__(self, *, keep: int = LEFT_KEPT, pinned: Collection[str] = ()) -> None:
        self.keep = keep
        self.pinned = frozenset(pinned)
        self._pinned_left: set[str] = set()
        self._named: dict[str, None] = {}  # the others, oldest first
        self.unlisted = 0  # names let go: gone, and no longer kept

    def add(self, name: str) -> None:
        if name in self.pinned:
            self._pinned_left.add(name)
            return
        self._named.pop(name, None)
        self._named[name] = None
        while len(self._named) > self.keep:
            del self._named[next(iter(self._named))]
            self.unlisted += 1

    def discard(self, name: str) -> None:
        """`name` is a new agent's (it joined): no longer a unit gone."""
        self._pinned_left.discard(name)
        self._named.pop(name, None)

    @property
    def total(self) -> int:
        """The units gone for good, those no longer kept by name among them."""
        return len(self) + self.unlisted

    def __contains__(self, name: object) -> bool:
        return name in self._named or name in self._pinned_left

    def __iter__(self) -> Iterator[str]:
        yield from self._pinned_left
        yield from self._named

    def __len__(self) -> int:
        """The names kept."""
        return len(self._pinned_left) + len(self._named)
