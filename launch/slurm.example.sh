#!/usr/bin/env bash
# SLURM example: 2 nodes x 4 GPUs, one rank per GPU, PGC-CR with s=2 on ResNet-18 / CIFAR-10.
#   sbatch launch/slurm.example.sh /path/to/cifar-10-batches-py
#SBATCH --job-name=pgc-hvd
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
set -euo pipefail
ROOT="${PGC_HVD_ROOT:-$SLURM_SUBMIT_DIR}"
DATA="${1:?usage: sbatch slurm.example.sh CIFAR_DIR}"
PY="$ROOT/.venv/bin/python"
# Horovod reads the allocation from a hostfile built from SLURM's node list.
HOSTFILE="$(mktemp)"
scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/ slots=$SLURM_NTASKS_PER_NODE/" > "$HOSTFILE"
export OMP_NUM_THREADS="$SLURM_CPUS_PER_TASK" PYTHONPATH="$ROOT"
"$ROOT/.venv/bin/horovodrun" -np "$SLURM_NTASKS" --hostfile "$HOSTFILE" \
  "$PY" "$ROOT/launch/resnet18_cifar10.py" --data-dir "$DATA" --scheme pgc-cr --stragglers 2 \
  --steps 5000 --out "$ROOT/runs/slurm-$SLURM_JOB_ID"
