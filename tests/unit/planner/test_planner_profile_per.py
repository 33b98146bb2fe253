"""What a profile's training figure is per (`TrainingEntry.per`): a measured profile written before it was recorded
holds a figure per real token, its probe's padding in it, which the planner prices per real token (a cut's real
tokens over min(dp, rows) ranks, as it did then) with a warning naming the file, versus its padding priced twice;
today's probe writes `per: padded_token`, priced at a cut's busiest rank's padded tokens, as the roofline is."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.planner.costs import TrainWorkload, train_compute_s
from rlctl.profiler.analytical import analytical_profile
from rlctl.profiler.profile import ProfileFile, TrainingEntry, load_profile, save_profile
from tests.conftest import ROOT, CliResult

Cli = Callable[..., CliResult]

ROWS = (10.0,) * 7 + (100.0,)  # 4 rows a rank: at dp 2 rank 1's share pads to 4 × 100 (test_planner_step_cuts)
WORK = TrainWorkload(sum(ROWS), 8, 4, 0.0, row_tokens=ROWS)


def measured_file(path: Path, *, per: str | None) -> Path:
    """A measured profile of qwen2.5-7b on an H800 site, its training entries timed with torch, written as today's
    `rlctl profile` writes one (`per: padded_token`), or as one before it recorded `per` (None: no key)."""
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)})
    save_profile(prof.model_copy(update={"source": "measured"}), path)
    data = yaml.safe_load(path.read_text())
    for e in data["sites"]["h"]["training"]:
        e["backend"] = "torch"
        e.pop("per", None)
        if per is not None:
            e["per"] = per
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tp1(profile: ProfileFile) -> TrainingEntry:
    (e,) = [x for x in profile.sites["h"].training if (x.tp, x.pp) == (1, 1)]
    return e


def test_an_older_measured_profile_is_priced_per_real_token_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cut of 7 rows of 10 tokens and 1 of 100: today's figure (per padded token) prices its busiest rank's
    padded tokens, 400 at dp 2 and 440 at dp 1; an older one (per real token, the probe's padding in it) the cut's
    170 real tokens over min(dp, rows) ranks, 85 and 170, as before 2026-12-08, and one warning line names the file
    (read twice, as `rlctl check` reads it: said once)."""
    new = measured_file(tmp_path / "new.yaml", per="padded_token")
    old = measured_file(tmp_path / "old.yaml", per=None)
    with caplog.at_level(logging.WARNING):
        e_new = tp1(load_profile(new))
        assert not caplog.records
        e_old = tp1(load_profile(old))
        load_profile(old)
    assert (e_new.per, e_old.per) == ("padded_token", "real_token")
    assert e_new.gpu_s_per_token == e_old.gpu_s_per_token
    g = e_new.gpu_s_per_token
    assert train_compute_s(e_new, 2, WORK) == pytest.approx(400 * g)
    assert train_compute_s(e_new, 1, WORK) == pytest.approx(440 * g)
    assert train_compute_s(e_old, 2, WORK) == pytest.approx(85 * g)
    assert train_compute_s(e_old, 1, WORK) == pytest.approx(170 * g)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{old}: sites.h.training: gpu_s_per_token is per real token"), said
    assert "re-run rlctl profile" in said, said


def test_analytical_entries_are_per_computed_token_with_or_without_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A roofline entry's figure is FLOPs a token, which a padded token costs too: read per padded token whether the
    file (an older one) has `per` or not, and nothing said; today's files write the key on every entry."""
    path = tmp_path / "analytical.yaml"
    save_profile(analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)}), path)
    data = yaml.safe_load(path.read_text())
    assert {e["per"] for e in data["sites"]["h"]["training"]} == {"padded_token"}
    for e in data["sites"]["h"]["training"]:
        del e["per"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with caplog.at_level(logging.WARNING):
        e = tp1(load_profile(path))
    assert e.per == "padded_token" and not caplog.records
    assert train_compute_s(e, 2, WORK) == pytest.approx(400 * e.gpu_s_per_token)


def test_plan_and_check_say_one_warning_line_for_an_older_measured_profile(
    cli: Cli, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`rlctl plan` of the cross-DC job with an older measured profile: one warning naming the file, its fields and
    what to do, and a training stage priced shorter than the same figure per padded token (its probe's padding not
    twice); `rlctl check` of the job naming it (`planning.profile`, read more than once) says it once too."""
    out = tmp_path / "p.yaml"
    r = cli("profile", "--job", str(ROOT / "jobs/cross-dc-7b.yaml"), "--source", "analytical", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    data = yaml.safe_load(out.read_text())
    data["source"] = "measured"
    for site in data["sites"].values():
        for e in site["training"]:
            e["backend"], e["pipeline_wait_included"] = "megatron", False
            del e["per"]
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(yaml.safe_dump(data, sort_keys=False))
    for site in data["sites"].values():
        for e in site["training"]:
            e["per"] = "padded_token"
    new.write_text(yaml.safe_dump(data, sort_keys=False))

    def warnings() -> list[str]:
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        return said

    with caplog.at_level(logging.WARNING):
        r_old = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(old), "-o", "json")
        assert r_old.exit_code == 0, r_old.stderr
        (line,) = warnings()
        assert line.startswith(f"{old}: sites.h800.training, sites.h20.training: gpu_s_per_token is per real token")
        assert "re-run rlctl profile" in line, line
        r_new = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(new), "-o", "json")
        assert r_new.exit_code == 0 and not warnings(), r_new.stderr
        t_old, t_new = (json.loads(r.stdout)["predicted"]["t_train_s"] for r in (r_old, r_new))
        assert t_old < t_new, (t_old, t_new)

        again = tmp_path / "again.yaml"  # (a file not said yet in this process)
        again.write_text(old.read_text())
        job = tmp_path / "job.yaml"
        text = (ROOT / "jobs/cross-dc-7b.yaml").read_text().replace("../clusters", str(ROOT / "clusters"))
        job.write_text(text + f"planning: {{profile: {again}}}\n")
        r = cli("check", str(job))
        said = [w for w in warnings() if "gpu_s_per_token" in w]
        assert len(said) == 1 and said[0].startswith(f"{again}: sites.h800.training"), (said, r.stderr)
