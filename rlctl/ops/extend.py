"""What a resume may change: its length (`rlctl launch --resume JOB --iterations N`) and where it continues from
(`--checkpoint V`, a roll-back).

`--iterations N`: the job continues from its latest complete checkpoint to N iterations in all — more than it had (a
finished job trains on), or fewer (a long job stopped early ends sooner).

    job.json: job.iterations = N, its digest with it (not a hand edit), the counts it had before in
              `iterations_before` ─▶ staged to every site at the start, as a resume stages job.json
    the checkpoints written under an earlier count (the last iteration of each) stay ones a resume may take
              (`checkpoint_versions(job, earlier=…)`)

N must be more than the iteration the resumed run starts from: the checkpoint it restores (`--checkpoint V`, else the
job's latest complete one as its events say; where they name none, as for a controller on another site whose record
is not fetched here, the iterations its metrics or summary say it trained). A count at or under it would leave nothing
to train, or take the job back to an older checkpoint unasked (a roll-back is `--checkpoint`'s); one between it and
the iterations trained is taken (those past the checkpoint are trained again either way). A count edited into
job.json by hand (said by the resume: its digest differs, `rlctl.ops.jobchanges`) is kept as N is: the resume's
launcher writes its digest, and the count it replaced, as that digest names it (`hand_edited_from`), into
`iterations_before`, so that count's last checkpoint stays one a resume may take. The rest of the job is the
job as launched: a changed job file is still a new job (`rlctl.ops.jobchanges`). A learning rate that decays ends its
decay at the new N, so its rate at the resumed step changes: said in the line the launch prints.

`--checkpoint V`: the resume continues from checkpoint V instead of the latest (a run whose reward collapsed after
V, taken back there, perhaps with a lower rate hand-set in its job.json). V must be one the job completed and no
resume set aside since (its events say which: `completed_checkpoints`); the launcher then verifies its parts on
their sites as for any resume (`rlctl.ops.resumepoint.pick_checkpoint(only=V)`), and the run's agents set every newer
checkpoint aside (`checkpoints/abandoned/`, where `rlctl pull` still finds them) and cut the metrics and sample log
back to V, as a resume past a damaged checkpoint does. With both, N counts from V.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from rlctl.checkpoint.choose import named_version
from rlctl.checkpoint.files import PRUNED
from rlctl.config.job import JobFile
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import JobDir, job_digests, job_field, launched_job
from rlctl.launch.recordfiles import replace_text
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.runstate import run_summary

EARLIER = "iterations_before"  # job.json: the job's iteration counts before each `--iterations` of a resume


def last_summary(jobdir: JobDir) -> dict[str, Any]:
    """The job's latest summary.json, {} where it has none (a running job) or one that does not read as an object and
    whose run's end its events do not say (`run_summary`: one they say is read from them, as a plain resume reads
    it)."""
    try:
        return run_summary(jobdir, None) or {}
    except (OSError, RlctlError):
        return {}


def trained_iterations(jobdir: JobDir) -> int:
    """How many iterations the job trained, as its metrics say, or its last run's summary where that says more (the
    metrics of a controller on another site not fetched here); 0 before its first. Its metrics' count is their last
    row's (`last_row`, read from the file's end): rows are appended in iteration order, and a resume cuts those
    past its checkpoint before it appends (`cut_metrics`), so the last is the latest; before, every row was parsed
    (10⁴ and more after weeks, at each `launch --resume`). A last row without a number for its iteration (edited) is
    passed over as before: every row is read then."""
    done: list[int] = []
    last = last_row(jobdir)
    if last is not None and isinstance(last.get("iteration"), int):
        done.append(last["iteration"] + 1)
    elif last is not None:
        rows = jobdir.read_lines(jobdir.metrics)
        done = [r["iteration"] + 1 for r in rows if isinstance(r.get("iteration"), int)]
    summary = last_summary(jobdir)
    if isinstance(summary.get("iterations"), int):
        done.append(summary["iterations"])
    return max(done, default=0)


def last_row(jd: JobDir) -> dict[str, Any] | None:
    """The last row of the job's metrics.jsonl (None when it has none), read from its end (`last_lines`): a status
    of an ended job parsed every row to show the last (10⁴ of them after weeks, at each poll of `status -w`). A last
    line that does not parse yet is passed over, as `read_lines` passes it (its writer may be in the middle of it);
    anything else (a line before it that is no JSON object, a file of blank lines) is read as `read_lines` reads the
    whole file, with its error naming the file and the line."""
    got = LocalFiles().last_lines(str(jd.metrics), 2)
    if got is None:
        return None
    complete, pending, _ = got
    lines = [line for line in (*complete, pending) if line.strip()][-2:]
    for i, line in enumerate(reversed(lines)):
        try:
            row = json.loads(line)
        except ValueError:
            if i == 0:
                continue  # the last line, being written
            break
        if isinstance(row, dict):
            return row
        break
    rows = jd.read_lines(jd.metrics)
    return rows[-1] if rows else None


def earlier_iterations(jobdir: JobDir) -> list[int]:
    """The iteration counts the job had before a resume set another (`EARLIER` in job.json), oldest first."""
    try:
        data = json.loads(jobdir.job_json.read_text())
    except (OSError, ValueError):
        return []
    found = data.get(EARLIER) if isinstance(data, dict) else None
    return [n for n in found if isinstance(n, int) and n > 0] if isinstance(found, list) else []


def completed_checkpoints(jobdir: JobDir) -> list[int]:
    """The checkpoints the job completed, as its events say, less those a resume set aside since and those
    `checkpoint.keep` let go (`rlctl.checkpoint.files.prune`); oldest first. Those let go are the ones its controller
    said it pruned (`PRUNED`, with the keep in force then: its checkpoint events say it), not the ones the keep in
    job.json would let go now: a keep lowered since (to free a full disk) prunes nothing until the next checkpoint
    completes, and the older ones still on disk stay ones a resume may take. The events of an rlctl that said none
    (no keep in its checkpoint events) are read with the keep job.json has."""
    held: set[int] = set()
    said = False  # its controller says what it prunes
    for e in jobdir.read_events("checkpoint", "resumed_from", PRUNED):
        if e.get("event") == "checkpoint" and isinstance(e.get("version"), int):
            held.add(e["version"])
            said = isinstance(e.get("keep"), int)
        elif e.get("event") == "resumed_from":
            held -= {v for v in e.get("set_aside") or () if isinstance(v, int)}
        elif e.get("event") == PRUNED:
            held -= {v for v in e.get("versions") or () if isinstance(v, int)}
    keep = 0 if said else jobdir.read_job().checkpoint.keep
    return sorted(held)[-keep:] if keep > 0 else sorted(held)


def rollback_to(jobdir: JobDir, named: str) -> int:
    """The checkpoint `--checkpoint NAMED` (`20`, `v20`) continues the job from; UsageError, listing the ones it
    can, when the job never completed it or a resume set it aside."""
    version = named_version(named)
    held = completed_checkpoints(jobdir)
    has = f"this job has {', '.join(f'v{v}' for v in held)}" if held else "this job completed none"
    if version is None:
        raise UsageError(f"--checkpoint {named!r}: a checkpoint's version, e.g. 20 or v20; {has}")
    if version not in held:
        raise UsageError(f"--checkpoint {named}: no such complete checkpoint; {has}")
    return version


def with_iterations(
    jobdir: JobDir, iterations: int, *, since: int | None = None, ref: str | None = None
) -> tuple[JobFile, str | None]:
    """The job (its job.json) with `iterations` as its count, and the line that says what changes (None when it is
    the count already). UsageError when the resumed run would start at or past that count (`since`: a roll-back's
    checkpoint; else `resume_start`), or a bound refuses the count. `ref`: how a command names the job (its id, or
    its directory when the index lacks it)."""
    spec = jobdir.read_job()
    before = spec.iterations
    if iterations == before:
        return spec, None
    trained = trained_iterations(jobdir)
    start = since if since is not None else resume_start(jobdir, trained=trained)
    if start == trained:
        start_text = f"{trained} trained"
        why = f"job {jobdir.id} trained {trained} iterations already"
    else:  # its metrics say more (or less) than the checkpoint it continues from: both, or the count looks wrong
        at = f"v{start} (--checkpoint)" if since is not None else f"its latest complete checkpoint v{start}"
        start_text = f"checkpoint v{start} ({trained} trained)"
        why = f"job {jobdir.id} trained {trained} iterations, and the resume continues from {at}"
    if iterations <= start:
        # (a roll-back's hint keeps its --checkpoint: without it the resume continues from the latest checkpoint)
        back = "" if since is None else f" --checkpoint {since}"
        raise UsageError(
            f"--iterations {iterations}: {why}; the count is the job's total, so more than {start}",
            hint=f"e.g. `rlctl launch --resume {shlex.quote(ref or jobdir.id)}{back} --iterations "
            f"{max(before, trained) * 2}`",
        )
    eta = spec.pipeline.staleness
    if eta is not None and eta > iterations:  # as `load_job` bounds it
        _refuse_staleness_edit(jobdir, eta, iterations)
        raise UsageError(
            f"--iterations {iterations}: fewer than the job's pipeline.staleness {eta}; use at least {eta}"
        )
    spec = spec.model_copy(update={"iterations": iterations})  # (the CLI bounds it ≥ 1, as the job file's)
    return spec, f"iterations {before} → {iterations} (--iterations), from {start_text}" + _lr_note(spec, before)


def _refuse_staleness_edit(jobdir: JobDir, staleness: int, iterations: int) -> None:
    """UsageError, one line naming job.json's pipeline.staleness, where `staleness` (past `iterations`) is an edit of
    it since the launch and the launch's (job.json's whole record of the job as launched) fits the count: the edit is
    what the count is refused for, versus the line blaming `--iterations` alone. Nothing where no record tells."""
    was = job_field(launched_job(jobdir.read_json(jobdir.job_json)) or {}, "pipeline")
    if not isinstance(was, dict) or was.get("staleness") == staleness:
        return
    before = was.get("staleness")
    if before is not None and before > iterations:
        return  # (the launch's is past the count too: the count's own line)
    raise UsageError(
        f"{jobdir.job_json}: job.pipeline.staleness was edited since the launch ({json.dumps(before)} → {staleness}), "
        f"past --iterations {iterations}: a staleness is at most the job's iterations",
        hint=f"put job.pipeline.staleness back to {json.dumps(before)} in job.json, or use --iterations {staleness} or "
        "more",
    )


def resume_start(jobdir: JobDir, *, trained: int) -> int:
    """The iteration a resume of the job (from its latest complete checkpoint) starts from: that checkpoint, as its
    events say; where they name none, `trained` (its metrics' or summary's count: the events of a controller on
    another site may not be fetched here, and a count under what it trained is not taken on a guess)."""
    held = completed_checkpoints(jobdir)
    return held[-1] if held else trained


def write_iterations(jobdir: JobDir, iterations: int) -> str | None:
    """Make `iterations` the count in the job's job.json (by its launcher, once no run of it is left): its digest
    with it (not a hand edit), the count before kept in `EARLIER` — and before it, the count a hand edit replaced
    (`hand_edited_from`), as the resume of a job whose count was edited by hand writes it (`iterations` its count;
    its digest with it where the count it replaced is none the job's record names, which then has no place in
    `EARLIER`: else each resume said the edit again). Returns job.json's text before (put back with
    `replace_job_json` when the run's start is refused), None when it wrote nothing."""
    text = jobdir.job_json.read_text()
    data: dict[str, Any] = json.loads(text)
    before = int(data["job"]["iterations"])
    edited_from = hand_edited_from(jobdir, data)
    digests = data.get("job_sha256")
    sealed = isinstance(digests, dict) and digests.get("iterations") == job_digests(data["job"])["iterations"]
    if iterations == before and edited_from is None and (sealed or not isinstance(digests, dict)):
        return None
    data["job"] = {**data["job"], "iterations": iterations}
    if isinstance(data.get("job_sha256"), dict):  # (a job.json of an rlctl that kept none: one digest alone would
        # name every other field as edited by hand)
        data["job_sha256"] = {**data["job_sha256"], "iterations": job_digests(data["job"])["iterations"]}
    counts = [n for n in (edited_from, before) if n is not None and n != iterations]
    data[EARLIER] = [*earlier_iterations(jobdir), *dict.fromkeys(counts)]
    replace_job_json(jobdir, json.dumps(data, indent=2) + "\n")
    return text


def replace_job_json(jobdir: JobDir, text: str) -> None:
    """job.json as `text` (replaced at once: an agent or a command reading it meanwhile reads one or the other)."""
    replace_text(jobdir.job_json, text)


def hand_edited_from(jobdir: JobDir, data: dict[str, Any]) -> int | None:
    """The count job.json (`data`) had before its `iterations` was edited by hand: the one its digest was taken of
    (at the launch, or by `write_iterations`), found among the counts the job's record names (its checkpoints'
    versions, its last run's planned count, its job file's); None when the count is the digest's, or none of those
    is (a count whose last checkpoint the job never completed: nothing of it to offer a resume)."""
    digests, job = data.get("job_sha256"), data.get("job")
    if not isinstance(digests, dict) or not isinstance(job, dict) or not isinstance(job.get("iterations"), int):
        return None
    sealed = digests.get("iterations")
    if sealed is None or sealed == job_digests({"iterations": job["iterations"]})["iterations"]:
        return None
    named = [e.get("version") for e in jobdir.read_events("checkpoint")]
    named.append(last_summary(jobdir).get("iterations_planned"))
    source = data.get("source_file")
    mapping = source.get("job") if isinstance(source, dict) else None
    named.append(mapping.get("iterations") if isinstance(mapping, dict) else None)
    counts = {n for n in named if isinstance(n, int) and not isinstance(n, bool) and n > 0}
    return next((n for n in sorted(counts) if job_digests({"iterations": n})["iterations"] == sealed), None)


def _lr_note(spec: JobFile, before: int) -> str:
    """What the new count does to a decaying learning rate: its decay ends at the new count (the rate of the steps
    still to take changes with it); "" for a constant rate."""
    policy = spec.algorithm
    decay = getattr(policy, "lr_decay", "constant")
    if decay == "constant":
        return ""
    return f"; lr_decay {decay} now ends at iteration {spec.iterations} (it ended at {before})"
