"""The operator's commands start without the runtime: `--help`, `version`, `check`, `plan`, `launch --dry-run`,
`status`, `stop`, `scale`, `logs`, `pull` and `report` never import torch (seconds on a login node, every call);
only a `launch` that starts a job (its SFT warm-up) and the agents do. Each command runs in a fresh interpreter
through the real entry point; a job that is not in the index still goes as far as asking for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import sys
from rlctl.cli import main
sys.argv = ["rlctl", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print("TORCH", "torch" in sys.modules, "EXIT", code, file=sys.stderr)
"""

COMMANDS = [
    ["--help"],
    ["version"],
    ["check", "jobs/demo.yaml"],
    ["check", "clusters/local.yaml", "--reach"],
    ["plan", "jobs/demo.yaml", "-o", "json"],
    ["launch", "jobs/demo.yaml", "--dry-run"],
    ["status", "--all"],
    ["status", "no-such-job"],
    ["stop", "no-such-job"],
    ["scale", "no-such-job", "--rollout", "+1"],
    ["report", "no-such-job"],
    ["logs", "no-such-job"],
    ["pull", "no-such-job"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_the_operator_s_commands_do_not_import_torch(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "RLCTL_HOME": str(tmp_path / "home")}  # an empty job index
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    last = proc.stderr.strip().splitlines()[-1]
    torch_loaded, code = last.split()[1], last.split()[3]
    assert code in ("0", "2", "None"), proc.stderr[-2000:]  # a job not in the index: one line, exit 2
    assert torch_loaded == "False", f"rlctl {' '.join(args)} imported torch"


TENSORLESS_RPC = """
import sys, threading
from rlctl.transport import Message, make_transport

t = make_transport("tcp", secret=b"s" * 32)
with t.listen("tcp://127.0.0.1:0") as lst:
    def serve():
        conn = lst.accept(timeout_s=30)
        req = conn.recv(timeout_s=30)
        conn.reply(req, Message("status", {"state": "running"}))
    server = threading.Thread(target=serve)
    server.start()
    reply = t.connect(lst.address, timeout_s=30).request(Message("status", {}), timeout_s=30)
    server.join()
print("REPLY", reply.header["state"], "TORCH", "torch" in sys.modules)
"""


def test_a_request_and_reply_without_tensors_do_not_import_torch() -> None:
    """What `rlctl status`, `stop` and `scale` send a live job's controller: torch loads with the first tensor."""
    proc = subprocess.run([sys.executable, "-c", TENSORLESS_RPC], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["REPLY", "running", "TORCH", "False"], proc.stdout


INTERRUPTED_IMPORT = """
import importlib, sys, tomllib
class CtrlC:  # Ctrl-C while the CLI's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "rlctl.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
module, _, func = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]["rlctl"].partition(":")
sys.argv = ["rlctl", "status", "--all"]
getattr(importlib.import_module(module), func)()
"""


def test_a_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130() -> None:
    # the console script imported rlctl.cli before any guard: a Ctrl-C in the first second was a traceback
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stderr) == (130, "rlctl: interrupted\n")
