#!/bin/bash
# rlctl job demo: trainer-0 on site h800 (submit: sbatch --parsable < this file)
#SBATCH --job-name=rlctl-demo-trainer
#SBATCH --partition=h800
#SBATCH --account=rl
#SBATCH --qos=high
#SBATCH --nodes=2
#SBATCH --ntasks=16
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --gpus-per-task=1
#SBATCH --time=720
#SBATCH --output=/shared/runs/demo/logs/trainer-0.log
#SBATCH --open-mode=append
#SBATCH --signal=B:TERM@45
#SBATCH --chdir=/shared/runs/demo
set -u
export NCCL_SOCKET_IFNAME=ib0
export QUOTED='a b'"'"'c'
export RLCTL_ROLE=trainer
# every rank: rank = $SLURM_PROCID, world size = $SLURM_NTASKS, hosts = $SLURM_JOB_NODELIST
srun --label --unbuffered --kill-on-bad-exit=1 --cpus-per-task=12 python3 -m rlctl.agents trainer --job-dir /shared/runs/demo &
srun_pid=$!
# a TERM to srun kills the step at once: the batch shell takes it and hands it to the agents
trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM
wait "$srun_pid"; rc=$?
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; rc=$?; done
exit "$rc"
