#!/usr/bin/env bash
# The main job: a small CNN on sklearn's digits, 4 Horovod ranks on this machine, injected
# exponential straggler delays, trained under DGD, PGC-CR and BCGC in turn (s = 1).
#
#   bash launch/demo.sh [--out DIR] [--force] [--steps N] [--delay SPEC] [--compute-time S]
#                       [--lr LR] [--momentum M] [--np N] [--schemes "dgd pgc-cr bcgc"]
#                       [--target-loss L] [--skip-setup]
#
# Defaults: 300 steps of plain SGD (lr 0.5, no momentum, the PGC paper's optimizer; heavy momentum
# on top of PGC's one-step-stale partition gradients costs accuracy), batch 32 per partition,
# 50 ms of emulated compute per partition evaluated (a GPU's forward/backward; the CNN itself
# takes a few ms), and exponential straggler delays of mean 100 ms per rank and step, seeded, so
# every scheme faces the same schedule. About 4-5 minutes on 2 cores.
#
# Prints, per scheme, time per step, time to the target loss and final test accuracy, and writes
# into DIR (default runs/demo; a non-empty DIR is refused without --force):
#   DIR/<scheme>/records.jsonl   one step record per step (the simulator's format)
#   DIR/<scheme>/summary.json    time per step, time to target loss, final loss and accuracy
#   DIR/summary.json             the three summaries;  DIR/report.md, DIR/report.png
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/runs/demo"
FORCE=0
STEPS=300
NP=4
DELAY="exp:mean=0.1,seed=1"
COMPUTE=0.05
LR=0.5
MOMENTUM=0
SCHEMES="dgd pgc-cr bcgc"
TARGET=0.3
SETUP=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --force) FORCE=1; shift ;;
    --steps) STEPS="$2"; shift 2 ;;
    --delay) DELAY="$2"; shift 2 ;;
    --np) NP="$2"; shift 2 ;;
    --compute-time) COMPUTE="$2"; shift 2 ;;
    --lr) LR="$2"; shift 2 ;;
    --momentum) MOMENTUM="$2"; shift 2 ;;
    --skip-setup) SETUP=0; shift ;;
    --schemes) SCHEMES="$2"; shift 2 ;;
    --target-loss) TARGET="$2"; shift 2 ;;
    -h|--help) sed -n 2,21p "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -d "$OUT" && -n "$(ls -A "$OUT" 2>/dev/null)" && $FORCE -eq 0 ]]; then
  echo "demo.sh: $OUT is not empty; pass --force to overwrite it or --out NEW_DIR" >&2
  exit 1
fi

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
HVDRUN="$(dirname "$PY")/horovodrun"
[[ $FORCE -eq 1 ]] && rm -rf "$OUT"
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
for scheme in $SCHEMES; do
  S=1; [[ $scheme == dgd ]] && S=0   # dgd waits for every rank: it takes s = 0 only
  echo "== $scheme: $NP ranks, s=$S, $STEPS steps, SGD lr $LR momentum $MOMENTUM, compute" \
       "${COMPUTE}s/partition, delays $DELAY"
  timeout 300 "$HVDRUN" --gloo -np "$NP" -H "localhost:$NP" --network-interface lo "$PY" -m pgc_hvd train \
      --scheme "$scheme" --stragglers "$S" --dataset digits --model cnn --steps "$STEPS" \
      --batch-size 32 --lr "$LR" --momentum "$MOMENTUM" --compute-time "$COMPUTE" \
      --delay "$DELAY" --target-loss "$TARGET" --progress-every 50 \
      --out "$OUT/$scheme" --force 2>"$OUT/$scheme.stderr.log" \
    | sed -u -n 's/^\[0\]<stdout>://p'
done
"$PY" - "$OUT" $SCHEMES <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
allsum = {s: json.loads((out / s / "summary.json").read_text()) for s in sys.argv[2:]}
(out / "summary.json").write_text(json.dumps(allsum, indent=2) + "\n")
print(f"\n{'scheme':<8} {'ms/step':>8} {'time to loss':>13} {'test acc':>9}")
for s, d in allsum.items():
    ttt = d["time_to_target_s"]
    # float(): summaries store non-finite values as "nan" / "inf" (valid JSON)
    print(f"{s:<8} {float(d['time_per_step_s']) * 1e3:8.1f} "
          f"{('%.2fs' % float(ttt)) if ttt is not None else 'not reached':>13} "
          f"{float(d['final_test_accuracy']):9.3f}   (target loss {d['target_loss']})")
PYEOF
"$PY" -m pgc_hvd report "$OUT"
echo "== done in $(( $(date +%s) - START ))s (plus set-up); outputs in $OUT"
