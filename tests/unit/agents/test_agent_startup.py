"""A rollout unit's start imports what generating needs and no more: not torch's compiler stack (torch._dynamo,
sympy) nor DTensor (torch.distributed.tensor), which its model's construction on the meta device and the weight
plane's FSDP checks pulled in — about 3 s of CPU per unit on 2 cores (every `scale +1`, every replacement). The
controller starts without torch at all (it loads with the first sample's tensor frames, after it listens)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

HEAVY = ("torch._dynamo", "torch.distributed.tensor", "sympy")


def test_a_rollout_units_imports_and_empty_model_leave_the_compiler_stack_unloaded() -> None:
    code = (
        "import sys, torch\n"
        "import rlctl.agents.rollout\n"
        "from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig\n"
        "m = TinyGPT.empty(TinyGPTConfig(tie_word_embeddings=True), dtype=torch.bfloat16, device='cpu')\n"
        "assert m.lm_head.weight is m.model.embed_tokens.weight and m.rope_cos.dtype == torch.bfloat16\n"
        "assert m.lm_head.weight.dtype == torch.bfloat16 and m.rope_cos.shape[0] == m.config.max_position_embeddings\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_model_built_empty_initialises_its_parameters_when_built_normally_again() -> None:
    """The initialisers are skipped only inside `empty` (they are restored after it)."""
    import torch

    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

    TinyGPT.empty(TinyGPTConfig(), dtype=torch.float32, device="cpu")
    torch.manual_seed(0)
    a = TinyGPT(TinyGPTConfig())
    torch.manual_seed(0)
    b = TinyGPT(TinyGPTConfig())
    w, std = a.model.embed_tokens.weight, a.config.initializer_range
    assert torch.equal(w, b.model.embed_tokens.weight) and 0.5 * std < float(w.detach().std()) < 2 * std


# the controller's modules, the agents' entry and the CLI's, imported in a fresh interpreter; a tensorless message
# checked as the controller checks each it reads (`recv_checked`)
CONTROLLER_IMPORTS = """
import sys
import rlctl.agents.controller, rlctl.agents.__main__, rlctl.cli
from rlctl.agents.messages import check, make
check(make("heartbeat", {"name": "rollout-0", "state": "running"}), peer="rollout-0", kinds=["heartbeat"])
print("TORCH", "torch" in sys.modules)
"""


def test_the_controllers_modules_and_the_cli_entry_do_not_import_torch() -> None:
    # rlctl.agents.messages (the protocol's tensor checks) and rlctl.engines.base (`Prefix`, for the ledger) imported
    # torch: ≈ 2.4 s and ≈ 250 MB of every controller start, which the launcher waits for before the other agents
    proc = subprocess.run(
        [sys.executable, "-c", CONTROLLER_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["TORCH", "False"], proc.stdout


# `python -m rlctl.agents controller` up to its ControllerAgent (a stand-in that records what the process had then)
CONTROLLER_MAIN = """
import os, sys
from pathlib import Path
import rlctl.agents.controller as controller
from rlctl.agents.__main__ import main
from rlctl.config import load_job
from rlctl.launch.jobdir import JobDir

class Recorder:
    def __init__(self, jobdir, job, transport, *, listen):
        self.listen = listen

    def run(self):
        print("TORCH", "torch" in sys.modules, "THREADS", os.environ.get("OMP_NUM_THREADS"), "LISTEN", self.listen)
        return 0

controller.ControllerAgent = Recorder
jd = JobDir.create("j", explicit=Path(sys.argv[1]))
jd.write_job(load_job(Path("jobs/demo.yaml")).spec, source="demo.yaml")
sys.exit(main(["controller", "--job-dir", str(jd.path), "--listen", "tcp://127.0.0.1:0"]))
"""


def test_the_controller_agent_starts_without_torch_and_leaves_its_threads_to_the_variable(tmp_path: Path) -> None:
    # the agents' entry imported torch for every role to set its threads; the controller's come from
    # OMP_NUM_THREADS when a sample loads torch (threads_for: 1)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(
        [sys.executable, "-c", CONTROLLER_MAIN, str(tmp_path / "j1")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["TORCH", "False", "THREADS", "1", "LISTEN", "tcp://127.0.0.1:0"], proc.stdout


# the real controller, its metrics.port held by another server (argv: job dir, port)
CONTROLLER_PORT_TAKEN = """
import sys
from pathlib import Path
from rlctl.agents.__main__ import main
from rlctl.config import load_job
from rlctl.launch.jobdir import JobDir

jd = JobDir.create("j", explicit=Path(sys.argv[1]))
spec = load_job(Path("jobs/demo.yaml")).spec
metrics = spec.metrics.model_copy(update={"port": int(sys.argv[2])})
jd.write_job(spec.model_copy(update={"metrics": metrics}), source="x")
sys.exit(main(["controller", "--job-dir", str(jd.path), "--listen", "tcp://127.0.0.1:0"]))
"""


def test_a_controller_whose_metrics_port_is_taken_ends_in_one_line_naming_it_that_launch_quotes(tmp_path: Path) -> None:
    # it ended on a 15-line traceback ending "OSError: [Errno 98] Address already in use", naming neither the
    # setting nor the address; launch's error quoted nothing of it
    from rlctl.ops.runbase import last_error

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-c", CONTROLLER_PORT_TAKEN, str(tmp_path / "j"), str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    want = f": metrics.port {port}: cannot serve /metrics on 127.0.0.1:{port} (Address already in use) (set"
    assert last_error(proc.stderr).startswith(want), proc.stderr[-2000:]


def test_an_agents_log_level_is_read_in_any_case_and_a_wrong_one_logs_at_info_with_a_line() -> None:
    """`RLCTL_LOG_LEVEL` (an agent's log level, e.g. exported by a site's `setup`): `debug` is DEBUG; `verbose` is
    no level, so the agent logs at INFO and says so, versus logging's ValueError as the agent started."""
    from rlctl.agents.__main__ import log_level

    assert log_level(None) == ("INFO", None) and log_level("") == ("INFO", None)
    assert log_level(" debug ") == ("DEBUG", None) and log_level("Warn") == ("WARN", None)
    level, problem = log_level("verbose")
    assert level == "INFO"
    levels = "DEBUG, INFO, WARNING, ERROR, CRITICAL"
    assert problem == f"RLCTL_LOG_LEVEL='verbose' is not a log level ({levels}): logging at INFO"


def test_an_agent_started_with_a_wrong_log_level_logs_its_line_and_goes_on(tmp_path: Path) -> None:
    """Through the entry point: the agent gets as far as its job dir (none here: exit 2, one line), past the level."""
    env = {**os.environ, "RLCTL_LOG_LEVEL": "verbose", "PYTHONPATH": str(ROOT)}
    env.pop("RLCTL_CODE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl.agents", "controller", "--job-dir", str(tmp_path / "none")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "RLCTL_LOG_LEVEL='verbose' is not a log level" in proc.stderr
    assert proc.returncode != 0
