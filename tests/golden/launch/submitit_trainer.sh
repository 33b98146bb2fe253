#!/bin/bash

# Parameters
#SBATCH --account=rl
#SBATCH --cpus-per-task=12
#SBATCH --gpus-per-task=1
#SBATCH --job-name=rlctl-demo-trainer
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/demo/slurm/trainer-0/%j/%j_0_log.out
#SBATCH --partition=h800
#SBATCH --qos=high
#SBATCH --signal=TERM@45
#SBATCH --time=720
#SBATCH --wckey=submitit

# setup
export NCCL_SOCKET_IFNAME=ib0
export QUOTED='a b'"'"'c'
export RLCTL_ROLE=trainer
cd /shared/runs/demo

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /shared/runs/demo/slurm/trainer-0/%j/%j_%t_log.out --kill-on-bad-exit=1 --cpus-per-task=12 python3 -u -m submitit.core._submit /shared/runs/demo/slurm/trainer-0/%j
