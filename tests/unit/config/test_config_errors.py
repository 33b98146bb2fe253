"""Every kind of bad inventory / job gives exit 2 and one stderr line naming the file and the field."""

from __future__ import annotations

import errno
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlctl.config.base import MAX_WAIT_S, read_yaml
from rlctl.config.inventory import Network
from rlctl.config.job import load_job
from rlctl.config.runtime import Rollout, Transport
from tests.conftest import ROOT, run_cli

SITE = """\
  h20:
    datacenter: dc-b
    scheduler: {kind: ssh, user: rl}
    gpu: H20
    nodes: [{host: "h20-[01-04]", gpus: 8}]
"""
HEAD = "apiVersion: rlctl/v1\nkind: Inventory\n"
GOOD_INV = HEAD + "sites:\n" + SITE
OTHER_INV = (
    HEAD + "sites:\n  h800:\n    datacenter: a\n    scheduler: {kind: slurm, partition: p}\n    gpu: H800\n"
    "    nodes: [{host: n1, gpus: 8}]\n"
)
JOB = """\
apiVersion: rlctl/v1
kind: Job
name: j1
inventory: [inv.yaml]
model: {kind: builtin, name: qwen2.5-7b}
task: {kind: lengths}
placement:
  trainer: {site: h20, gpus: 8}
  rollout: [{site: h20, gpus: auto}]
"""


def site_with(old: str, new: str) -> str:
    assert old in GOOD_INV, old
    return GOOD_INV.replace(old, new)


@dataclass
class Case:
    name: str
    content: str | bytes | None  # None: the path is a directory / missing (see `kind`)
    field: str  # substring the error line must contain (the field path or what is wrong)
    kind: str = "inventory"  # inventory | job | dir | missing | two-files
    extra: str = ""  # for job cases: the inventory file; for two-files: the second file


CASES = [
    Case("empty file", "", "file is empty"),
    Case(  # it said "cannot read: 'utf-8' codec can't decode byte 0xe9 in position 13: invalid continuation byte"
        "not UTF-8 (an editor's Latin-1)",
        HEAD.encode() + "# r\u00e9sum\u00e9\n".encode("latin-1") + SITE.encode(),
        "cannot read: not UTF-8 text (byte 0xe9 at line 3, column 4); save it as UTF-8",
    ),
    Case(  # its column counted bytes: 'ü' and '→' (2 and 3 bytes) before the bad byte made column 10 of column 7
        "not UTF-8 after characters that are",
        HEAD.encode() + "# \u00fc\u2192 ".encode() + b"r\xe9sum\n" + SITE.encode(),
        "cannot read: not UTF-8 text (byte 0xe9 at line 3, column 7); save it as UTF-8",
    ),
    Case(  # it said 'YAML error: unacceptable character #x0000: special characters are not allowed\n  in
        # "<unicode string>", position 55': a character offset, and a line break written out as \n
        "a NUL byte",
        HEAD + "sites:\n" + SITE.replace("dc-b", "dc-b\x00"),
        "inv.yaml: cannot read: character U+0000 at line 5, column 21, which YAML does not take (a control character "
        "other than tab and line breaks, or a non-character); remove it",
    ),
    Case(  # a terminal's colour code pasted into a comment
        "an escape character",
        HEAD + "# \x1b[0m\nsites:\n" + SITE,
        "inv.yaml: cannot read: character U+001B at line 3, column 3, which YAML does not take",
    ),
    Case("only a comment", "# nothing\n", "file is empty"),
    Case("yaml syntax error", HEAD + "sites:\n  h20: {datacenter: x\n", "line "),
    Case("top level is a list", "- a\n- b\n", "top level must be a mapping"),
    Case("missing apiVersion", "kind: Inventory\nsites: {}\n", "apiVersion"),
    Case("wrong apiVersion", GOOD_INV.replace("rlctl/v1", "rlctl/v9"), "apiVersion"),
    Case(
        "misspelt kind",
        GOOD_INV.replace("kind: Inventory", "kind: Inventroy"),
        "kind: 'Inventroy' is no kind; valid: Inventory, Job, Profile (this command reads kind 'Inventory' or 'Job')",
    ),
    Case("another file's kind", GOOD_INV.replace("kind: Inventory", "kind: Profile"), "kind: must be 'Inventory'"),
    Case(  # check reads job files too: it said "(this command reads kind Inventory)"
        "job: misspelt kind",
        JOB.replace("kind: Job", "kind: Jobb"),
        "kind: 'Jobb' is no kind; valid: Inventory, Job, Profile (this command reads kind 'Inventory' or 'Job')",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # a lower-case kind got no word on its case
        "job: kind in lower case",
        JOB.replace("kind: Job", "kind: job"),
        "kind: 'job' is no kind (did you mean 'Job'? kinds are capitalised); valid: Inventory, Job, Profile",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it said "not a directory" of a path that is not there at all
        "job: model path not there",
        JOB.replace("{kind: builtin, name: qwen2.5-7b}", "{kind: hf, path: gone}"),
        "/gone: no such directory (a Hugging Face checkpoint directory is expected)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it said "model.path: config.json: cannot read: No such file or directory" (the job file's directory)
        "job: empty model path",
        JOB.replace("{kind: builtin, name: qwen2.5-7b}", '{kind: hf, path: ""}'),
        "model.path: the path is empty; give the Hugging Face checkpoint directory",
        kind="job",
        extra=GOOD_INV,
    ),
    Case("unknown top-level key", GOOD_INV + "linkz: []\n", "linkz: unknown key (did you mean 'links'?)"),
    Case(
        "unknown site key",
        site_with("    gpu: H20\n", "    gpu: H20\n    gpus_per_node: 8\n"),
        "sites.h20.gpus_per_node",
    ),
    Case("unknown GPU", site_with("gpu: H20", "gpu: H2O"), "sites.h20.gpu: unknown GPU 'H2O'"),
    Case("negative gpu count", site_with("gpus: 8", "gpus: -8"), "sites.h20.nodes[0].gpus"),
    Case("gpu count not a number", site_with("gpus: 8", "gpus: eight"), "sites.h20.nodes[0].gpus"),
    Case("missing nodes", site_with('    nodes: [{host: "h20-[01-04]", gpus: 8}]\n', ""), "sites.h20.nodes: required"),
    Case("empty nodes", site_with('[{host: "h20-[01-04]", gpus: 8}]', "[]"), "sites.h20.nodes"),
    Case("missing scheduler", site_with("    scheduler: {kind: ssh, user: rl}\n", ""), "sites.h20.scheduler: required"),
    Case("unknown scheduler kind", site_with("kind: ssh", "kind: pbs"), "sites.h20.scheduler: unknown kind 'pbs'"),
    Case(
        "scheduler without kind",
        site_with("{kind: ssh, user: rl}", "{user: rl}"),
        "sites.h20.scheduler: missing 'kind'; valid: local, slurm, ssh",
    ),
    Case(
        "slurm without partition", site_with("{kind: ssh, user: rl}", "{kind: slurm}"), "sites.h20.scheduler.partition"
    ),
    Case(  # accepted; fabric refused the user given twice (ssh_user) at connect: a traceback, not a line
        "submit host with a user",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, submit_host: rl@login, ssh_user: rl}"),
        "sites.h20.scheduler.submit_host: 'rl@login' is not a host name or address",
    ),
    Case(
        "submit host with a port",
        site_with("{kind: ssh, user: rl}", '{kind: slurm, partition: p, submit_host: "login:2222"}'),
        "sites.h20.scheduler.submit_host: 'login:2222' is not a host name or address",
    ),
    Case(  # accepted; launch quoted it, and made a directory named '~alice' in the SSH user's home
        "work root in another user's home",
        site_with("{kind: ssh, user: rl}", "{kind: ssh, user: rl, workdir: ~alice/rlctl}"),
        "sites.h20.scheduler.workdir: '~alice/rlctl': only a leading '~/' is expanded",
    ),
    Case(  # accepted; every agent's command line quoted it as one word: 'No such file or directory'
        "python with an argument",
        site_with("    gpu: H20\n", "    gpu: H20\n    python: /opt/rl/bin/python -u\n"),
        "sites.h20.python: '/opt/rl/bin/python -u': give the interpreter alone, without arguments",
    ),
    Case(  # accepted; fabric then looked up a bastion named 'b1,b2'
        "two jump hosts",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@b1,b2'}"),
        "sites.h20.scheduler.proxy_jump: several jump hosts; rlctl connects through one",
    ),
    Case(
        "jump host with a space",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@jump west'}"),
        "sites.h20.scheduler.proxy_jump: 'jump west' is not a host name or address",
    ),
    Case(  # accepted, and the bastion was looked up by the name 'bastion:' (jump_target took no port from it)
        "a proxy_jump with an empty port",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@bastion:'}"),
        "sites.h20.scheduler.proxy_jump: port '' is not 1-65535; give one jump host as [user@]host[:port]",
    ),
    Case(
        "a proxy_jump's IPv6 address with no closing bracket",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@[fd00::1:2222'}"),
        "sites.h20.scheduler.proxy_jump: '[fd00::1:2222': write an IPv6 address with a port as [address]:port, e.g. "
        "[fd00::1]:2222",
    ),
    Case(
        "a proxy_jump's IPv6 address with something but a port after it",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@[fd00::1]2222'}"),
        "sites.h20.scheduler.proxy_jump: '[fd00::1]2222': write an IPv6 address with a port as [address]:port",
    ),
    Case(
        "a proxy_jump's bracketed host that is no host",
        site_with("user: rl}", "user: rl, proxy_jump: 'rl@[a b]:22'}"),
        "sites.h20.scheduler.proxy_jump: 'a b' is not a host name or address",
    ),
    Case(
        "a proxy_jump with an empty user",
        site_with("user: rl}", "user: rl, proxy_jump: '@bastion'}"),
        "sites.h20.scheduler.proxy_jump: user '' is empty or has a space; give one jump host as [user@]host[:port]",
    ),
    Case(
        "a proxy_jump whose user has a space",
        site_with("user: rl}", "user: rl, proxy_jump: 'a b@bastion'}"),
        "sites.h20.scheduler.proxy_jump: user 'a b' is empty or has a space",
    ),
    Case(  # accepted (ssh -J's URI form), and the bastion was logged in to as user 'ssh://rl'
        "a proxy_jump written as an ssh URI",
        site_with("user: rl}", "user: rl, proxy_jump: 'ssh://rl@bastion:2222'}"),
        "sites.h20.scheduler.proxy_jump: 'ssh://rl@bastion:2222' is a URI; give one jump host as [user@]host[:port]",
    ),
    Case(  # accepted: launch --dry-run's ssh line read `-oProxyCommand=x@h20-01` as an option, and ran x
        "an ssh user starting with '-'",
        site_with("user: rl}", "user: -oProxyCommand=x}"),
        "sites.h20.scheduler.user: user '-oProxyCommand=x' starts with '-', as no login name does (ssh reads it as an "
        "option); e.g. rl",
    ),
    Case(  # the same on the submit host's ssh line
        "a submit host user starting with '-'",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, submit_host: login, ssh_user: -oX=y}"),
        "sites.h20.scheduler.ssh_user: user '-oX=y' starts with '-'",
    ),
    Case(  # accepted: the dry-run's ProxyCommand ssh read `-oProxyCommand=x@bastion` as an option
        "a proxy_jump whose user starts with '-'",
        site_with("user: rl}", "user: rl, proxy_jump: '-oProxyCommand=x@bastion'}"),
        "sites.h20.scheduler.proxy_jump: user '-oProxyCommand=x' starts with '-', as no login name does (ssh reads it "
        "as an option); give one jump host as [user@]host[:port]",
    ),
    Case(  # accepted: the ssh command line and fabric logged in as 'rl ' (proxy_jump's user was refused so)
        "an ssh user with a trailing space",
        site_with("user: rl}", "user: 'rl '}"),
        "sites.h20.scheduler.user: user 'rl ' is empty or has whitespace; give the login name alone",
    ),
    Case(  # accepted (PositiveInt), where the ssh scheduler's port is refused past 65535
        "a submit host port past 65535",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, submit_host: login, ssh_port: 70000}"),
        "sites.h20.scheduler.ssh_port: Input should be less than or equal to 65535",
    ),
    Case(  # accepted: a `gpu: CPU` site's jobs asked --gres=gpu:<its cores> and waited for them
        "a CPU site asking SLURM for GPUs",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, gpu_request: gres}").replace(
            "gpu: H20", "gpu: CPU"
        ),
        "sites.h20: scheduler.gpu_request: 'gres' asks SLURM for GPUs, and the site's gpu is CPU",
    ),
    Case(
        "an empty submit host user",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, submit_host: login, ssh_user: ''}"),
        "sites.h20.scheduler.ssh_user: user '' is empty or has whitespace",
    ),
    Case(  # accepted into every sbatch's --time
        "slurm time limit past a year",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, time_limit_min: 2880000}"),
        "sites.h20.scheduler.time_limit_min: Input should be less than or equal to 527040",
    ),
    Case(  # accepted, and read from the directory rlctl ran in: 'No such file' from any other
        "relative key file",
        site_with("user: rl}", "user: rl, key_file: keys/id_rl}"),
        "sites.h20.scheduler.key_file: 'keys/id_rl': give an absolute path or one under ~",
    ),
    Case(  # accepted: fabric loaded it as a private key and offered no agent's, 'Authentication failed' at launch
        "an ssh key file that is the public key",
        site_with("user: rl}", "user: rl, key_file: ~/.ssh/id_ed25519.pub}"),
        "sites.h20.scheduler.key_file: '~/.ssh/id_ed25519.pub' is the public half of a key pair; give the private "
        "key file ('~/.ssh/id_ed25519')",
    ),
    Case(
        "a SLURM submit host's key file that is the public key",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, submit_host: login, ssh_key_file: /k/id.pub}"),
        "sites.h20.scheduler.ssh_key_file: '/k/id.pub' is the public half of a key pair",
    ),
    Case(  # accepted, and every sbatch left --account out
        "empty slurm account",
        site_with("{kind: ssh, user: rl}", "{kind: slurm, partition: p, account: ''}"),
        "sites.h20.scheduler.account: String should have at least 1 character",
    ),
    Case("ssh port out of range", site_with("user: rl}", "user: rl, port: 70000}"), "sites.h20.scheduler.port"),
    Case(  # accepted as one core per slot: SLURM was asked for 8 cores a node of 2 lacks
        "fewer cores than GPUs",
        site_with("gpus: 8}", "gpus: 8, cpus: 2}"),
        "sites.h20.nodes[0]: cpus: 2 cores for 8 GPU slots",
    ),
    Case(  # accepted: agents started with CUDA_VISIBLE_DEVICES=1000000000 and found no GPU
        "device id past any host's GPUs",
        site_with("gpus: 8}", "gpus: 2, devices: [0, 1000000000]}"),
        "sites.h20.nodes[0].devices[1]: Input should be less than 1024 (got 1000000000)",
    ),
    Case("bad host range", site_with("h20-[01-04]", "h20-[04-01]"), "sites.h20.nodes[0].host"),
    Case(  # accepted (':' taken for an IPv6 address's); fabric then refused the port given twice
        "host with a port",
        site_with('"h20-[01-04]"', '"h20-01:2022"'),
        "sites.h20.nodes[0].host: 'h20-01:2022' is not a host name or address",
    ),
    Case(
        "gpu and gpu_spec both",
        site_with(
            "    gpu: H20\n", "    gpu: H20\n    gpu_spec: {name: X, bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1}\n"
        ),
        "exactly one of 'gpu'",
    ),
    Case(  # accepted: the plan priced the site's GPU-hours at cost_per_gpu_hour, the custom GPU's read by nothing
        "custom GPU price beside the site's",
        site_with(
            "    gpu: H20\n",
            "    gpu_spec: {name: X, bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1, cost_per_hour: 2.5}\n"
            "    cost_per_gpu_hour: 1.5\n",
        ),
        "sites.h20: gpu_spec.cost_per_hour: 2.5 is read only where the site sets no cost_per_gpu_hour, and this one "
        "sets 1.5 (the price the plan takes): give the price once, in one of them",
    ),
    Case(  # accepted: a custom GPU named CPU made the site's agents compute on the CPU
        "custom gpu named as a catalog one",
        site_with("    gpu: H20\n", "    gpu_spec: {name: CPU, bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1}\n"),
        "sites.h20.gpu_spec.name: 'CPU' is a catalog GPU: write gpu: CPU",
    ),
    Case(  # accepted: plan's tables printed the name's line break (or a terminal's ESC) as it is
        "custom gpu name with a line break",
        site_with("    gpu: H20\n", '    gpu_spec: {name: "X\\nY", bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1}\n'),
        "sites.h20.gpu_spec.name: 'X\\nY' has U+000A (a line break, tab or other control character)",
    ),
    Case(
        "custom gpu name with an escape",
        site_with("    gpu: H20\n", '    gpu_spec: {name: "X\\e[2J", bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1}\n'),
        "sites.h20.gpu_spec.name: 'X\\x1b[2J' has U+001B",
    ),
    Case("bad site name", GOOD_INV.replace("  h20:", "  H20 Site:"), "sites.H20 Site: invalid name"),
    Case(
        "negative bandwidth",
        site_with("    gpu: H20\n", "    gpu: H20\n    network: {bandwidth_gbps: -1}\n"),
        "sites.h20.network.bandwidth_gbps",
    ),
    Case("sites is a list", HEAD + "sites: [a, b]\n", "sites"),
    Case(
        "link to unknown site",
        GOOD_INV + "links: [{between: [h20, h800], bandwidth_gbps: 80}]\n",
        "links[0].between[1]: unknown site 'h800'",
    ),
    Case(  # it said "unknown site 'dc-b'", and to load the inventory file that declares it
        "link between datacenters",
        GOOD_INV + "links: [{between: [dc-b, h800], bandwidth_gbps: 80}]\n",
        "links[0].between[0]: 'dc-b' is a datacenter (of site h20); a link joins two sites: name its site",
    ),
    Case("link to itself", GOOD_INV + "links: [{between: [h20, h20], bandwidth_gbps: 80}]\n", "links[0].between"),
    Case(
        "negative link latency",
        GOOD_INV.replace("sites:", "links: [{between: [h20, x], bandwidth_gbps: 1, latency_ms: -1}]\nsites:"),
        "links[0].latency_ms",
    ),
    Case(  # it planned, and printed 300-digit times
        "link latency past a minute",
        GOOD_INV.replace("sites:", "links: [{between: [h20, x], bandwidth_gbps: 1, latency_ms: 1e300}]\nsites:"),
        "links[0].latency_ms: Input should be less than or equal to 60000",
    ),
    Case(
        "link bandwidth past 100 Tbit/s",
        GOOD_INV.replace("sites:", "links: [{between: [h20, x], bandwidth_gbps: 1e12}]\nsites:"),
        "links[0].bandwidth_gbps: Input should be less than or equal to 100000",
    ),
    Case(  # plan said a generation time of 300 digits
        "a custom GPU's TFLOPS below any GPU's",
        site_with("    gpu: H20\n", "    gpu_spec: {name: X, bf16_tflops: 1.0e-300, hbm_gb: 80, hbm_tb_per_s: 2}\n"),
        "sites.h20.gpu_spec.bf16_tflops: Input should be greater than or equal to 0.001 (got 1e-300)",
    ),
    Case(
        "a custom GPU's memory bandwidth below any GPU's",
        site_with("    gpu: H20\n", "    gpu_spec: {name: X, bf16_tflops: 100, hbm_gb: 80, hbm_tb_per_s: 1.0e-300}\n"),
        "sites.h20.gpu_spec.hbm_tb_per_s: Input should be greater than or equal to 0.001 (got 1e-300)",
    ),
    Case(  # plan said a tensor-parallel rollout unit's generation time of 300 digits
        "a custom GPU's NVLink bandwidth below any GPU's",
        site_with(
            "    gpu: H20\n",
            "    gpu_spec: {name: X, bf16_tflops: 100, hbm_gb: 80, hbm_tb_per_s: 2, nvlink_gb_per_s: 1.0e-300}\n",
        ),
        "sites.h20.gpu_spec.nvlink_gb_per_s: Input should be greater than or equal to 0.001 (got 1e-300)",
    ),
    Case(  # plan said a weight sync of a 300-digit number of seconds
        "link bandwidth below 1 Mbit/s",
        GOOD_INV + SITE.replace("h20:", "h20b:").replace("h20-", "h20b-") + "links: [{between: [h20, h20b], "
        "bandwidth_gbps: 1.0e-300}]\n",
        "links[0].bandwidth_gbps: Input should be greater than or equal to 0.001 (got 1e-300)",
    ),
    Case(
        "site bandwidth below 1 Mbit/s",
        site_with("    gpu: H20\n", "    gpu: H20\n    network: {bandwidth_gbps: 1.0e-300}\n"),
        "sites.h20.network.bandwidth_gbps: Input should be greater than or equal to 0.001 (got 1e-300)",
    ),
    Case(
        "site bandwidth past 100 Tbit/s",
        site_with("    gpu: H20\n", "    gpu: H20\n    network: {bandwidth_gbps: 1e6}\n"),
        "sites.h20.network.bandwidth_gbps: Input should be less than or equal to 100000",
    ),
    Case("no sites at all", HEAD + "sites: {}\n", "no site defined"),
    Case("not UTF-8", b"apiVersion: rlctl/v1\nkind: Inventory\n\xff\xfe\xfa\n", "cannot read"),
    Case("a directory", None, "is a directory", kind="dir"),
    Case("missing file", None, "no such file", kind="missing"),
    Case("duplicate site across files", GOOD_INV, "sites.h20: duplicate site name", kind="two-files", extra=GOOD_INV),
    Case(
        "duplicate link",
        GOOD_INV + "links:\n  - {between: [h20, h800], bandwidth_gbps: 80}\n"
        "  - {between: [h800, h20], bandwidth_gbps: 10}\n",
        "links[1]: duplicate link",
        kind="two-files",
        extra=OTHER_INV,
    ),
    Case(
        "job: unknown pipeline mode", JOB + "pipeline: {mode: streaming}\n", "pipeline.mode", kind="job", extra=GOOD_INV
    ),
    Case(  # check passed it; the launched controller failed at its start (msgpack takes no int past 2^64)
        "job: iterations past a billion",
        JOB + "iterations: 100000000000000000000\n",
        "iterations: Input should be less than or equal to 1000000000 (got 100000000000000000000)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # check passed it, and the launched controller failed at its start (msgpack: OverflowError)
        "job: a count past 2^63 - 1",
        JOB + "checkpoint: {every_iterations: 1000000000000000000000000000000}\n",
        "checkpoint.every_iterations: 1000000000000000000000000000000 is past the largest whole number rlctl takes, "
        "2^63 - 1 (9223372036854775807)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # the same in a list of an inventory, said by the field's own bound (`huge_int`'s lists: its test below)
        "a device id past 2^63 - 1",
        site_with("gpus: 8}", "gpus: 2, devices: [0, 100000000000000000000]}"),
        "sites.h20.nodes[0].devices[1]: Input should be less than 1024 (got 100000000000000000000)",
    ),
    Case(  # check passed it, and the launched controller started a million reward processes on its host
        "job: reward workers past a node's cores",
        JOB.replace("task: {kind: lengths}", "task: {kind: dataset, path: d.jsonl, reward_workers: 1000000}"),
        "task.reward_workers: Input should be less than or equal to 4096 (got 1000000)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: staleness with sync",
        JOB + "pipeline: {mode: sync, staleness: 2}\n",
        "pipeline: staleness must be 0",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: unknown placement site",
        JOB.replace("trainer: {site: h20", "trainer: {site: h02"),
        "placement.trainer.site: unknown site 'h02'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: more GPUs than the site",
        JOB.replace("gpus: 8}", "gpus: 64}"),
        "placement.trainer.gpus",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: unknown model",
        JOB.replace("qwen2.5-7b", "qwen2.5-8b"),
        "model.name: unknown built-in model",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: inventory file missing",
        JOB.replace("[inv.yaml]", "[nope.yaml]"),
        "inventory[0]: no such file",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it said "<tmp>: is a directory, expected a YAML file", naming neither the job file nor its field
        "job: inventory entry empty",
        JOB.replace("[inv.yaml]", '[""]'),
        "job.yaml: inventory[0]: the path is empty; give an inventory file (clusters/*.yaml, relative to the job file)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it said "no such file 'https:/x/inv.yaml' (paths are relative to the job file)"
        "job: inventory entry a URL",
        JOB.replace("[inv.yaml]", "[inv.yaml, 'https://x/inv.yaml']"),
        "job.yaml: inventory[1]: 'https://x/inv.yaml' is a URL; rlctl reads inventory files of this machine",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: inventory entry a directory",
        JOB.replace("[inv.yaml]", "[inv.yaml, .]"),
        "inventory[1]: ",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it said "inv.yaml: sites.h20: duplicate site name; already defined in inv.yaml"
        "job: an inventory file twice",
        JOB.replace("[inv.yaml]", "[inv.yaml, ./inv.yaml]"),
        "job.yaml: inventory[1]: ",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "SLURM ssh settings without a submit host",
        OTHER_INV.replace("partition: p}", "partition: p, ssh_user: rl, ssh_port: 2222}"),
        "sites.h800.scheduler: ssh_user, ssh_port: read only to reach submit_host",
    ),
    Case(  # accepted and read by nothing: a CPU site's agents get CUDA_VISIBLE_DEVICES ''
        "CPU site mapping devices",
        site_with("gpus: 8}", "gpus: 8, devices: [0, 0, 1, 1, 2, 2, 3, 3]}").replace("gpu: H20", "gpu: CPU"),
        "sites.h20: nodes[].devices: the site's gpu is CPU: its slots are cores and its agents use no CUDA device",
    ),
    Case(  # accepted and read by nothing: only SLURM (--mem-per-cpu) and gpu: CPU sites (check) read it
        "SSH GPU site giving memory_gb",
        site_with("gpus: 8}", "gpus: 8, memory_gb: 2048}"),
        "sites.h20: nodes[].memory_gb: read on SLURM sites (--mem-per-cpu) and gpu: CPU sites only; this ssh site's "
        "agents ask no scheduler for memory and `rlctl check` measures them against their H20's memory: remove it",
    ),
    Case(
        "SLURM site mapping devices",
        OTHER_INV.replace("gpus: 8}", "gpus: 8, devices: [0, 1, 2, 3, 4, 5, 6, 7]}"),
        "sites.h800: nodes[].devices: SLURM binds each task's GPUs itself",
    ),
    Case(
        "job: unknown task kind",
        JOB.replace("kind: lengths", "kind: math"),
        "task: unknown kind 'math'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case("job: zero iterations", JOB + "iterations: 0\n", "iterations", kind="job", extra=GOOD_INV),
    Case(
        "job: GRPO with one sample per prompt",
        JOB + "batch: {samples_per_prompt: 1}\n",
        "batch.samples_per_prompt: GRPO's advantage compares",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a learning-rate floor without a decay",
        JOB + "algorithm: {kind: grpo, min_lr_ratio: 0.1}\n",
        "algorithm: min_lr_ratio is the floor",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: an unknown loss aggregation",
        JOB + "algorithm: {kind: grpo, loss_aggregation: seq_mean}\n",
        "algorithm.loss_aggregation: Input should be 'token_mean', 'sequence_mean' or 'constant' (got 'seq_mean')",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: refills without dynamic sampling",
        JOB + "algorithm: {kind: grpo, max_refills: 4}\n",
        "algorithm: max_refills bounds dynamic_sampling's new groups",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it was taken, and left out every token π_prox favours over μ (AReaL's behav_imp_weight_cap is > 1)
        "job: a decoupled cap of 1 or less",
        JOB + "algorithm: {kind: grpo, off_policy: decoupled, is_cap: 1}\n",
        "algorithm: is_cap 1: off_policy 'decoupled' leaves out each token whose π_prox/μ exceeds is_cap, so it must "
        "be > 1",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # it was taken: the lower clip 1 − clip_eps ≤ 0 never binds
        "job: a clip of 1 or more",
        JOB + "algorithm: {kind: ppo, clip_eps: 1.5}\n",
        "algorithm.clip_eps: 1.5: the ratio's lower clip 1 − clip_eps would be -0.5, which no ratio falls below: valid "
        "0 < clip_eps < 1 (a wider upper clip is clip_eps_high)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: dynamic sampling under PPO",
        JOB + "algorithm: {kind: ppo, dynamic_sampling: true}\n",
        "algorithm.dynamic_sampling",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: bad inventory inside", JOB, "inv.yaml: sites.h20.gpu", kind="job", extra=site_with("gpu: H20", "gpu: X")
    ),
    # infinite / NaN numbers: no field means "unbounded" by them (they crashed `check` / `plan` further on)
    Case(
        "infinite node memory",
        site_with("gpus: 8}", "gpus: 8, memory_gb: .inf}"),
        "sites.h20.nodes[0].memory_gb: Input should be a finite number (got inf)",
    ),
    Case(
        "infinite GPU cost",
        site_with("    gpu: H20\n", "    gpu: H20\n    cost_per_gpu_hour: .inf\n"),
        "sites.h20.cost_per_gpu_hour: Input should be a finite number",
    ),
    Case(
        "infinite bandwidth",
        site_with("    gpu: H20\n", "    gpu: H20\n    network: {bandwidth_gbps: .inf}\n"),
        "sites.h20.network.bandwidth_gbps: Input should be a finite number",
    ),
    Case(
        "job: NaN learning rate",
        JOB + "algorithm: {kind: grpo, lr: .nan}\n",
        "algorithm.lr: Input should be a finite number (got nan)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: infinite transport timeout",
        JOB + "transport: {timeout_s: .inf}\n",
        "transport.timeout_s: Input should be a finite number",
        kind="job",
        extra=GOOD_INV,
    ),
    # seconds fields reach a timer, a poll or faulthandler, which overflow near 2^63 ns at run time: refused here
    Case(
        "job: a hang watch past a week",
        JOB + "rollout: {hang_timeout_s: 1.0e+10}\n",
        "rollout.hang_timeout_s: more than a week; valid: up to 604800 s (7 days); or 'auto' or 'never'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a trainer hang watch past a week",
        JOB + "trainer: {hang_timeout_s: 1e10}\n",
        "trainer.hang_timeout_s: more than a week; valid: up to 604800 s (7 days)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a transport timeout past a week",
        JOB + "transport: {timeout_s: 1e300}\n",
        "transport.timeout_s: more than a week; valid: up to 604800 s (7 days)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: an unreachable timeout past a week",
        JOB + "transport: {unreachable_timeout_s: 604801}\n",
        "transport.unreachable_timeout_s: more than a week; valid: up to 604800 s (7 days)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # two mistakes in one section: the first is said, not merged into the other's line
        "job: an unknown transport kind beside a timeout past a week",
        JOB + "transport: {kind: tcpx, timeout_s: 1.0e+9}\n",
        "transport.kind: Input should be 'tcp', 'ucx' or 'inproc'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a report period past a week",
        JOB + "rollout: {partial_report_s: 1.0e+9}\n",
        "rollout.partial_report_s: more than a week",
        kind="job",
        extra=GOOD_INV,
    ),
    *(
        Case(
            f"job: {field} past a week",
            JOB.replace("kind: lengths", f"kind: dataset, path: d.jsonl, {field}: 1.0e+9"),
            f"task.{field}: more than a week; valid: up to 604800 s (7 days)",
            kind="job",
            extra=GOOD_INV,
        )
        for field in ("reward_timeout_s", "reward_load_timeout_s", "reward_stall_s")
    ),
    Case(
        "job: staleness past the iterations",  # planned in minutes, where it means no more than the iterations
        JOB + "iterations: 4\npipeline: {mode: async, staleness: 1000000}\n",
        "pipeline.staleness: 1000000 is more than the job's 4 iterations; use at most 4",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # rounds past MAX_SAMPLES_AHEAD are not created: η 8 ran as 2, said at INFO only
        "job: staleness past the samples created ahead",
        JOB + "iterations: 20\nbatch: {prompts_per_iteration: 1024, samples_per_prompt: 128}\n"
        "pipeline: {mode: async, staleness: 8}\n",
        "pipeline.staleness: 8: the controller creates rounds at most 262,144 samples ahead of the trainer "
        "(MAX_SAMPLES_AHEAD), 2 iterations of 131,072 (batch.prompts_per_iteration 1024 × samples_per_prompt 128); "
        "use at most 2, or fewer samples an iteration",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: infinite number or 'auto'",  # the error names the field, not pydantic's label of the union member
        JOB.replace("kind: lengths", "kind: dataset, path: d.jsonl, reward_stall_s: .inf"),
        "task.reward_stall_s: Input should be a finite number",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: negative GPU count or 'auto'",
        JOB.replace("gpus: 8}", "gpus: -8}"),
        "placement.trainer.gpus: Input should be greater than 0",
        kind="job",
        extra=GOOD_INV,
    ),
    # a union of a number and words: both said, whichever member pydantic tried first (it said 'a valid integer' to
    # `gpus: Auto`, 'a valid number' to `reward_stall_s: forever`, and only "'auto' or 'never'" to `hang_timeout_s: -1`)
    Case(
        "job: a misspelt 'auto' GPU count",
        JOB.replace("gpus: 8}", "gpus: Auto}"),
        "placement.trainer.gpus: Input should be a valid integer, unable to parse string as an integer; or 'auto' "
        "(got 'Auto')",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: words a number-or-words field lacks",
        JOB.replace("kind: lengths", "kind: dataset, path: d.jsonl, reward_stall_s: forever"),
        "task.reward_stall_s: Input should be a valid number, unable to parse string as a number; or 'auto' or 'never'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a negative number for a number or words",
        JOB + "rollout: {hang_timeout_s: -1}\n",
        "rollout.hang_timeout_s: Input should be greater than 0; or 'auto' or 'never' (got -1)",
        kind="job",
        extra=GOOD_INV,
    ),
    # a YAML boolean where a number goes: pydantic read true as 1 (`iterations: true` ran one iteration)
    Case(
        "job: a boolean for an integer",
        JOB + "iterations: true\n",
        "job.yaml: iterations: Input should be a valid integer, not a boolean (got True)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a boolean for an integer or 'auto'",
        JOB.replace("gpus: 8}", "gpus: true}"),
        "placement.trainer.gpus: Input should be a valid integer or 'auto', not a boolean (got True)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a boolean for a number",
        JOB + "algorithm: {kind: grpo, lr: false}\n",
        "algorithm.lr: Input should be a valid number, not a boolean (got False)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a boolean for a number, 'auto' or 'never'",
        JOB + "rollout: {hang_timeout_s: true}\n",
        "rollout.hang_timeout_s: Input should be a valid number, 'auto' or 'never', not a boolean (got True)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "a boolean in a list of integers",
        site_with("gpus: 8}", "gpus: 2, devices: [0, true]}"),
        "sites.h20.nodes[0].devices[1]: Input should be a valid integer, not a boolean (got True)",
    ),
    # a traceback (RecursionError) before
    Case("nested hundreds deep", HEAD + "sites: " + "[" * 500 + "]" * 500 + "\n", "nested too deeply"),
    # a host listed twice was counted, placed and staged twice; two sites on one GPU both used it
    Case(
        "a host listed twice",
        site_with(
            'nodes: [{host: "h20-[01-04]", gpus: 8}]',
            'nodes: [{host: "h20-[01-04]", gpus: 8}, {host: h20-03, gpus: 8}]',
        ),
        "sites.h20: nodes[1]: host h20-03 is listed twice",
    ),
    Case(
        "two sites on one GPU",
        GOOD_INV + SITE.replace("h20:", "h20b:"),
        "sites.h20b.nodes: GPU 0 of h20-01 is listed by site 'h20' too",
    ),
    Case(  # DNS names ignore case: H20-03 is h20-03, and its 8 GPUs were counted twice (64 on a site of 32)
        "a host listed twice in another case",
        site_with(
            'nodes: [{host: "h20-[01-04]", gpus: 8}]',
            'nodes: [{host: "h20-[01-04]", gpus: 8}, {host: H20-03, gpus: 8}]',
        ),
        "sites.h20: nodes[1]: host H20-03 is listed twice (as h20-03 too: one host, however it is spelt)",
    ),
    Case(  # a trailing dot is the same DNS name: h20-03. was counted beside h20-03 (64 GPUs on a site of 32)
        "a host listed twice, once with a trailing dot",
        site_with(
            'nodes: [{host: "h20-[01-04]", gpus: 8}]',
            'nodes: [{host: "h20-[01-04]", gpus: 8}, {host: h20-03., gpus: 8}]',
        ),
        "sites.h20: nodes[1]: host h20-03. is listed twice (as h20-03 too: one host, however it is spelt)",
    ),
    Case(  # accepted: each GPU slot's share went to sbatch as --mem-per-cpu=1 (MiB), the agents killed at start
        "a SLURM GPU node with a thousandth of a GB",
        OTHER_INV.replace("gpus: 8}", "gpus: 8, memory_gb: 0.001}"),
        "sites.h800: nodes[0].memory_gb: 0.001 GB for 8 GPU slots; give the host's whole memory in GB (10^9 bytes), "
        "at least 1 per GPU slot (8 here), e.g. 2048 for 2 TB",
    ),
    Case(  # 2 TB written in TB: 250 MB a GPU slot
        "a SLURM GPU node's memory written in TB",
        OTHER_INV.replace("gpus: 8}", "gpus: 8, memory_gb: 2}"),
        "sites.h800: nodes[0].memory_gb: 2 GB for 8 GPU slots",
    ),
    Case(  # one IPv6 address written two ways
        "an IPv6 host listed twice, written two ways",
        site_with('nodes: [{host: "h20-[01-04]", gpus: 8}]', 'nodes: [{host: "2001:db8::5,2001:DB8:0::5", gpus: 8}]'),
        "sites.h20: nodes[0]: host 2001:DB8:0::5 is listed twice (as 2001:db8::5 too: one host, however it is spelt)",
    ),
    Case(  # both sites placed agents on GPU 0 of one host
        "two sites on one GPU of a host spelt two ways",
        GOOD_INV + SITE.replace("h20:", "h20b:").replace("h20-[01-04]", "H20-01"),
        "sites.h20b.nodes: GPU 0 of h20-01 is listed by site 'h20' too",
    ),
    Case(
        "a host name with shell syntax",
        site_with('host: "h20-[01-04]"', 'host: "h20-01;id"'),
        "nodes[0].host: 'h20-01;id' is not a host name or address",
    ),
    Case("an empty workdir", site_with("user: rl}", "user: rl, workdir: ''}"), "scheduler.workdir: String should have"),
    Case("an empty partition", OTHER_INV.replace("partition: p", "partition: ''"), "scheduler.partition: String"),
    Case(  # accepted, quoted into every sbatch as one word: 'invalid partition specified' at launch
        "a partition with a trailing space",
        OTHER_INV.replace("partition: p", "partition: 'gpu '"),
        "sites.h800.scheduler.partition: 'gpu ' has whitespace, which no SLURM name has",
    ),
    Case(  # 'unknown key; valid keys: …', as if misspelt
        "job: a ppo key in a grpo job",
        JOB + "algorithm: {kind: grpo, critic_lr: 1.0e-3}\n",
        "algorithm.critic_lr: a key of algorithm kind 'ppo' only, and this algorithm is kind 'grpo': drop it, or use "
        "kind 'ppo'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "a slurm key in an ssh scheduler",
        site_with("{kind: ssh, user: rl}", "{kind: ssh, user: rl, partition: gpu}"),
        "scheduler.partition: a key of scheduler kind 'slurm' only, and this scheduler is kind 'ssh'",
    ),
    Case(  # 'Input should be a valid string (got 123)': a name of digits is one, written in quotes
        "job: a name of digits",
        JOB.replace("name: j1", "name: 0123"),
        "job.yaml: name: YAML reads this value as the number 83, not a string: write it in quotes, as you mean it",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "a partition of digits",
        OTHER_INV.replace("partition: p", "partition: 12"),
        "sites.h800.scheduler.partition: YAML reads this value as the number 12, not a string: write it in quotes",
    ),
    Case(  # 'Input should be a valid string (got False)': YAML 1.1 reads an unquoted off, no or yes as a boolean
        "a user YAML reads as a boolean",
        site_with("user: rl}", "user: off}"),
        "sites.h20.scheduler.user: YAML reads this value as the boolean False (an unquoted yes/no, on/off or "
        "true/false), not a string: write it in quotes, as you mean it",
    ),
    Case(
        "job: a name YAML reads as a boolean",
        JOB.replace("name: j1", "name: yes"),
        "job.yaml: name: YAML reads this value as the boolean True",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # 'Input should be a valid string': not what is
        "partitions as a list",
        OTHER_INV.replace("partition: p", "partition: [gpu, gpu-long]"),
        "sites.h800.scheduler.partition: ['gpu', 'gpu-long'] is a list; several partitions are one string, as sbatch "
        "takes them: 'gpu,gpu-long'",
    ),
    Case(
        "two qos names with a space",
        OTHER_INV.replace("partition: p", "partition: p, qos: 'high normal'"),
        "sites.h800.scheduler.qos: 'high normal' has whitespace",
    ),
    Case(
        "a constraint with a space",
        OTHER_INV.replace("partition: p", "partition: p, constraint: 'h800 ib'"),
        "sites.h800.scheduler.constraint: 'h800 ib' has whitespace, which no SLURM name has; features join as 'a&b'",
    ),
    Case(
        "an empty reservation",
        OTHER_INV.replace("partition: p", "partition: p, reservation: ''"),
        "reservation: String",
    ),
    # sbatch_options: each reaches every sbatch as --name=value; one rlctl writes itself was given twice
    Case(
        "sbatch_options naming the partition",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {partition: gpu}"),
        "sites.h800.scheduler.sbatch_options: --partition is not taken in sbatch_options: use scheduler.partition",
    ),
    Case(  # sbatch takes an unambiguous abbreviation of a long option for it
        "sbatch_options abbreviating a field's option",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {constr: ib}"),
        "sites.h800.scheduler.sbatch_options: --constr (sbatch's abbreviation of --constraint) is not taken in "
        "sbatch_options: use scheduler.constraint",
    ),
    Case(
        "sbatch_options asking GPUs",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {gpus-per-node: '8'}"),
        "sites.h800.scheduler.sbatch_options: --gpus-per-node is not taken in sbatch_options: use "
        "scheduler.gpu_request",
    ),
    Case(
        "sbatch_options setting the log",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {output: /tmp/x.log}"),
        "sites.h800.scheduler.sbatch_options: --output is not taken in sbatch_options: rlctl sets it for each "
        "agent's job: leave it out",
    ),
    Case(
        "sbatch_options with a leading --",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {--comment: x}"),
        "sites.h800.scheduler.sbatch_options: '--comment' is no long option as sbatch spells them (lower-case "
        "letters, digits and '-', without the leading --), e.g. 'comment'",
    ),
    Case(
        "sbatch_options value over two lines",
        OTHER_INV.replace("partition: p", 'partition: p, sbatch_options: {comment: "a\\nhostname"}'),
        "sites.h800.scheduler.sbatch_options: --comment: its value 'a\\nhostname' has a line break",
    ),
    Case(  # the union's member was said as a key: 'sbatch_options.mail-type.str: Input should be a valid string'
        "sbatch_options value a list",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {mail-type: [END, FAIL]}"),
        "sites.h800.scheduler.sbatch_options.mail-type: Input should be a valid string; or True",
    ),
    Case(
        "sbatch_options flag false",
        OTHER_INV.replace("partition: p", "partition: p, sbatch_options: {requeue: false}"),
        "sites.h800.scheduler.sbatch_options: --requeue: False: give its value, or true for a flag",
    ),
    # read from the directory rlctl ran in: a resume or stop from another directory looked elsewhere
    Case(
        "a local site's relative workdir",
        site_with("{kind: ssh, user: rl}", "{kind: local, workdir: runs}"),
        "sites.h20.scheduler.workdir: 'runs': give an absolute path or one under ~ (the site is "
        "this machine, and a relative path was read from the directory rlctl runs in)",
    ),
    Case(
        "a relative workdir where sbatch runs here",
        OTHER_INV.replace("partition: p", "partition: p, workdir: runs"),
        "workdir 'runs': give an absolute path or one under ~ (sbatch runs here",
    ),
    # the runtime refused these at start (a ValueError in every agent), after check passed
    Case(
        "job: a chunk larger than a bucket",
        JOB + "weight_sync: {chunk_bytes: 134217728}\n",
        "weight_sync.chunk_bytes: Input should be less than or equal to 67108864",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: threads past an int",
        JOB + "trainer: {threads_per_rank: 2147483648}\n",
        "trainer.threads_per_rank: Input should be less than or equal to 4096",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: a seed numpy does not take",
        JOB + "seed: 1180591620717411303424\n",
        "seed: Input should be less than or equal to 4294967295",
        kind="job",
        extra=GOOD_INV,
    ),
    # sizes no real job reaches: a typo (extra zeros) hung or crashed `plan` / `check`
    Case(
        "job: huge sigma",
        JOB.replace("kind: lengths", "kind: lengths, sigma: 1e300"),
        "task.sigma: Input should be less than or equal to 4",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: huge digits sigma",
        JOB.replace("kind: lengths", "kind: digits, sigma: 1e300"),
        "task.sigma: Input should be less than or equal to 4",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: huge median output",
        JOB.replace("kind: lengths", "kind: lengths, median_output_tokens: 1e300"),
        "task.median_output_tokens: Input should be less than or equal to 16777216",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: huge samples per prompt",
        JOB + "batch: {samples_per_prompt: 100000000}\n",
        "batch.samples_per_prompt: Input should be less than or equal to 1024",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(  # passed check, plan and the dry run: the digits task would draw a billion prompts at the end
        "job: huge held-out prompts",
        JOB + "evaluation: {heldout_prompts: 1000000000}\n",
        "evaluation.heldout_prompts: Input should be less than or equal to 65536",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: huge prompts per iteration",
        JOB + "batch: {prompts_per_iteration: 100000}\n",
        "batch.prompts_per_iteration: Input should be less than or equal to 65536",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: huge samples per iteration",
        JOB + "batch: {prompts_per_iteration: 65536, samples_per_prompt: 8}\n",
        "batch: prompts_per_iteration × samples_per_prompt = 524288 samples an iteration; at most 131072",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "huge GPUs per node",
        site_with("gpus: 8", "gpus: 100000000000"),
        "sites.h20.nodes[0].gpus: Input should be less",
    ),
    Case(
        "huge site",
        site_with('host: "h20-[01-04]", gpus: 8', 'host: "h[1-100000]", gpus: 1024'),
        "sites.h20: nodes: 102400000 GPU slots in all (hosts × gpus); at most 1048576 on one site",
    ),
    Case(  # SLURM_CONF reached sbatch as '~/slurm.conf' (quoted on the submit host): every SLURM command failed
        "slurm_conf under ~",
        OTHER_INV.replace("partition: p}", "partition: p, submit_host: login, slurm_conf: ~/slurm.conf}"),
        "sites.h800.scheduler.slurm_conf: '~/slurm.conf': a leading ~ is not expanded (SLURM_CONF reaches sbatch and "
        "the other tools as written): give an absolute path, e.g. /etc/slurm/slurm.conf",
    ),
    Case(  # it was no SLURM_CONF: the cluster's default, silently
        "slurm_conf empty",
        OTHER_INV.replace("partition: p}", 'partition: p, slurm_conf: ""}'),
        "sites.h800.scheduler.slurm_conf: empty; give the slurm.conf's path, or leave slurm_conf out",
    ),
    Case(  # read from the directory rlctl ran in
        "slurm_conf relative, sbatch here",
        OTHER_INV.replace("partition: p}", "partition: p, slurm_conf: etc/slurm.conf}"),
        "sites.h800.scheduler: slurm_conf 'etc/slurm.conf': give an absolute path (sbatch runs here, and a relative "
        "path was read from the directory rlctl runs in)",
    ),
    Case(  # 2 TB written in MB: sbatch asked 2000 times the node's memory (1e30: a 31-digit --mem-per-cpu)
        "a host's memory past any host's",
        OTHER_INV.replace("gpus: 8}", "gpus: 8, memory_gb: 2097152}"),
        "sites.h800.nodes[0].memory_gb: Input should be less than or equal to 100000 (got 2097152)",
    ),
    Case(  # sbatch got --cpus-per-task=125000000
        "a host's cores past any host's",
        OTHER_INV.replace("gpus: 8}", "gpus: 8, cpus: 1000000000}"),
        "sites.h800.nodes[0].cpus: Input should be less than or equal to 4096 (got 1000000000)",
    ),
    # listen addresses
    Case(
        "job: empty listen address",
        JOB + 'transport: {listen_host: ""}\n',
        "transport.listen_host: invalid listen address ''; valid: an IPv4 or IPv6 address, a host name",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "job: listen address with a space",
        JOB + 'transport: {listen_host: "bad host!"}\n',
        "transport.listen_host: invalid listen address 'bad host!'",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "site listen address with a space",
        site_with("    gpu: H20\n", '    gpu: H20\n    network: {bandwidth_gbps: 10, listen_host: "bad host!"}\n'),
        "sites.h20.network.listen_host: invalid listen address 'bad host!'",
    ),
    # a key twice: YAML keys are unique, PyYAML alone would keep the last silently
    Case(
        "job: a section twice",
        JOB + "placement:\n  trainer: {site: h20, gpus: 4}\n  rollout: [{site: h20, gpus: 4}]\n",
        "job.yaml: duplicate key 'placement' at line 10 (first at line 7)",
        kind="job",
        extra=GOOD_INV,
    ),
    Case(
        "a key twice in a flow mapping",
        site_with("user: rl}", "user: rl, user: root}"),
        "duplicate key 'user' at line 6 (first at line 6)",
    ),
]


def materialise(case: Case, tmp: Path) -> list[str]:
    main = tmp / ("job.yaml" if case.kind == "job" else "inv.yaml")
    if case.kind == "dir":
        main.mkdir()
    elif case.kind == "missing":
        pass
    elif isinstance(case.content, bytes):
        main.write_bytes(case.content)
    else:
        assert case.content is not None
        main.write_text(case.content)
    if case.kind == "job":
        (tmp / "inv.yaml").write_text(case.extra)
    if case.kind == "two-files":
        (tmp / "other.yaml").write_text(case.extra)
        return [str(tmp / "other.yaml"), str(main)]
    return [str(main)]


@pytest.mark.parametrize("command", ["check", "profile"])
def test_a_path_whose_tilde_the_shell_left_says_so(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--cluster=~/inv.yaml` (bash expands no ~ after '=') reached rlctl as written: 'no such file' of a file that is
    there, and nothing said why. The hint names no option: it said "write `--cluster ~/…`" to `rlctl check`, which
    takes its files as arguments and has no --cluster."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    args = ["~/inv.yaml"] if command == "check" else ["--cluster=~/inv.yaml", "--model", "qwen2.5-7b"]
    res = run_cli(command, *args)
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == (
        "rlctl: error: ~/inv.yaml: no such file (hint: the shell left this ~ as written (it expands one only at the "
        "start of an unquoted word, not after '='): give the path unquoted, after a space rather than '=', or in full "
        f"('{tmp_path}/inv.yaml' is there))\n"
    )


def test_a_path_under_a_home_that_is_not_there_is_no_such_file() -> None:
    """`~nosuchuser/…` (no such user: the shell leaves it as written too) ended in a RuntimeError traceback, exit 1:
    the tilde hint's Path.expanduser raised 'Could not determine home directory'."""
    res = run_cli("check", "~rlctl-no-such-user/inv.yaml")
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == "rlctl: error: ~rlctl-no-such-user/inv.yaml: no such file\n"


def no_home(written: str = "~rlctl-no-such-user/x") -> str:
    return f"{written!r}: ~rlctl-no-such-user is no home directory here (no such user)"


TASK = "task: {kind: lengths}"
NO_HOME_DATA = "task: {kind: dataset, path: ~rlctl-no-such-user/x.jsonl}"
NO_HOME_REWARD = "task: {kind: dataset, path: d.jsonl, reward: '~rlctl-no-such-user/x.py:f'}"


@pytest.mark.parametrize(
    ("field", "written", "job"),
    [
        ("job_dir", "~rlctl-no-such-user/x", JOB + "job_dir: ~rlctl-no-such-user/x\n"),
        ("inventory[0]", "~rlctl-no-such-user/x", JOB.replace("[inv.yaml]", "[~rlctl-no-such-user/x]")),
        ("planning.profile", "~rlctl-no-such-user/x", JOB + "planning: {profile: ~rlctl-no-such-user/x}\n"),
        ("task.path", "~rlctl-no-such-user/x.jsonl", JOB.replace(TASK, NO_HOME_DATA)),
        ("task.reward", "~rlctl-no-such-user/x.py", JOB.replace(TASK, NO_HOME_REWARD)),
        ("evaluation.path", "~rlctl-no-such-user/x.jsonl", JOB + "evaluation: {path: ~rlctl-no-such-user/x.jsonl}\n"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["check", "launch"])
def test_a_job_path_under_a_home_that_is_not_there_is_refused_naming_the_field(
    tmp_path: Path, command: str, field: str, written: str, job: str
) -> None:
    """`job_dir: ~nosuchuser/x` (os.path.expanduser leaves it as written) was read as a folder `~nosuchuser` beside
    the job file: check passed it, and launch made the job dir there; an inventory, a profile or a data file under it
    was 'no such file' of that folder, '(relative to the job file)'. One rule now (`textutil.home_expanded`)."""
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "job.yaml").write_text(job)
    res = run_cli(command, str(tmp_path / "job.yaml"))
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == (
        f"rlctl: error: {tmp_path}/job.yaml: {field}: {no_home(written)} (hint: give the path as ~/… or in full)\n"
    )
    assert not (tmp_path / "~rlctl-no-such-user").exists()


@pytest.mark.parametrize(
    ("scheduler", "field"),
    [
        ("{kind: ssh, user: rl, key_file: ~rlctl-no-such-user/x}", "key_file"),
        ("{kind: ssh, user: rl, known_hosts: ~rlctl-no-such-user/x}", "known_hosts"),
        ("{kind: slurm, partition: p, submit_host: login, ssh_key_file: ~rlctl-no-such-user/x}", "ssh_key_file"),
        ("{kind: slurm, partition: p, submit_host: login, ssh_known_hosts: ~rlctl-no-such-user/x}", "ssh_known_hosts"),
    ],
)
def test_an_inventory_file_under_a_home_that_is_not_there_is_refused_by_check(
    tmp_path: Path, scheduler: str, field: str
) -> None:
    """An SSH key or known-hosts file under `~nosuchuser` passed `rlctl check`, and was refused only by the first
    connection of a launch (`home_path`). A job's own record (its sites.json) reads back as launched: its stop,
    status and pull say the one line when they connect."""
    from rlctl.config.inventory import RECORDED, Site

    inv = site_with("{kind: ssh, user: rl}", scheduler)
    (tmp_path / "inv.yaml").write_text(inv)
    res = run_cli("check", str(tmp_path / "inv.yaml"))
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == (
        f"rlctl: error: {tmp_path}/inv.yaml: sites.h20.scheduler.{field}: {no_home()}; give the file as ~/… or in "
        "full\n"
    )
    site = read_yaml(tmp_path / "inv.yaml")["sites"]["h20"]
    assert getattr(Site.model_validate(site, context=RECORDED).scheduler, field) == "~rlctl-no-such-user/x"


@pytest.mark.parametrize("command", ["check", "profile"])
def test_an_inventory_file_given_twice_is_said_so(command: str, tmp_path: Path) -> None:
    """`check a.yaml ./a.yaml` said 'sites.h20: duplicate site name; already defined in a.yaml' (profile: 'in another
    file'): the one file, not its sites, is twice."""
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    first, again = str(tmp_path / "inv.yaml"), str(tmp_path / "." / "inv.yaml")
    if command == "check":
        res = run_cli("check", first, again)
    else:
        res = run_cli("profile", "--model", "qwen2.5-7b", "--cluster", first, "--cluster", again)
    assert res.exit_code == 2, res
    assert res.stderr == f"rlctl: error: {again}: given twice; name each inventory file once\n"


@pytest.mark.parametrize("command", ["check", "profile"])
def test_a_site_declared_in_two_files_names_the_first(command: str, tmp_path: Path) -> None:
    """profile said 'already defined in another file', naming neither (check named it): with several --cluster
    files the operator looked through each."""
    (tmp_path / "a.yaml").write_text(GOOD_INV)
    (tmp_path / "b.yaml").write_text(GOOD_INV.replace("dc-b", "dc-c"))
    first, second = str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")
    if command == "check":
        res = run_cli("check", first, second)
    else:
        res = run_cli("profile", "--model", "qwen2.5-7b", "--cluster", first, "--cluster", second)
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == f"rlctl: error: {second}: sites.h20: duplicate site name; already defined in {first}\n"


def test_a_job_s_inventory_entry_linked_to_another_entry_s_file_names_the_job_s_field(tmp_path: Path) -> None:
    """`inventory: [inv.yaml, link.yaml]`, link.yaml a symlink to inv.yaml: it said 'link.yaml: given twice; name each
    inventory file once', naming neither the job file nor its field (nothing was given twice on the command line)."""
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "link.yaml").symlink_to("inv.yaml")
    (tmp_path / "job.yaml").write_text(JOB.replace("[inv.yaml]", "[inv.yaml, link.yaml]"))
    res = run_cli("check", str(tmp_path / "job.yaml"))
    assert (res.exit_code, res.stderr) == (
        2,
        f"rlctl: error: {tmp_path}/job.yaml: inventory[1]: '{tmp_path}/link.yaml' is inventory[0] too; list each "
        "inventory file once\n",
    )


@pytest.mark.parametrize("kind", ["Job", "Profile"])
def test_a_job_s_inventory_entry_naming_another_kind_of_file_names_the_job_s_field(tmp_path: Path, kind: str) -> None:
    """`inventory: [inv.yaml]`, inv.yaml a job file (or a profile): it said 'inv.yaml: kind: must be 'Inventory' for
    this command, got 'Job'' to `rlctl check job.yaml`, a command that reads job files, naming neither the job file
    nor its field."""
    (tmp_path / "inv.yaml").write_text(JOB if kind == "Job" else "apiVersion: rlctl/v1\nkind: Profile\n")
    (tmp_path / "job.yaml").write_text(JOB)
    res = run_cli("check", str(tmp_path / "job.yaml"))
    assert (res.exit_code, res.stderr) == (
        2,
        f"rlctl: error: {tmp_path}/job.yaml: inventory[0]: '{tmp_path}/inv.yaml' is a file of kind {kind!r}, not an "
        "inventory; give an inventory file (kind: Inventory) (relative to the job file)\n",
    )


@pytest.mark.parametrize("absolute", [False, True])
def test_a_missing_path_of_the_job_s_is_said_relative_to_the_job_file_only_where_written_relative(
    tmp_path: Path, absolute: bool
) -> None:
    """'(paths are relative to the job file)' was said of an inventory file, an inventory directory and a
    planning.profile the job named by an absolute path too, which is read as written."""
    from rlctl.errors import ConfigError

    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "d").mkdir()
    job = tmp_path / "job.yaml"

    def said(written: str, *, field: str = "inventory") -> str:
        given = str(tmp_path / written) if absolute else written
        if field == "inventory":
            job.write_text(JOB.replace("[inv.yaml]", f"[{given}]"))
        else:
            job.write_text(JOB + f"planning: {{profile: {given}}}\n")
        with pytest.raises(ConfigError) as e:
            load_job(job)
        return str(e.value)

    # as every other line of a file the job names says it (task.path, evaluation.path, task.reward: job_relative)
    note = "" if absolute else " (relative to the job file)"
    assert said("gone.yaml") == f"{job}: inventory[0]: no such file '{tmp_path / 'gone.yaml'}'{note}"
    assert said("d") == f"{job}: inventory[0]: '{tmp_path / 'd'}' is a directory; give an inventory file{note}"
    assert (
        said("gone.yaml", field="profile") == f"{job}: planning.profile: no such file '{tmp_path / 'gone.yaml'}'{note}"
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2(case: Case, tmp_path: Path) -> None:
    files = materialise(case, tmp_path)
    res = run_cli("check", *files)
    assert res.exit_code == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""
    line = lines[0]
    assert line.startswith("rlctl: error: ")
    named = case.field.split(": ")[0] if case.field.startswith("inv.yaml") else None
    assert any(Path(f).name in line for f in files) or named, line
    assert case.field in line, line


def test_memory_gb_is_taken_where_it_is_read(tmp_path: Path) -> None:
    """A SLURM GPU site (--mem-per-cpu) and an SSH `gpu: CPU` site (check's memory) take nodes[].memory_gb; an SSH
    GPU site's is refused (`CASES`), and the shipped SSH GPU site no longer sets it."""
    from rlctl.config.inventory import load_inventory

    for inv in (
        OTHER_INV.replace("gpus: 8}", "gpus: 8, memory_gb: 512}"),
        site_with("gpus: 8}", "gpus: 8, memory_gb: 512}").replace("gpu: H20", "gpu: CPU"),
    ):
        (tmp_path / "inv.yaml").write_text(inv)
        (site,) = load_inventory([tmp_path / "inv.yaml"]).sites.values()
        assert site.memory_per_slot_gb() == 64
    shipped = load_inventory([ROOT / "clusters" / "h800-trainer.yaml", ROOT / "clusters" / "h20-rollout.yaml"])
    assert shipped.sites["h20"].memory_per_slot_gb() is None


def test_a_gpu_slot_s_least_host_memory_is_1_gb_and_a_cpu_slot_s_is_not_bounded(tmp_path: Path) -> None:
    """A SLURM GPU node's memory_gb had no floor but > 0 (`CASES`: 0.001 GB for 8 GPUs was asked of sbatch); 1 GB a
    GPU slot is the least, and a `gpu: CPU` site's slots (cores, weighed by check) keep any positive figure."""
    from rlctl.config.inventory import load_inventory

    for inv, per_slot in (
        (OTHER_INV.replace("gpus: 8}", "gpus: 8, memory_gb: 8}"), 1),
        (site_with("gpus: 8}", "gpus: 8, memory_gb: 0.004}").replace("gpu: H20", "gpu: CPU"), 0.0005),
    ):
        (tmp_path / "inv.yaml").write_text(inv)
        (site,) = load_inventory([tmp_path / "inv.yaml"]).sites.values()
        assert site.memory_per_slot_gb() == per_slot


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("bf16_tflops", "1e300", "100000"),
        ("hbm_gb", "1e15", "100000"),
        ("hbm_tb_per_s", "1e300", "10000"),
        ("nvlink_gb_per_s", "1e300", "100000"),
    ],
)
@pytest.mark.parametrize("command", ["check", "plan", "profile"])
def test_a_custom_gpu_figure_past_any_gpu_is_one_line(
    key: str, value: str, bound: str, command: str, tmp_path: Path
) -> None:
    """gpu_spec's figures had no bound: 1e300 TFLOPS made a token's GPU time 0.0 and 1e15 GB of HBM a KV capacity
    past 2^63 tokens, and `check JOB`, `plan` and `profile` ended in a traceback (`check INV` passed it)."""
    spec = {"name": "X1", "bf16_tflops": "100", "hbm_gb": "80", "hbm_tb_per_s": "2", key: value}
    gpu_spec = "gpu_spec: {" + ", ".join(f"{k}: {v}" for k, v in spec.items()) + "}"
    (tmp_path / "inv.yaml").write_text(site_with("gpu: H20", gpu_spec))
    (tmp_path / "job.yaml").write_text(JOB)
    inv, job = str(tmp_path / "inv.yaml"), str(tmp_path / "job.yaml")
    args = {"check": [job], "plan": [job], "profile": ["--cluster", inv, "--model", "qwen2.5-7b"]}[command]
    res = run_cli(command, *args)
    assert (res.exit_code, res.stdout) == (2, ""), res
    said = f"rlctl: error: {inv}: sites.h20.gpu_spec.{key}: Input should be less than or equal to {bound} (got "
    assert res.stderr.startswith(said) and res.stderr.count("\n") == 1, res.stderr


def test_a_gpu_hour_s_price_is_read_from_the_one_field_that_gives_it(tmp_path: Path) -> None:
    """The site's cost_per_gpu_hour, else its custom GPU's cost_per_hour (both: refused, `CASES`); a job's record
    (sites.json, every field of the custom GPU written) reads back with both."""
    from rlctl.config.inventory import RECORDED, Site, load_inventory

    custom = "    gpu_spec: {name: X, bf16_tflops: 1, hbm_gb: 1, hbm_tb_per_s: 1%s}\n"
    for gpu, price in ((custom % ", cost_per_hour: 2.5", 2.5), (custom % "" + "    cost_per_gpu_hour: 1.5\n", 1.5)):
        (tmp_path / "inv.yaml").write_text(site_with("    gpu: H20\n", gpu))
        (site,) = load_inventory([tmp_path / "inv.yaml"]).sites.values()
        assert site.gpu_cost_per_hour == price
    recorded = Site.model_validate(site.model_dump(mode="json", by_alias=True), context=RECORDED)
    assert recorded.gpu_spec is not None and "cost_per_hour" in recorded.gpu_spec.model_fields_set
    assert recorded.gpu_cost_per_hour == 1.5


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        (
            "gpu: H20",
            "gpu_spec: {name: X1, bf16_tflops: 100, hbm_gb: 80, hbm_tb_per_s: 2, cost_per_hour: 1e308}",
            "gpu_spec.cost_per_hour",
        ),
        ("gpu: H20", "gpu: H20\n    cost_per_gpu_hour: 1e308", "cost_per_gpu_hour"),
    ],
)
@pytest.mark.parametrize("command", ["check", "plan"])
def test_a_gpu_hours_price_past_any_is_one_line(
    before: str, after: str, field: str, command: str, tmp_path: Path
) -> None:
    """A GPU-hour's price had no bound: 1e308 overflowed to inf in the plan's cost totals."""
    (tmp_path / "inv.yaml").write_text(site_with(before, after))
    (tmp_path / "job.yaml").write_text(JOB)
    inv, job = str(tmp_path / "inv.yaml"), str(tmp_path / "job.yaml")
    res = run_cli(command, job)
    assert (res.exit_code, res.stdout) == (2, ""), res
    said = f"rlctl: error: {inv}: sites.h20.{field}: Input should be less than or equal to 1000000 (got "
    assert res.stderr.startswith(said) and res.stderr.count("\n") == 1, res.stderr


def test_a_week_is_the_longest_wait_and_is_accepted() -> None:
    assert MAX_WAIT_S == 7 * 24 * 3600
    transport = Transport(timeout_s=MAX_WAIT_S, unreachable_timeout_s=MAX_WAIT_S)
    assert (transport.timeout_s, transport.unreachable_timeout_s) == (MAX_WAIT_S, MAX_WAIT_S)
    assert Rollout(hang_timeout_s=MAX_WAIT_S, partial_report_s=0).hang_timeout_s == MAX_WAIT_S


def test_at_least_25_kinds() -> None:
    assert len({c.name for c in CASES}) >= 25


@pytest.mark.parametrize("jump", ["[fd00::1]:2222", "rl@[fd00::1]:2222", "rl@[fd00::1]", "rl@fd00::1", "b:2222"])
def test_a_proxy_jump_is_taken_as_ssh_j_takes_it(jump: str, tmp_path: Path) -> None:
    """An IPv6 bastion with a port, `[fd00::1]:2222` (ssh -J's form), was refused: it could not be written."""
    from rlctl.config.inventory import load_inventory

    (tmp_path / "inv.yaml").write_text(site_with("user: rl}", f"user: rl, proxy_jump: '{jump}'}}"))
    scheduler = load_inventory([tmp_path / "inv.yaml"]).sites["h20"].scheduler
    assert scheduler.kind == "ssh" and scheduler.proxy_jump == jump


def test_boolean_fields_still_take_booleans(tmp_path: Path) -> None:
    """Refusing a boolean for a number leaves the fields that are booleans (or take one) as they were."""
    network = "    gpu: H20\n    network: {bandwidth_gbps: 100, rdma: true}\n"
    (tmp_path / "inv.yaml").write_text(site_with("    gpu: H20\n", network))
    (tmp_path / "job.yaml").write_text(
        JOB + "rollout: {migrate: false, compile: true}\nrebalance: {auto: true}\nalgorithm: {kind: grpo, "
        "dynamic_sampling: true}\n"
    )
    job = load_job(tmp_path / "job.yaml")
    assert (job.spec.rollout.migrate, job.spec.rollout.compile, job.spec.rebalance.auto) == (False, True, True)
    assert job.inventory.sites["h20"].network.rdma is True


def test_debug_shows_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text(site_with("gpu: H20", "gpu: H2O"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", "--debug", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_real_process_exit_code_and_single_line(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text(site_with("gpu: H20", "gpu: H2O"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", "check", str(bad)], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert f"{bad}: sites.h20.gpu: unknown GPU 'H2O'" in proc.stderr
    assert "did you mean 'H20'?" in proc.stderr


def lock(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Make `root` a directory this user may not enter (mode 000, for anyone but root): `stat` and `open` of
    anything under it raise PermissionError, as they do for a user without the directory's x bit."""
    real_stat, real_open = Path.stat, Path.open

    def denied(path: Path) -> None:
        if path != root and path.is_relative_to(root):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

    def stat(self: Path, **kw: Any) -> Any:
        denied(self)
        return real_stat(self, **kw)

    def open_(self: Path, *args: Any, **kw: Any) -> Any:
        denied(self)
        return real_open(self, *args, **kw)

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(Path, "open", open_)


@pytest.mark.parametrize(
    ("checked", "inventory", "line"),
    [
        ("locked/inv.yaml", None, "locked/inv.yaml: cannot read: Permission denied"),
        ("locked/job.yaml", "inv.yaml", "locked/job.yaml: cannot read: Permission denied"),
        (
            "job.yaml",
            "locked/inv.yaml",
            "job.yaml: inventory[0]: cannot read '{tmp}/locked/inv.yaml': Permission denied",
        ),
    ],
)
def test_a_file_in_a_directory_this_user_may_not_enter_is_one_line(
    checked: str, inventory: str | None, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "locked").mkdir()
    for name in ("inv.yaml", "locked/inv.yaml"):
        (tmp_path / name).write_text(GOOD_INV)
    for name in ("job.yaml", "locked/job.yaml"):
        (tmp_path / name).write_text(JOB.replace("[inv.yaml]", f"[{inventory}]"))
    lock(monkeypatch, tmp_path / "locked")
    res = run_cli("check", str(tmp_path / checked))
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res
    assert res.stderr == f"rlctl: error: {tmp_path}/{line.format(tmp=tmp_path)}\n"


def test_a_model_directory_this_user_may_not_enter_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "locked" / "model").mkdir(parents=True)
    (tmp_path / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "job.yaml").write_text(
        JOB.replace("{kind: builtin, name: qwen2.5-7b}", "{kind: hf, path: locked/model}")
    )
    lock(monkeypatch, tmp_path / "locked")
    res = run_cli("check", str(tmp_path / "job.yaml"))
    assert res.stderr == (
        f"rlctl: error: {tmp_path}/job.yaml: model.path: {tmp_path}/locked/model: cannot read: Permission denied\n"
    )


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    """Only a key written twice is refused: one merged in with `<<: *anchor` may be overridden, as YAML allows."""
    path = tmp_path / "a.yaml"
    path.write_text("base: &b {gpus: 8, cpus: 4}\nnode: {<<: *b, gpus: 2}\n")
    assert read_yaml(path) == {"base": {"gpus": 8, "cpus": 4}, "node": {"gpus": 2, "cpus": 4}}


@pytest.mark.parametrize(
    "host", ["auto", "127.0.0.1", "10.0.0.1", "::1", "fe80::1%eth0", "localhost", "node-01", "h20-01.dc-b.example.com"]
)
def test_listen_hosts_an_agent_can_bind(host: str) -> None:
    assert Transport(listen_host=host).listen_host == host


@pytest.mark.parametrize(
    "host", ["", " ", "bad host!", "-a", "a-", "a..b", "a_b", "300.1.1.1", "10.0.0", "x" * 64, "auto\n", "[::1]"]
)
def test_listen_hosts_no_agent_can_bind_are_refused(host: str) -> None:
    with pytest.raises(ValidationError, match="valid: an IPv4 or IPv6 address, a host name"):
        Transport(listen_host=host)
    with pytest.raises(ValidationError, match="valid: an IPv4 or IPv6 address, a host name"):
        Network(bandwidth_gbps=1, listen_host=host)


def test_job_dir_is_relative_to_the_job_file_as_its_other_paths_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job launched from two directories goes to one job dir."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "jobs" / "job.yaml").write_text(JOB + "job_dir: ../runs/j1\n")
    for cwd in (tmp_path, tmp_path / "jobs"):
        monkeypatch.chdir(cwd)
        assert load_job(Path("jobs/job.yaml" if cwd == tmp_path else "job.yaml")).spec.job_dir == str(
            tmp_path / "runs" / "j1"
        )


def test_job_dir_s_description_says_where_the_default_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its description said 'default: runs/<name>-<time>; relative to the job file': the default is under the
    directory rlctl is run from, or $RLCTL_HOME, never the job file's."""
    from rlctl.config.job import JobFile
    from rlctl.launch.jobdir import JobDir

    monkeypatch.delenv("RLCTL_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert JobDir.choose_path("j").parent == tmp_path / "runs"
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    assert JobDir.choose_path("j").parent == tmp_path / "home" / "runs"
    said = JobFile.model_fields["job_dir"].description or ""
    assert "default: runs/<name>-<time> in the directory rlctl is run from ($RLCTL_HOME/runs/" in said
    assert "not the job file's" in said


def test_an_inventory_path_under_home_is_read_there_as_model_path_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`inventory: [~/clusters/inv.yaml]` was 'no such file' (the job file's directory joined with a literal ~)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "inv.yaml").write_text(GOOD_INV)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text(
        JOB.replace("inventory: [inv.yaml]", "inventory: [~/clusters/inv.yaml]")
    )
    assert list(load_job(tmp_path / "jobs" / "job.yaml").inventory.sites) == ["h20"]


def test_a_whole_number_past_2_63_in_a_list_is_found_where_it_lies() -> None:
    """What a list field without a bound of its own says (nodes[].devices has one now: `CASES`)."""
    from rlctl.config.base import huge_int

    assert huge_int({"a": [0, 2**63 - 1]}) is None
    assert huge_int({"a": [0, -(2**64)]}) == (
        ("a", 1),
        f"{-(2**64)} is past the largest whole number rlctl takes, 2^63 - 1 (9223372036854775807)",
    )


def test_sbatch_options_take_a_value_or_true_and_a_whole_number_as_its_digits() -> None:
    """What `CASES` refuses aside, an option is passed as given: a value, true for a flag, `nice: 10` as '10'; and a
    job's record reads back as launched, past names refused since (its stop and resume read it)."""
    from rlctl.config.inventory import RECORDED
    from rlctl.config.schedulers import SlurmScheduler

    opts = {"comment": "rl&x y", "requeue": True, "nice": 10, "mem-bind": "local", "time-min": "60"}
    s = SlurmScheduler.model_validate({"kind": "slurm", "partition": "p", "sbatch_options": opts})
    assert s.sbatch_options == {
        "comment": "rl&x y",
        "requeue": True,
        "nice": "10",
        "mem-bind": "local",
        "time-min": "60",
    }
    assert (s.constraint, s.reservation, s.exclusive) == (None, None, False)
    recorded = {"kind": "slurm", "partition": "p", "sbatch_options": {"partition": "x"}}
    assert SlurmScheduler.model_validate(recorded, context=RECORDED).sbatch_options == {"partition": "x"}
    with pytest.raises(ValidationError, match="line break"):
        SlurmScheduler.model_validate({**recorded, "sbatch_options": {"comment": "a\nb"}}, context=RECORDED)
