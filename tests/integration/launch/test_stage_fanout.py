"""Staging a site of three hosts behind one shaped link (tests/services/netsite.sh: three sshds in the site's
network namespace, each with its own private /tmp): the large files cross the link once, to the first host,
and the other two fetch them from it as they land; without rlctl in the site's python the copies go straight
from here (three crossings) and the job is still staged."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.config.job import load_job
from rlctl.launch import stage, stagecopy, stagefanout
from rlctl.launch.jobdir import JobDir
from tests.integration.netsite import link_bytes, on_site, site_workdir, ssh_scheduler

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
MODEL_BYTES = 24 << 20
DATA_BYTES = 10 << 20


def site(services: dict[str, str], *, python: str = sys.executable, workdir: str | None = None) -> Site:
    return Site.model_validate(
        {
            "datacenter": "dc-b",
            "gpu": "CPU",
            "python": python,
            "nodes": [{"host": h, "gpus": 1} for h in services["RLCTL_TEST_NETSITE_HOSTS"].split(",")],
            "scheduler": ssh_scheduler(services, workdir or site_workdir()),  # default: in each host's private /tmp
        }
    )


def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job-1"
    (d / "model" / "init").mkdir(parents=True)
    (d / "data").mkdir()
    JobDir(d).write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="jobs/demo.yaml")  # as launch stages it
    fd = os.open(d / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    (d / "model" / "init" / "config.json").write_text("{}")
    (d / "model" / "init" / "model.safetensors").write_bytes(os.urandom(MODEL_BYTES))
    (d / "data" / "train.jsonl").write_bytes(os.urandom(DATA_BYTES))
    return d


def to_site_bytes(services: dict[str, str]) -> int:
    return link_bytes(services)["to_site"]


def sums_on(services: dict[str, str], host: str, root: str) -> dict[str, str]:
    """SHA-256 of every file under the host's site job dir, computed there (symlinks followed)."""
    res = on_site(services, f"cd {root} && find -L . -type f -printf '%P\\0' | xargs -0 sha256sum", host=host,
                  timeout_s=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return {line.split(None, 1)[1].strip(): line.split()[0] for line in res.stdout.splitlines()}


def local_sums(d: Path) -> dict[str, str]:
    return {n: stage.file_state(d / n).sha256 for n in stage.files_to_stage(d)}


def test_large_files_cross_the_link_once_and_fan_out_inside_the_site(services, tmp_path):
    s = site(services)
    src = job_dir(tmp_path)
    lines: list[str] = []
    before = to_site_bytes(services)
    progress = stagecopy.StagingProgress("gen", lines.append, interval_s=0.0)
    entry = stage.stage_site("gen", s, src, job_id="job-1", progress=progress)
    on_link = to_site_bytes(services) - before
    progress.done()

    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    assert entry["fanout"]["seed"] == hosts[0]
    assert entry["fanout"]["served_bytes"] == 2 * (MODEL_BYTES + DATA_BYTES)  # to each other host, once
    assert entry["fanout"]["direct"] == {} and entry["fanout"]["relays"] == []  # two hosts: both from the seed
    assert entry["copied"] == {h: 5 for h in hosts}
    for h in hosts:  # every host holds the job's bytes, checked there
        assert sums_on(services, h, entry["roots"][h]) == local_sums(src)
    # one copy across the link (the SSH/TCP headers on top), not three
    assert on_link < 1.08 * (MODEL_BYTES + DATA_BYTES)
    assert lines[-1].startswith("staging gen: ") and " copied in " in lines[-1]

    again = stage.stage_site("gen", s, src, job_id="job-1")  # nothing new: nothing copied, no fan-out
    assert again["copied"] == {h: 0 for h in hosts} and "fanout" not in again


def test_in_a_chain_each_host_relays_to_the_next_as_bytes_land(services, tmp_path, monkeypatch):
    monkeypatch.setattr(stagefanout, "FANOUT_CHILDREN", 1)  # seed → host 2 → host 3
    s = site(services)
    src = job_dir(tmp_path)
    before = to_site_bytes(services)
    entry = stage.stage_site("gen", s, src, job_id="job-1")
    on_link = to_site_bytes(services) - before
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    assert entry["fanout"]["relays"] == [hosts[1]] and entry["fanout"]["direct"] == {}
    once = MODEL_BYTES + DATA_BYTES
    assert entry["fanout"]["served_by"] == {hosts[0]: once, hosts[1]: once}  # the seed to host 2, host 2 to host 3
    for h in hosts:
        assert sums_on(services, h, entry["roots"][h]) == local_sums(src)
    assert on_link < 1.08 * (MODEL_BYTES + DATA_BYTES)


def test_a_changed_file_is_served_in_its_new_version_only(services, tmp_path, monkeypatch):
    """The data changed between two launches (same size): the seed and the relay hold the old version, which is
    removed before their servers start — no host fetches old bytes (no fetch fails, nothing copied from here)."""
    monkeypatch.setattr(stagefanout, "FANOUT_CHILDREN", 1)  # seed → host 2 → host 3: host 2 relays
    s = site(services)
    src = job_dir(tmp_path)
    stage.stage_site("gen", s, src, job_id="job-1")
    (src / "data" / "train.jsonl").write_bytes(os.urandom(DATA_BYTES))
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    copy = stagefanout.copy_files

    def late_seed_copy(site_name, src, v, names, want, progress):  # type: ignore[no-untyped-def]
        if v.host == hosts[0] and "data/train.jsonl" in names:
            time.sleep(3)  # the fetches ask before the new version starts to land on the seed
        copy(site_name, src, v, names, want, progress)

    monkeypatch.setattr(stagefanout, "copy_files", late_seed_copy)
    entry = stage.stage_site("gen", s, src, job_id="job-1")
    assert entry["copied"] == {h: 1 for h in hosts}
    assert entry["fanout"]["direct"] == {} and entry["fanout"]["served_by"] == {hosts[0]: DATA_BYTES,
                                                                                hosts[1]: DATA_BYTES}  # fmt: skip
    for h in hosts:
        assert sums_on(services, h, entry["roots"][h]) == local_sums(src)


def test_a_host_with_a_cut_short_fetch_goes_on_from_its_bytes(services, tmp_path):
    s = site(services)
    src = job_dir(tmp_path)
    first = stage.stage_site("gen", s, src, job_id="job-1")
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    data = f"{first['roots'][hosts[2]]}/data/train.jsonl"
    cut = f"head -c {DATA_BYTES // 2} {data} > {data}.part && rm {data}"  # a fetch stopped halfway
    assert on_site(services, cut, host=hosts[2]).returncode == 0
    entry = stage.stage_site("gen", s, src, job_id="job-1")
    assert entry["copied"] == {hosts[0]: 0, hosts[1]: 0, hosts[2]: 1}
    assert entry["fanout"]["served_bytes"] == DATA_BYTES - DATA_BYTES // 2
    assert sums_on(services, hosts[2], entry["roots"][hosts[2]]) == local_sums(src)


def test_without_rlctl_on_the_site_every_host_is_copied_from_here(services, tmp_path, caplog):
    bare = "/usr/bin/python3"  # the system's python: no rlctl, so no fan-out server
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a login shell on the site has it
    if subprocess.run([bare, "-c", "import rlctl"], capture_output=True, cwd="/", env=env).returncode == 0:
        pytest.skip(f"{bare} has rlctl")
    s = site(services, python=bare)
    src = job_dir(tmp_path)
    before = to_site_bytes(services)
    with caplog.at_level(logging.WARNING, logger="rlctl.launch.stagefanout"):
        entry = stage.stage_site("gen", s, src, job_id="job-1")
    on_link = to_site_bytes(services) - before
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    assert entry["fanout"]["served_bytes"] == 0 and entry["fanout"]["direct"] == {h: 2 for h in hosts[1:]}
    assert any("the fan-out server did not start" in r.message and "copying to each host from here" in r.message
               for r in caplog.records)  # fmt: skip
    for h in hosts:
        assert sums_on(services, h, entry["roots"][h]) == local_sums(src)
    assert on_link > 2.9 * (MODEL_BYTES + DATA_BYTES)


def test_a_cached_model_of_another_mode_keeps_its_files_on_every_host(services, tmp_path):
    """Another job with the same model, its weights 0600 here: the seed's copy in the work root's model directory
    (which the first job may be reading) was removed before the fan-out and every host's copied again. Now each
    host's file keeps its inode and gets the mode; only the job's own files are copied."""
    s = site(services)
    src = job_dir(tmp_path)
    first = stage.stage_site("gen", s, src, job_id="job-1")
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    weights = f"{first['model_cache']['dir']}/model.safetensors"

    def inode_and_mode(host: str) -> tuple[str, str]:
        res = on_site(services, f"stat -c '%i %a' {weights}", host=host)
        assert res.returncode == 0, res.stderr
        inode, mode = res.stdout.split()
        return inode, mode

    before = {h: inode_and_mode(h) for h in hosts}
    assert {mode for _, mode in before.values()} == {"644"}
    os.chmod(src / "model" / "init" / "model.safetensors", 0o600)
    second = stage.stage_site("gen", s, src, job_id="job-2")
    assert second["copied"] == {h: 3 for h in hosts}  # job.json, secret, the data: not the model
    assert {h: inode_and_mode(h) for h in hosts} == {h: (inode, "600") for h, (inode, _) in before.items()}


def test_hosts_that_share_a_work_root_are_staged_once(services, tmp_path, caplog):
    """The site's hosts share /var/tmp (as an NFS home would be), and the inventory does not say
    `shared_workdir`: the seed's copy and the other hosts' fetches wrote the same `.part`s and the staging failed
    (a file missing after the copy). Now they see the first host's mark: it alone is staged, once."""
    workdir = Path(f"/var/tmp/rlctl-shared-{uuid.uuid4().hex[:12]}")  # outside the hosts' private /tmp
    s = site(services, workdir=str(workdir))
    src = job_dir(tmp_path)
    hosts = services["RLCTL_TEST_NETSITE_HOSTS"].split(",")
    try:
        with caplog.at_level(logging.WARNING, logger="rlctl.launch.stage"):
            entry = stage.stage_site("gen", s, src, job_id="job-1")
        assert entry["copied"] == {hosts[0]: 5, hosts[1]: 0, hosts[2]: 0} and "fanout" not in entry
        assert entry["shared_with"] == {h: hosts[0] for h in hosts[1:]}
        assert any("hosts share a work root" in r.getMessage() for r in caplog.records)
        for h in hosts:
            assert sums_on(services, h, entry["roots"][h]) == local_sums(src)  # no mark left either
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
