#!/usr/bin/env bash
# The main job: what a user buys. Horovod's own hvd.DistributedOptimizer (its usual DataLoader +
# DistributedSampler loop) against pgc_hvd's pgc-cr and bcgc with their defaults (s = 1), on the
# same model, data, initialisation and seeded straggler delays: a small CNN on scikit-learn's
# digits, 4 Horovod ranks on this machine, SGD momentum 0.9. Prints each scheme's time per step,
# steps and seconds to 95% validation accuracy, final validation accuracy and its ratios to
# Horovod's. About 5 minutes on 2 cores after set-up; nothing is downloaded.
#
# --engine torch: the same comparison under torchrun (no Horovod on the ranks): torch's own
# DistributedDataParallel (scheme ddp, its DataLoader + DistributedSampler loop, the baseline)
# against pgc-cr and bcgc through pgc_hvd's DDP door (pgc_hvd.DistributedDataParallel +
# CodedSampler + model.distributed_optimizer); ratios to DDP's (columns "/ ddp").
#
#   bash launch/demo.sh [--skip-setup] [--out DIR] [--force] [--engine horovod|torch]
#                       [--schemes "hvd pgc-cr bcgc"]
#                       [--np N] [--steps N] [--optimizer sgd|adam] [--lr LR] [--momentum M]
#                       [--delay PATTERN|SPEC] [--compute-time S] [--target ACC]
#                       [--eval-every N] [--batch-size B] [--seed N] [--progress-every N]
#                       [--timeout S] [--quick]
#
# Defaults: 200 steps per scheme; SGD lr 0.05 momentum 0.9 (--optimizer adam: Adam lr 3e-3);
# a batch of 16 per rank (pgc_hvd: per partition); 0.1 s of emulated GPU compute per batch (a
# sleep between forward and backward, as a GPU leaves the CPU free); --delay exp: Exp(mean =
# compute time) per rank and step, seeded by --seed (the patterns of pgc_hvd.delays.PATTERNS:
# none, exp, slow-rank or slow (rank (seed + 1) % np 4x slow), two-class, heavy-tail or pareto,
# transient, lognormal; or a delay spec such as exp:mean=0.2,seed=3); validation accuracy every 5 steps,
# not timed; target 0.95. --quick is the smallest mode (10 steps, 0.01 s compute; the test
# suite runs it). --skip-setup skips launch/setup.sh. Any scheme of pgc_hvd can join
# (--schemes "hvd dgd pgc-cr bcgc"; with --engine torch: --schemes "ddp dgd pgc-cr bcgc").
#
# Writes into DIR (default runs/demo; a non-empty DIR is refused without --force):
#   DIR/summary.json             per scheme: time per step, busy seconds, steps and seconds to
#                                the target, final accuracy, ratios to Horovod (DDP with
#                                --engine torch), accuracy curve
#   DIR/<scheme>/run.json        the run as rank 0 measured it (every step's seconds)
#   DIR/<scheme>/records.jsonl   pgc_hvd's step records (for pgc-hvd report / advise)
#   DIR/report.md, DIR/report.png (validation accuracy vs time; step-time distribution)
# The Python behind it: pgc_hvd/apps/demo.py (`pgc-hvd demo`), on pgc_hvd/apps/tta.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SETUP=1
ARGS=()
for a in "$@"; do
  case "$a" in
    --skip-setup) SETUP=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$a") ;;
  esac
done

if [[ $SETUP -eq 1 ]]; then
  echo "== set-up (launch/setup.sh): verifies the environment in seconds; the first run, or one"
  echo "   after csrc/ changed, compiles horovod and/or pgc_hvd._C (minutes; progress below)"
  bash "$ROOT/launch/setup.sh" &
  SETUP_PID=$!
  SETUP_T0=$(date +%s)
  # a heartbeat while set-up works quietly (compiler output goes to its log files)
  while kill -0 "$SETUP_PID" 2>/dev/null; do
    for _ in $(seq 20); do kill -0 "$SETUP_PID" 2>/dev/null || break; sleep 1; done
    kill -0 "$SETUP_PID" 2>/dev/null && echo "[setup]   ... still working ($(( $(date +%s) - SETUP_T0 ))s;" \
      "logs in ${PGC_HVD_VENV:-$ROOT/.venv}/pgc-hvd-setup-logs)"
  done
  wait "$SETUP_PID" || { echo "demo.sh: set-up failed (see above)" >&2; exit 1; }
fi
PY="${PGC_HVD_VENV:-$ROOT/.venv}/bin/python"
export OMP_NUM_THREADS=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# the default --out is the repository's runs/demo; a later --out wins
exec "$PY" -m pgc_hvd demo --out "$ROOT/runs/demo" ${ARGS[@]+"${ARGS[@]}"}
