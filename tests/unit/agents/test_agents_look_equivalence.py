"""The controller's per-unit reads, made cheap (the ledger's book of each unit's samples, a donor measured only where
its work may be split, a busy receiver passed over), decide as the scans they replaced: a migration look asks the
same withdraws, and a dispatch share weighs each unit alike, as the walks over every sample in flight did. Random
states of a core (units joined late, lost, idle or over their batch, partial outputs, finished lengths, priced
sites, moves pending) are compared with those scans, written out here."""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable

from rlctl.agents import migration
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import Entry


def _core(rng: random.Random) -> ControllerCore:
    prompts, group = rng.randint(2, 6), rng.randint(1, 4)

    def make(it: int) -> list[PromptSpec]:
        return [PromptSpec(f"p{it}-{j}", [1] * rng.randint(1, 9), true_len=rng.randint(1, 60)) for j in range(prompts)]

    cfg = CoreConfig(
        iterations=3,
        prompts_per_iteration=prompts,
        samples_per_prompt=group,
        max_new_tokens=64,
        mode="async",
        eta=1,
        dispatch=rng.choice(["skew_aware", "random"]),
        min_units=1,
        unit_batch=rng.randint(1, 5),
    )
    # a clock that stands still: the core's own looks (a join's, the first pump's) are the same for a seed on any
    # machine, versus the machine's clock (a pump 0.2 s after the last look looked too: the random states, and how
    # many of the test's looks asked withdraws, followed the machine's speed; a seed did not replay its failure)
    return ControllerCore(
        cfg, prompts=make, predict=lambda specs: [float(s.true_len) for s in specs], clock=lambda: 0.0
    )


def _old_residual(core: ControllerCore) -> Callable[[int], float] | None:
    if not core.finished_lengths:
        return None
    lengths = sorted(core.finished_lengths)
    cap = core.cfg.max_new_tokens

    def left(n: int) -> float:
        i = bisect.bisect_right(lengths, n)
        return sum(lengths[i:]) / (len(lengths) - i) - n if i < len(lengths) else max(cap - n, 1)

    return left


def _old_loads(core: ControllerCore) -> list[migration.Load]:
    """Every unit's load as the look built it: every sample in flight, grouped by its agent, each read."""
    running: dict[str, list[Entry]] = {}
    for e in core.ledger.all_running():
        running.setdefault(str(e.agent), []).append(e)
    residual, barred, loads = _old_residual(core), core.isolating(), []
    for u in core.live_units:
        if u.name in barred:
            continue
        mine = running.get(u.name, [])
        done = [len(core.ledger.partials.parts.get(e.sample_id, ())) for e in mine]
        steps = sum(residual(n) for n in done) / len(mine) if mine and residual is not None else None
        prefill = sum(len(core.prompts[e.prompt_id].tokens) + n for e, n in zip(mine, done, strict=True))
        cost = core.unit_costs.get(u.name)
        loads.append(migration.Load(u.name, u.version, len(mine), cost, steps, prefill / max(len(mine), 1)))
    return loads


def _old_plan(
    loads: list[migration.Load], pending: dict[str, tuple[str, int]], batch: int
) -> list[tuple[str, str, int]]:
    """`migration.plan` as it was: every unit a receiver walks every unit for a donor."""
    held = {u.name: u.held for u in loads}
    for donor, (to, n) in pending.items():
        if donor in held and to in held:
            held[donor], held[to] = held[donor] - n, held[to] + n
    busy = set(pending) | {to for to, _ in pending.values()}
    moves = []
    for r in sorted(loads, key=lambda u: held[u.name]):
        room = batch - held[r.name]
        donors = [d for d in loads if d.name != r.name and d.name not in busy and d.version <= r.version]
        d = max(donors, key=lambda u: held[u.name], default=None)
        if room <= 0 or d is None:
            continue
        if held[d.name] > batch:
            n = min(held[d.name] - batch, room)
        elif held[r.name] == 0 and held[d.name] >= 2:
            n = held[d.name] // 2
            if not migration.split_pays(d, r, held[d.name], n):
                continue
        else:
            continue
        busy.add(d.name)
        held[d.name], held[r.name] = held[d.name] - n, held[r.name] + n
        moves.append((d.name, r.name, n))
    return moves


def _old_held(core: ControllerCore, names: list[str]) -> list[float]:
    """What `_assign` balanced: a walk over every sample in flight."""
    held = dict.fromkeys(names, 0.0)
    for e in core.ledger.all_running():
        if e.agent in held:
            held[e.agent] += 1.0 if core.cfg.dispatch == "random" else core._tokens(e)
    return [held[n] for n in names]


def _step(core: ControllerCore, rng: random.Random, joined: list[str], outs: list[Out]) -> None:
    """One random event: a unit joins, is lost or applies newer weights, a sample finishes, a running one reports
    output."""
    running = list(core.ledger.all_running())
    kind = rng.choice(["join", "finish", "finish", "partial", "partial", "lost", "weights", "join"])
    if kind == "join" or not joined:
        name = f"r{len(joined)}"
        joined.append(name)
        outs += core.join(name, role="rollout", version=0)
    elif kind == "lost" and len(core.live_units) > 1:
        outs += core.lost(rng.choice([u.name for u in core.live_units]))
    elif kind == "finish" and running:
        e = rng.choice(running)
        outs += core.sample(
            str(e.agent),
            sample_id=e.sample_id,
            version=0,
            output_tokens=rng.randint(1, 64),
            payload=None,
            reward=rng.random(),
        )
    elif kind == "weights":  # a unit holds newer weights: it gives work to no older one
        u = rng.choice(core.live_units)
        outs += core.weights_applied(u.name, min(u.version + 1, 2))
    elif kind == "partial" and running:
        e = rng.choice(running)
        have = len(core.ledger.partials.parts.get(e.sample_id, ()))
        n = rng.randint(1, 20)
        core.ledger.partials.extend(e.sample_id, have, [7] * n, [-1.0] * n, [0] * n)


def test_the_look_and_the_share_decide_as_the_scans_they_replaced() -> None:
    moves = sum(_compare(seed) for seed in range(80))
    assert moves >= 40  # looks that asked withdraws, not empty plans only


def _compare(seed: int) -> int:
    """Random events on a core, its look and share compared with the scans after each: how many looks moved work."""
    rng = random.Random(seed)
    core = _core(rng)
    outs: list[Out] = list(core.join("trainer-0", role="trainer", version=0))
    joined: list[str] = []
    compared = 0
    for _ in range(60):
        _step(core, rng, joined, outs)
        for u in core.live_units:  # priced sites, some not: split_pays weighs the running figures, or says yes
            if u.name not in core.unit_costs and rng.random() < 0.7:
                ptl = tuple(sorted(rng.uniform(0.005, 0.05) for _ in range(rng.randint(1, 8))))
                core.unit_costs[u.name] = migration.Cost(ptl, rng.choice([0.0, 1e-4, 1e-3, 3e-3, 1e-2]))
        names = [u.name for u in core.live_units]
        assert [core._held_tokens(n) for n in names] == _old_held(core, names), seed
        expected = _old_plan(_old_loads(core), dict(core.withdrawing), core.cfg.unit_batch)
        asked = [(o.to, o.header["count"]) for o in core._migrate() if o.kind == "withdraw"]
        assert asked == [(d, n) for d, _, n in expected], seed
        compared += bool(asked)
        if rng.random() < 0.5:  # the donors answer at once: what they gave back goes to their receivers
            for donor in list(core.withdrawing):
                mine = core.ledger.running(donor)[: core.withdrawing[donor][1]]
                parts = [(e.sample_id, [7], [-1.0], [0]) for e in mine]
                outs += core.withdrawn(donor, parts)
    return compared


def _count_estimates(core: ControllerCore) -> dict[str, int]:
    """Counts, from now on, `core`'s remaining-steps estimates built and donors measured."""
    calls = {"built": 0, "measured": 0}
    residual, figures = core._residual, core._running_figures

    def built() -> Callable[[int], float] | None:
        calls["built"] += 1
        return residual()

    def measured(unit: str, left: Callable[[int], float] | None) -> tuple[float | None, float]:
        calls["measured"] += 1
        return figures(unit, left)

    core._residual = built  # type: ignore[method-assign]
    core._running_figures = measured  # type: ignore[method-assign]
    return calls


def test_a_look_builds_the_remaining_steps_estimate_only_when_it_measures_a_donor() -> None:
    """The remaining-steps estimate (`_residual`: the last finished lengths sorted, their tail sums) is built at a
    look's first measured donor and once, versus at every look, most of which measure none (a fifth of a look's CPU
    at 64 units); what the looks ask stays the scans' (test above)."""
    looks = measuring = 0
    for seed in range(40):
        rng = random.Random(seed)
        core = _core(rng)
        calls = _count_estimates(core)
        outs: list[Out] = list(core.join("trainer-0", role="trainer", version=0))
        joined: list[str] = []
        for _ in range(60):
            _step(core, rng, joined, outs)
            before = dict(calls)
            core._migrate()
            donors = calls["measured"] - before["measured"]
            assert calls["built"] - before["built"] == (donors > 0), seed
            looks += 1
            measuring += donors > 0
            for donor in list(core.withdrawing):  # the donors answer at once
                mine = core.ledger.running(donor)[: core.withdrawing[donor][1]]
                outs += core.withdrawn(donor, [(e.sample_id, [7], [-1.0], [0]) for e in mine])
    assert 0 < measuring < looks
