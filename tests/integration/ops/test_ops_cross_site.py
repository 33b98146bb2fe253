"""One job across two sites, operated from other terminals: the trainer and the controller are SLURM
jobs on the localhost cluster (partition `sitea`), the rollout units run detached on the SSH site —
a host in its own network namespace with its own sshd, reached over a veth link shaped with tc tbf
(tests/services/netsite.sh), so samples, control messages and weights all cross the shaped link.
`status` reads the live controller, `scale +1` adds a unit on the SSH site that produces samples,
`stop` leaves nothing running on either site.

The SSH site shares no filesystem with the operator: its sshd runs in a private mount namespace with
empty /tmp and /root (netsite.sh), so the operator's job dir (under /tmp/pytest-*) does not exist there
and the units read only what `launch` staged to the site's work root (also invisible from here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from rlctl.launch.jobdir import JobDir
from tests.integration.netsite import link_bytes, on_site, site_workdir, ssh_scheduler

from .conftest import events, job_yaml, metrics_rows, processes_mentioning, rlctl, rlctl_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def cross_site_inventory(services: dict[str, str], path: Path, workdir: Path) -> Path:
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {
            "train": {
                "datacenter": "dc-a",
                "gpu": "CPU",
                "scheduler": {
                    "kind": "slurm",
                    "partition": "sitea",
                    "slurm_conf": services["RLCTL_TEST_SLURM_CONF"],
                    "time_limit_min": 15,
                },
                "nodes": [{"host": "sitea-[1-2]", "gpus": 2}],
                # the root namespace's end of the shaped link: what the site-b host can reach
                "network": {"bandwidth_gbps": 10, "listen_host": services["RLCTL_TEST_NETSITE_GATEWAY"]},
            },
            "gen": {
                "datacenter": "dc-b",
                "gpu": "CPU",
                "scheduler": ssh_scheduler(services, str(workdir)),
                "python": sys.executable,
                "nodes": [{"host": services["RLCTL_TEST_NETSITE_HOST"], "gpus": 3}],
                "network": {"bandwidth_gbps": 10, "listen_host": "auto"},  # routes toward the controller
            },
        },
        "links": [
            {
                "between": ["train", "gen"],
                "bandwidth_gbps": int(services["RLCTL_TEST_NETSITE_RATE_MBIT"]) / 1000,
                "latency_ms": 1,
            }
        ],
    }
    path.write_text(yaml.safe_dump(inv))
    return path


# the trainer on the SLURM site, one rollout unit and the controller on the SSH site behind the shaped link
CONTROLLER_ON_GEN = {
    "trainer": {"site": "train", "gpus": 1},
    "rollout": [{"site": "gen", "gpus": 1}],
    "controller_site": "gen",
}


def squeue_names(services: dict[str, str]) -> list[str]:
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    out = subprocess.run(["squeue", "-h", "-o", "%j"], env=env, capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def weights_versions(applied: list[dict]) -> set[int]:
    return {int(e["version"]) for e in applied}


def in_netns(job_dir: Path, agent: str, netns: str) -> bool:
    """Whether the agent's process (the pid it said hello with) lives in network namespace `netns`."""
    pid = next(e["pid"] for e in events(job_dir) if e["event"] == "agent_joined" and e["agent"] == agent)
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{netns}").st_ino


def test_cross_site_job_status_scale_stop(services, tmp_path, launcher):
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(tmp_path / "xsite.yaml", inventory=[str(inv)], trainer="train", rollout="gen", iterations=5000)
    job_dir = tmp_path / "run"
    site_dir = f"{workdir}/jobs/run"

    # the site does not see the operator's filesystem (a hidden reliance on a shared path would fail below)
    assert on_site(services, f"test -e {tmp_path} || echo absent").stdout.strip() == "absent"
    marker = f"/tmp/rlctl-audit-{uuid.uuid4().hex[:8]}"
    assert on_site(services, f"touch {marker}").returncode == 0
    before = link_bytes(services)
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("two trained iterations", lambda: len(metrics_rows(job_dir)) >= 2, 180, alive=proc)
    netns = services["RLCTL_TEST_NETSITE_NETNS"]
    assert in_netns(job_dir, "rollout-0", netns) and not in_netns(job_dir, "trainer-0", netns)

    # staged to the site's work root, verified: same bytes as here, the secret 0600; invisible from here
    staged = json.loads((job_dir / "staged.json").read_text())
    assert staged["gen"]["roots"] == {services["RLCTL_TEST_NETSITE_HOST"]: site_dir}
    assert staged["train"]["roots"] == {"localhost": str(job_dir)}  # SLURM submitted from here: no copy
    listing = on_site(services, f"cd {site_dir} && stat -c '%a %n' secret && sha256sum job.json model/init/*")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == "600 secret", lines
    here = subprocess.run(
        f"cd {job_dir} && sha256sum job.json model/init/*", shell=True, capture_output=True, text=True, check=True
    )
    assert lines[1:] == here.stdout.splitlines()
    assert not Path(workdir).exists()
    started = [json.loads(line) for line in (job_dir / "agents.jsonl").read_text().splitlines()]
    assert {a["name"]: a["log"].startswith(site_dir) for a in started if a["site"] == "gen"} == {"rollout-0": True}

    code, st = rlctl_json("status", str(job_dir))
    assert code == 0 and st["source"] == "controller", st
    live = st["live"]
    assert live["state"] == "running" and live["iteration"] >= 2
    agents = {a["name"]: a for a in live["agents"]}
    assert agents["trainer-0"]["site"] == "train" and agents["rollout-0"]["site"] == "gen"
    assert all(a["state"] == "running" for a in agents.values())
    started = {e["agent"]: e["backend"] for e in events(job_dir) if e["event"] == "agent_started"}
    assert started == {"controller-0": "slurm", "trainer-0": "slurm", "rollout-0": "ssh"}
    assert {"rlctl-run-controller", "rlctl-run-trainer"} <= set(squeue_names(services))

    t0 = time.monotonic()
    code, sc = rlctl_json("scale", str(job_dir), "--rollout", "+1", "--timeout", "120", timeout_s=200)
    assert code == 0, sc
    assert sc["adding"] == ["rollout-1"] and sc["sites"] == ["gen"]
    first = sc["first_sample_s"]["rollout-1"]
    print(
        f"\nscale +1 on the SSH site: first sample {first:.2f} s after the request (CLI {time.monotonic() - t0:.2f} s)"
    )
    trained_by_new = lambda: any(  # noqa: E731
        "rollout-1" in r["agents"] and r["agents"]["rollout-1"]["busy_s"] > 0 for r in metrics_rows(job_dir)
    )
    wait_for("the new unit to work in a trained iteration", trained_by_new, 60, alive=proc)
    assert in_netns(job_dir, "rollout-1", netns)
    after = link_bytes(services)
    crossed = {k: after[k] - before[k] for k in after}
    versions = max(r["weight_version"] for r in metrics_rows(job_dir))
    print(f"over the shaped link ({services['RLCTL_TEST_NETSITE_RATE_MBIT']} Mbit/s): {crossed}, {versions} versions")
    # weights (≥ one full copy per unit) and dispatch go to the site; samples come back from it
    model_bytes = (job_dir / "model" / "init" / "model.safetensors").stat().st_size
    assert crossed["to_site"] > 2 * model_bytes and crossed["from_site"] > 10_000, crossed

    for agent in ("trainer/0", "rollout/0", "rollout/1"):  # SLURM: this job dir; SSH: read on the site
        shown = rlctl("logs", str(job_dir), agent, "-n", "100000")  # the whole log: its first line included
        assert shown.returncode == 0 and "starting on" in shown.stdout, (agent, shown.stderr)
    assert on_site(services, f"grep -c 'job {site_dir}' {site_dir}/logs/rollout-1.log").stdout.strip() == "1"

    code, stopped = rlctl_json("stop", str(job_dir), timeout_s=180)
    assert code == 0 and stopped["problems"] == [], stopped
    assert set(stopped["agents"]) == {"controller-0", "trainer-0", "rollout-0", "rollout-1"}
    proc.wait(timeout=60)
    wait_for("every agent process to be gone", lambda: not processes_mentioning(str(job_dir)), 30)
    wait_for("every agent process on the site to be gone", lambda: not processes_mentioning(site_dir), 30)
    alive = (  # every pidfile's process on the site, as the site sees it (a zombie is gone: this VM's pid 1
        # does not always reap orphans at once)
        f"for f in {site_dir}/run/*.pid; do p=$(grep -o '\"pid\": [0-9]*' $f | grep -o '[0-9]*$'); "
        's=$(ps -o stat= -p "$p" 2>/dev/null); [ -n "$s" ] && [ "${s#Z}" = "$s" ] && echo $f; done; true'
    )
    left = on_site(services, alive)
    assert left.returncode == 0 and left.stdout == "", left
    wait_for("the SLURM jobs to leave the queue", lambda: not any("rlctl-run" in n for n in squeue_names(services)), 60)
    summary = (job_dir / "summary.json").read_text()
    assert '"state": "stopped"' in summary

    code, after = rlctl_json("status", str(job_dir))  # the controller is gone: the schedulers answer
    assert code == 0 and after["source"] != "controller"
    assert {a["name"]: a["state"].split()[0] for a in after["agents"]} == dict.fromkeys(stopped["agents"], "exited")
    # nothing the job ran on the site wrote outside the site's work root in its private /tmp and /root (caches,
    # temporary files, a home-relative default would show here). Not the job's: the test site's own sshd log,
    # and the checkout the site runs rlctl from (visible there when it lives under /tmp: Python's bytecode cache)
    sshd, checkout = Path(services["RLCTL_TEST_NETSITE_KNOWN_HOSTS"]).parent, Path(__file__).resolve().parents[3]
    audit = (
        f"find /tmp /root -newer {marker} -not -type d -not -path '{workdir}/*' -not -path '{sshd}/*' "
        f"-not -path '{checkout}/*'"
    )
    stray = on_site(services, f"{audit}; rm -f {marker}")
    assert stray.returncode == 0 and stray.stdout == "", stray.stdout[:2000]


def test_scale_waits_for_a_new_unit_of_a_controller_that_keeps_its_job_dir_in_the_slurm_sites_workdir(
    services, tmp_path, launcher
):
    """The SLURM site keeps its jobs under a workdir of its own (the test above's shares the operator's job dir):
    the controller writes its events there, and `scale +1` (with its --wait) learns of the new unit's first sample
    from the controller. Before, it read the operator's events.jsonl, which has no `first_sample` until the job's
    record is fetched at its end, and failed after --timeout: `rollout-1 produced no sample within 120 s`."""
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(site_workdir()))
    sites = yaml.safe_load(inv.read_text())
    sites["sites"]["train"]["scheduler"]["workdir"] = str(tmp_path / "train-work")
    inv.write_text(yaml.safe_dump(sites))
    job = job_yaml(tmp_path / "farctl.yaml", inventory=[str(inv)], trainer="train", rollout="gen", iterations=5000)
    job_dir = tmp_path / "run"
    there = tmp_path / "train-work" / "jobs" / "run"  # the controller's job dir: on this machine, not the operator's
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("two trained iterations there", lambda: len(metrics_rows(there)) >= 2, 180, alive=proc)

    code, sc = rlctl_json("scale", str(job_dir), "--rollout", "+1", "--timeout", "120", timeout_s=200)
    assert code == 0, sc
    assert sc["adding"] == ["rollout-1"] and list(sc["first_sample_s"]) == ["rollout-1"], sc
    recorded = [e["seconds_since_scale"] for e in events(there) if e["event"] == "first_sample"]
    assert recorded == [sc["first_sample_s"]["rollout-1"]], recorded
    code, stopped = rlctl_json("stop", str(job_dir), timeout_s=180)
    assert code == 0 and stopped["problems"] == [], stopped
    proc.wait(timeout=60)


@pytest.mark.parametrize("sync", ["full", "delta"])
def test_one_copy_of_each_version_crosses_the_shaped_link(services, tmp_path, sync):
    """Three rollout units behind the shaped link: per version one unit pulls from the trainer, the others
    from relays on their side; the link's byte counter sees one copy per version (plus headers and the
    job's other traffic), and every unit ends on the trainer's last version."""
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(site_workdir()))
    iterations = 8
    job = job_yaml(
        tmp_path / f"onecopy-{sync}.yaml",
        inventory=[str(inv)],
        trainer="train",
        rollout="gen",
        rollout_gpus=3,
        iterations=iterations,
        weight_sync={"mode": sync},
    )
    job_dir = tmp_path / "run"
    before = link_bytes(services)
    proc = rlctl("launch", str(job), "--job-dir", str(job_dir), "-o", "json", timeout_s=360)
    after = link_bytes(services)
    assert proc.returncode == 0, proc.stderr[-3000:]
    units = {"rollout-0", "rollout-1", "rollout-2"}
    applied = [e for e in events(job_dir) if e["event"] == "weights_applied"]
    assert {e["agent"] for e in applied} == units
    # every unit ends on the trainer's last version (applied only once verified)
    assert {u: max(e["version"] for e in applied if e["agent"] == u) for u in units} == dict.fromkeys(units, iterations)
    # a delta names the version it applied onto, one the unit's weight node held: the one before, or an older
    # one when versions were published while it was busy (holders keep a few), at least the one its engine
    # last applied (a version fetched while the engine was busy is dropped for a newer one); the whole
    # weights go to a unit with nothing to apply a delta onto (its first version), or whose holder has no
    # delta against its base
    held = dict.fromkeys(units, 0)
    for e in applied:
        if e["encoding"] == "delta":
            assert sync == "delta" and max(1, held[e["agent"]]) <= (e["base"] or 0) < e["version"], e
        else:
            assert e["encoding"] == "full" and e["base"] is None, e
        held[e["agent"]] = e["version"]
    if sync == "delta":  # and most versions travel as deltas
        later = [e["encoding"] for e in applied if e["version"] > 1]
        assert later.count("delta") > len(later) / 2, applied
    # the pulls: every version a unit's weight node fetched, applied or overtaken by a newer one before its engine's
    # safe point (`weights_skipped`: its relay still served it to the others)
    fetched = [e for e in events(job_dir) if e["event"] in ("weights_applied", "weights_skipped")]
    one_copy, relayed = 0, 0
    for v in sorted({e["version"] for e in fetched}):
        pulls = [e for e in fetched if e["version"] == v]
        from_trainer = [e for e in pulls if e["source"].startswith("trainer")]
        assert len(from_trainer) == 1, (v, pulls)  # exactly one copy crossed for this version
        one_copy += from_trainer[0]["bytes"]
        relayed += sum(1 for e in pulls if e["source"] in units)
    # besides the weights: the job's files staged to the site once at launch (the initial model among them)
    staged = sum(f["bytes"] for f in json.loads((job_dir / "staged.json").read_text())["gen"]["files"])
    crossed = after["to_site"] - before["to_site"] - staged
    print(
        f"\n{sync}: {crossed:,} B crossed toward the site (besides {staged:,} B staged) for {one_copy:,} B of "
        f"weights (one copy per version): {crossed / one_copy:.3f}x; {relayed} pulls from relays in dc-b"
    )
    assert relayed > 0
    # the job's other traffic toward the site (requests, members, announcements, pings) is ≈ 210 KB for these 8
    # iterations whatever the weights: a run whose policy learned nothing sends deltas of 90 B (one full version,
    # 1.38 MB, in all), where 1.10 × the weights alone would not cover it; a second copy of a full version would
    # still be over
    allowance = 40_000 * iterations
    assert crossed <= 1.10 * one_copy + allowance, (crossed, one_copy, allowance)
    weights = json.loads((job_dir / "summary.json").read_text())["weights"]
    assert weights["inter_dc_total"]["dc-a->dc-b"] == {"bytes": one_copy, "copies": len(weights_versions(fetched))}


def test_dry_run_renders_sbatch_and_ssh_without_starting_anything(services, tmp_path):
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", tmp_path / "gen-workdir")
    job = job_yaml(tmp_path / "xsite.yaml", inventory=[str(inv)], trainer="train", rollout="gen", rollout_gpus=2)
    proc = rlctl("launch", str(job), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("#SBATCH") >= 2 and "--partition=sitea" in out  # controller + trainer jobs
    assert out.count("setsid nohup") == 2 and "ssh -p" in out  # two rollout units over SSH
    assert not (tmp_path / "run").exists()


def test_controller_on_the_ssh_site_keeps_the_record_there_and_launch_fetches_it(services, tmp_path):
    """`placement.controller_site` names the SSH site: the controller runs behind the shaped link, in the site's
    own filesystem view; the trainer (SLURM, this side) and the operator reach it across the link, and the
    job's record (summary, metrics, events) is fetched back to the operator's job dir when it ends."""
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(
        tmp_path / "remote-controller.yaml",
        inventory=[str(inv)],
        trainer="train",
        rollout="gen",
        iterations=4,
        placement=CONTROLLER_ON_GEN,
    )
    job_dir = tmp_path / "run"
    site_dir = f"{workdir}/jobs/run"
    proc = rlctl("launch", str(job), "--job-dir", str(job_dir), "-o", "json", timeout_s=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["iterations"] == 4 and out["ledger"]["trained"] == out["ledger"]["prompts"] > 0, out
    assert out["ledger"]["lost"] == 0 and out["ledger"]["duplicated"] == 0, out["ledger"]

    started = {e["agent"]: e["backend"] for e in events(job_dir) if e["event"] == "agent_started"}
    assert started == {"controller-0": "ssh", "trainer-0": "slurm", "rollout-0": "ssh"}, started
    # the record was written on the site and fetched: the same summary there and here
    there = on_site(services, f"cat {site_dir}/summary.json")
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout)["ledger"] == json.loads((job_dir / "summary.json").read_text())["ledger"]
    assert len(metrics_rows(job_dir)) == 4
    # the sample log too (by the bytes it grew, over SFTP): the same lines, each sample once
    log_there = on_site(services, f"cat {site_dir}/samples.jsonl")
    assert log_there.returncode == 0 and log_there.stdout == (job_dir / "samples.jsonl").read_text()
    ids = [json.loads(line)["sample_id"] for line in log_there.stdout.splitlines()]
    assert 0 < len(ids) == len(set(ids)) <= out["ledger"]["samples"], (len(ids), out["ledger"])
    joined = {e["agent"] for e in events(job_dir) if e["event"] == "agent_joined"}
    assert joined == {"trainer-0", "rollout-0"}, joined
    # it listened on the site's end of the shaped link (`auto` routed toward the other site's listen_host)
    listening = [e["address"] for e in events(job_dir) if e["event"] == "controller_listening"]
    assert listening == [f"tcp://{services['RLCTL_TEST_NETSITE_HOST']}:{listening[0].rsplit(':', 1)[1]}"], listening

    code, st = rlctl_json("status", str(job_dir))  # ended: answered from the fetched record
    assert code == 0 and st["source"] != "controller", st
    shown = rlctl("logs", str(job_dir), "controller/0")  # the controller's log is read on its site
    assert shown.returncode == 0 and shown.stdout.strip(), shown.stderr
    assert not Path(workdir).exists()


class SshDown:
    """The site's sshd unreachable: every connection to its port 22 reset, the open ones at their next packet and
    each new one at once (a login host whose sshd restarts, a firewall that resets sessions); the job's own traffic
    (its RPC ports) still flows."""

    TABLE = "rlctl_sshdown"

    def __init__(self, services: dict[str, str]) -> None:
        self.netns = services["RLCTL_TEST_NETSITE_NETNS"]

    def _nft(self, script: str) -> subprocess.CompletedProcess[str]:
        argv = ["nsenter", f"--net=/run/netns/{self.netns}", "nft", "-f", "-"]
        return subprocess.run(argv, input=script, text=True, capture_output=True, timeout=30)

    def down(self) -> None:
        rules = "  type filter hook input priority -300; policy accept;\n"
        rules += '  iifname "eth0" tcp dport 22 reject with tcp reset\n'
        res = self._nft(f"table inet {self.TABLE} {{\n chain input {{\n{rules} }}\n}}\n")
        assert res.returncode == 0, res.stderr

    def up(self) -> None:
        self._nft(f"delete table inet {self.TABLE}\n")


def test_the_launcher_rides_out_an_ssh_outage_to_the_controllers_site(services, tmp_path):
    """The controller's site refuses the operator's SSH for 10 s while the job runs: `launch` cannot poll the
    controller meanwhile; it says so once, keeps watching, and the job, whose own traffic still flows, ends with the
    launcher attached and its record fetched. Before, the first failed poll ended the launcher's wait, and its
    `finally` stopped every agent it could reach."""
    if shutil.which("nft") is None or subprocess.run(["nft", "list", "tables"], capture_output=True).returncode != 0:
        pytest.skip("nft is not available here")
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(tmp_path / "sshcut.yaml", inventory=[str(inv)], trainer="train", rollout="gen", iterations=30,
                   placement=CONTROLLER_ON_GEN)  # fmt: skip
    job_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "rlctl", "launch", str(job), "--job-dir", str(job_dir), "-o", "json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cut = SshDown(services)
    try:

        def trained() -> int:
            if not (job_dir / "controller.json").exists():
                return 0
            p = rlctl("status", str(job_dir), "-o", "json")
            return int(json.loads(p.stdout).get("live", {}).get("iteration") or 0) if p.returncode == 0 else 0

        wait_for("two trained iterations", lambda: trained() >= 2, 240, alive=proc)
        cut.down()
        time.sleep(10)  # polls refused at once: a second apart until one fails, then UNREACHABLE_POLL_S (5 s) apart
        assert proc.poll() is None, proc.communicate()[1][-3000:]  # still watching
        cut.up()
        out, err = proc.communicate(timeout=300)
    finally:
        cut.up()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["state"] == "done" and summary["iterations"] == 30, summary
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0, summary["ledger"]
    assert "cannot reach site gen to watch controller-0" in err, err[-3000:]
    assert json.loads((job_dir / "summary.json").read_text())["ledger"] == summary["ledger"]  # fetched after it


def test_a_job_whose_controller_runs_on_the_ssh_site_is_attached_after_its_launcher_died(services, tmp_path):
    """`rlctl attach` takes over a job whose launcher was SIGKILLed: with the controller on the SSH site it polls
    the controller there and fetches the job's record from there at the end, as the launch would have."""
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(tmp_path / "orphan.yaml", inventory=[str(inv)], trainer="train", rollout="gen", iterations=20,
                   placement=CONTROLLER_ON_GEN)  # fmt: skip
    job_dir = tmp_path / "run"
    code, started = rlctl_json("launch", str(job), "--job-dir", str(job_dir), "--detach", timeout_s=300)
    assert code == 0, started
    os.kill(started["launcher_pid"], signal.SIGKILL)
    proc = rlctl("attach", str(job_dir), "-o", "json", timeout_s=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["state"] == "done" and summary["iterations"] == 20, summary
    assert summary["ledger"]["lost"] == 0 and summary["ledger"]["duplicated"] == 0, summary["ledger"]
    assert "job orphan: attached to controller-0" in proc.stderr, proc.stderr[-3000:]
    site_dir = f"{workdir}/jobs/run"
    there = on_site(services, f"cat {site_dir}/summary.json")  # written on the site, fetched by the attached launcher
    assert there.returncode == 0 and json.loads(there.stdout)["ledger"] == summary["ledger"], there.stderr
    log_there = on_site(services, f"cat {site_dir}/samples.jsonl")
    assert log_there.returncode == 0 and log_there.stdout == (job_dir / "samples.jsonl").read_text()
    code, rows = rlctl_json("status", "--all")
    assert next(r["state"] for r in rows if r["id"] == JobDir(job_dir).id) == "finished", rows


def test_a_launcher_stopped_with_ctrl_c_leaves_its_controller_on_the_ssh_site_stopped(services, tmp_path, launcher):
    """The launcher's own stop (Ctrl-C) SIGTERMs the controller on the SSH site: its launcher_stop event goes to the
    controller's own record there too, so the controller ends `stopped` itself. Before, only the operator's copy had
    it: the site's summary said `failed: controller got SIGTERM`, and every fetch of it (`rlctl status`) brought that
    back over the launcher's `stopped`."""
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(tmp_path / "interrupted.yaml", inventory=[str(inv)], trainer="train", rollout="gen",
                   iterations=5000, placement=CONTROLLER_ON_GEN)  # fmt: skip
    job_dir, site_dir = tmp_path / "run", f"{workdir}/jobs/run"
    proc = launcher(str(job), "--job-dir", str(job_dir))
    # the controller's metrics are on its site (fetched here at the end)
    trained = lambda: on_site(services, f"test -s {site_dir}/metrics.jsonl").returncode == 0  # noqa: E731
    wait_for("an iteration", trained, 240, alive=proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    there = on_site(services, f"cat {site_dir}/summary.json")
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout)["state"] == "stopped", (there.stdout[:300], err[-2000:])
    code, st = rlctl_json("status", str(job_dir))  # fetches the site's record again
    assert code == 0 and st["summary"]["state"] == "stopped", st
    assert not Path(workdir).exists()
