"""StaleFlow's virtual staleness buffers (seed 004 §4), per prompt group: which iteration trains each group.

Buffer b holds the groups trained at iteration b (the trainer trains iteration b with the weights of version b),
`capacity` of them (the iteration's prompts). A group is

    reserved   from its first dispatch until all its samples are generated and scored: it has a deadline, the
               last buffer it may be trained in (the oldest version its samples were dispatched at, + η; never
               past the job's last iteration)
    occupied   once every sample is in: it sits in one buffer, and goes to the trainer; it moves only forward,
               into the current buffer, to fill an entry no reservation needs any more (`fill_forward`: a
               reservation due there was released or aborted)
    consumed   with its buffer, when the trainer commits that iteration

    dispatch ─reserve(deadline)─▶ reserved ──complete(oldest version)──▶ occupied in the earliest buffer that
                 (refused: no room) │                                   keeps every reservation feasible
                                    └──▶ nowhere within its bound: aborted, its samples are generated again

One invariant, checked by `reserve` and kept by `occupy` (Hall's condition for deadlines): for every buffer k,
the reserved groups due by k fit in the entries of buffers consumed … k that no occupied group holds. It is
StaleFlow's worst-case Reserve and greedy Occupy with entry movement, written as what they guarantee: every
reserved group can still be trained within the bound, and a group that completes takes the earliest entry that
keeps that true. So the groups that finish first fill the trainer's current buffer, and a slow group — a long
generation, a reward that hangs — moves to a later buffer as far as its bound allows instead of holding the
trainer. A buffer whose entries are all occupied is ready; one whose last entries are reserved by groups due
there is stuck until they complete or are aborted (`ControllerCore.unstick`; with η = 0 every iteration is
exactly its own groups, as before).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StalenessBuffers:
    capacity: int  # groups per buffer (the iteration's prompts)
    eta: int
    last: int  # the job's last iteration: no buffer beyond it
    consumed: int = 0  # the buffer the trainer trains now (= its version); the ones before are gone
    deadline: dict[str, int] = field(default_factory=dict)  # reserved group → the last buffer it may land in
    where: dict[str, int] = field(default_factory=dict)  # occupied group → its buffer
    occupied: dict[int, list[str]] = field(default_factory=dict)  # buffer → its groups, in occupy order
    # deadline → how many reserved groups have it, kept with `deadline`: the feasibility checks read these (η + 1
    # counts at most), versus every reserved group's deadline at each new group's dispatch and each completion
    _due: Counter[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._due = Counter(self.deadline.values())

    def due(self, version: int) -> int:
        """The last buffer a group generated with weights `version` may be trained in."""
        return min(version + self.eta, self.last)

    def free(self, b: int) -> int:
        return self.capacity - len(self.occupied.get(b, ()))

    def _feasible(self, counts: Counter[int]) -> bool:
        """Hall's condition for reservations due as `counts` says (deadline → how many): for every k, those due by k
        fit in the free entries of consumed … k."""
        due_at = [d for d, n in counts.items() if n > 0]
        if any(d < self.consumed for d in due_at):
            return False
        due = room = 0
        for k in range(self.consumed, max(due_at, default=self.consumed) + 1):
            due += counts.get(k, 0)
            room += self.free(k)
            if due > room:
                return False
        return True

    def _set_deadline(self, group: str, due: int | None) -> None:
        """`group`'s reservation is now due at `due` (None: it has none; a group reserved again keeps its place in
        `deadline`'s order, which `ControllerCore.unstick` walks), its count moved with it."""
        old = self.deadline.get(group)
        if old is not None:
            self._due[old] -= 1
            if not self._due[old]:
                del self._due[old]
        if due is None:
            self.deadline.pop(group, None)
        else:
            self.deadline[group] = due
            self._due[due] += 1

    def may_reserve(self, group: str, version: int) -> bool:
        """May a sample of `group` be generated with weights `version` (its deadline then at most `due(version)`)?"""
        new = self.due(version)
        old = self.deadline.get(group)
        if old is not None and old <= new:
            return True
        counts = self._due.copy()  # every other reservation's, and this one's at `new`
        if old is not None:
            counts[old] -= 1
        counts[new] += 1
        return self._feasible(counts)

    def reserve(self, group: str, version: int) -> None:
        """A sample of `group` is dispatched to a unit at `version` (`may_reserve` said yes)."""
        assert group not in self.where, f"group {group} is occupied already"
        new = self.due(version)
        self._set_deadline(group, min(self.deadline.get(group, new), new))

    def release(self, group: str) -> None:
        """The group gives its reservation back (nothing of it is in flight or done: its next dispatch reserves
        anew), or is aborted."""
        self._set_deadline(group, None)

    def occupy(self, group: str, oldest: int) -> int | None:
        """Every sample of `group` is generated and scored, the oldest with weights `oldest`: the buffer it now
        occupies (the earliest that keeps the other reservations feasible), or None when no buffer within its
        bound has room (the group is aborted: its reservation is released)."""
        self._set_deadline(group, None)
        for b in range(self.consumed, self.due(oldest) + 1):
            if self.free(b) <= 0:
                continue
            self.occupied.setdefault(b, []).append(group)
            if self._feasible(self._due):
                self.where[group] = b
                return b
            self.occupied[b].pop()
        return None

    def fill_forward(self) -> list[tuple[str, int]]:
        """The current buffer has entries no reservation needs (a reservation due there was released or aborted):
        occupied groups of the earliest later buffers move in, as long as every reservation stays feasible
        (StaleFlow: "occupied entries from later buffers can be moved forward to fill the empty slot"). The moved
        groups and the buffers they left."""
        b, moved = self.consumed, []
        while not self.ready(b):
            later = sorted(k for k, gs in self.occupied.items() if k > b and gs)
            if not later:
                break
            frm = later[0]
            group = self.occupied[frm].pop(0)
            self.occupied.setdefault(b, []).append(group)
            if not self._feasible(self._due):
                self.occupied[b].pop()
                self.occupied[frm].insert(0, group)
                break
            self.where[group] = b
            moved.append((group, frm))
        return moved

    def ready(self, b: int) -> bool:
        return self.free(b) == 0

    def consume(self) -> list[str]:
        """The trainer committed the current buffer (it was ready): its groups, and the next buffer is current."""
        b = self.consumed
        assert self.ready(b), f"buffer {b} is not ready: {self.free(b)} free"
        out = self.occupied.pop(b, [])
        for g in out:
            del self.where[g]
        self.consumed = b + 1
        return out
