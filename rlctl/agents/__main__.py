"""Agent entry point, as launch backends start it:

    python -m rlctl.agents controller --job-dir DIR [--listen tcp://127.0.0.1:0]
    python -m rlctl.agents rollout    --job-dir DIR --replica N [--controller ADDR]
    python -m rlctl.agents trainer    --job-dir DIR --replica RANK [--controller ADDR]

DIR is the job's directory on the agent's own site (sites share no filesystem: `rlctl launch` stages
job.json, plan.json, sites.json, secret, model/, data/, reward/ there, see rlctl.launch.stage); a leading `~` is
this user's home. The job comes from DIR/job.json, the per-job secret from DIR/secret, the
controller's address from --controller (the launcher passes it), else DIR/controller.json.
Trainer ranks find each other through MASTER_ADDR / MASTER_PORT /
WORLD_SIZE (set by the backend). The launcher's other variables (`rlctl.launch.agentenv`):
RLCTL_PARALLEL (role, tp/pp/dp, rank or replica) and CUDA_VISIBLE_DEVICES go into the first log
line; torch uses OMP_NUM_THREADS threads (the launcher's figure: the job's rollout.threads_per_unit /
trainer.threads_per_rank, else the site's cores for the agent's GPU slots; 1 for the controller). SIGTERM ends
the agent cleanly; exit 0 = the job finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from rlctl.errors import RlctlError
from rlctl.exits import end_after
from rlctl.textutil import home_expanded

ENV_LOG_LEVEL = "RLCTL_LOG_LEVEL"  # an agent's log level (a site's `setup` may export it): DEBUG, INFO, WARNING, …
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # as said; logging's other names (WARN, …) are taken too


def log_level(text: str | None) -> tuple[str, str | None]:
    """The agent's log level from `RLCTL_LOG_LEVEL` (any case; unset or empty: INFO), and a line saying why another
    value is not one (INFO then), versus logging's ValueError ("Unknown level: 'verbose'"): a traceback as the agent
    started, its job not run."""
    if not text or not text.strip():
        return "INFO", None
    name = text.strip().upper()
    if name in logging.getLevelNamesMapping():
        return name, None
    return "INFO", f"{ENV_LOG_LEVEL}={text!r} is not a log level ({', '.join(LEVELS)}): logging at INFO"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlctl.agents")
    ap.add_argument("role", choices=["controller", "rollout", "trainer"])
    ap.add_argument("--job-dir", type=Path, required=True)
    ap.add_argument("--replica", type=int, default=None, help="default: $SLURM_PROCID, else 0")
    ap.add_argument("--controller", default=None, help="controller RPC address (default: DIR/controller.json)")
    ap.add_argument("--listen", default=None, help="controller: address to listen on")
    args = ap.parse_args(argv)
    try:  # (Path.expanduser raised RuntimeError of `~nosuchuser/…`, a traceback)
        args.job_dir = Path(home_expanded(str(args.job_dir)))
    except ValueError as e:
        print(f"{ap.prog}: error: --job-dir {args.job_dir}: {e}", file=sys.stderr)
        return 2
    if args.replica is None:  # a SLURM task: every rank runs the same command line
        args.replica = int(os.environ.get("SLURM_PROCID", "0"))
    level, level_problem = log_level(os.environ.get(ENV_LOG_LEVEL))
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {args.role}-{args.replica} %(name)s: %(message)s",
    )
    from rlctl.launch.agentenv import ENV_VISIBLE, code_mismatch, parallel_from_env, threads_for

    log = logging.getLogger("rlctl.agents")
    if level_problem is not None:
        log.warning("%s", level_problem)
    mismatch = code_mismatch()
    if mismatch is not None:  # before anything of the job is touched: another rlctl speaks another protocol
        log.error("on %s: %s", os.uname().nodename, mismatch)
        return 2
    try:
        parallel = parallel_from_env()
    except ValueError as e:
        log.error("%s", e)
        return 2
    # the first line of every agent's log: where it runs, on which GPUs, its place in the layout
    log.info(
        "starting on %s, pid %d, job %s, parallel %s, %s=%s",
        os.uname().nodename,
        os.getpid(),
        args.job_dir,
        json.dumps(parallel, sort_keys=True) if parallel else "-",
        ENV_VISIBLE,
        os.environ.get(ENV_VISIBLE, "(unset)"),
    )
    signal.signal(signal.SIGTERM, _on_sigterm)  # unwind `finally` blocks: stop peers, write files

    from rlctl.agents.common import AgentContext
    from rlctl.launch.jobdir import JobDir
    from rlctl.transport import make_transport

    try:
        # the launcher's figure (its site's cores for the agent's GPU slots); else the job's, else 1
        launched = os.environ.get("OMP_NUM_THREADS")
        threads = int(launched) if launched else threads_for(JobDir(args.job_dir).read_job(), args.role)
        if args.role == "controller":
            # no torch before it listens (≈ 2.4 s of every start, which the launcher waits for before it starts the
            # other agents): it loads with the first tensor frame, samples, and takes its threads from the variable
            os.environ["OMP_NUM_THREADS"] = str(threads)
            log.info("torch threads %d (intra-op, once a sample loads it)", threads)
        else:
            import torch  # after argument parsing: `--help` stays fast

            torch.set_num_threads(threads)
            torch.set_num_interop_threads(1)
            log.info("torch threads %d (intra-op), 1 (inter-op)", threads)
        if args.role == "controller":
            from rlctl.agents.controller import ControllerAgent

            jd = JobDir(args.job_dir)
            job = jd.read_job()
            if args.listen is None:
                from rlctl.agents.listen import controller_listen_host
                from rlctl.launch.agentenv import ENV_SITE
                from rlctl.launch.backends import read_sites

                host = controller_listen_host(job, read_sites(args.job_dir), os.environ.get(ENV_SITE))
                args.listen = f"{job.transport.kind}://{host}:0"
            listen = args.listen
            transport = make_transport(job.transport.kind, secret=jd.secret(), encrypt=job.transport.encrypt)
            agent = ControllerAgent(jd, job, transport, listen=listen)
            return agent.run()
        from rlctl.devices import agent_compute

        compute = agent_compute()  # a GPU site's agent that cannot see CUDA stops here, in one line
        log.info("computing on %s", compute.device)
        ctx = AgentContext.load(args.job_dir, controller=args.controller)
        if args.role == "rollout":
            from rlctl.agents.rollout import RolloutAgent

            RolloutAgent(ctx, replica=args.replica, compute=compute).run()
            return 0
        from rlctl.agents.trainer import TrainerAgent, init_group

        world = int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "1")
        store = init_group(
            rank=args.replica,
            world_size=world,
            master_addr=os.environ.get("MASTER_ADDR") or _first_node(),
            master_port=int(os.environ["MASTER_PORT"]),
            cuda=compute.is_cuda,
            secret=ctx.jobdir.secret(),
        )
        TrainerAgent(ctx, rank=args.replica, compute=compute, store=store).run()
        return 0
    except RlctlError as e:
        log.error("%s%s", e, f" ({e.hint})" if e.hint else "")
        return 1
    finally:
        _log_cpu()


def _on_sigterm(*_: object) -> None:
    # says why a run ended: `stopped` (a stop was asked for) or `failed: controller got SIGTERM` (ControllerAgent.run)
    logging.getLogger("rlctl.agents").warning("SIGTERM: stopping")
    sys.exit(143)


def _log_cpu() -> None:
    """The last line of every agent's log: CPU it used and how often it was preempted (a busy host)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    logging.getLogger("rlctl.agents").info(
        "cpu %.1f s (user %.1f, sys %.1f), %d involuntary context switches",
        ru.ru_utime + ru.ru_stime,
        ru.ru_utime,
        ru.ru_stime,
        ru.ru_nivcsw,
    )


def _first_node() -> str:
    """Rank 0's host in a SLURM allocation (the first node of $SLURM_JOB_NODELIST, by its name or, where that does
    not resolve, its SLURM NodeAddr), else this host."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return "127.0.0.1"
    from rlctl.agents.listen import slurm_master_addr

    return slurm_master_addr(nodelist)


if __name__ == "__main__":
    end_after(main)  # a trainer rank (its group formed) ends without the interpreter's finalization: rlctl.exits
