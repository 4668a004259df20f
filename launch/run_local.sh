#!/usr/bin/env bash
# Local launcher: N gloo ranks on this machine (gloo on the loopback interface) running a pgc_hvd
# training command.
#
#   bash launch/run_local.sh N [pgc-hvd train args...]
#   bash launch/run_local.sh 4 --scheme pgc-cr --stragglers 1 --steps 80 --delay exp:mean=0.1 --out runs/x
#   SCRIPT=launch/resnet18_cifar10.py bash launch/run_local.sh 2 --data-dir /data/cifar --out runs/r
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NP="${1:?usage: run_local.sh N [args...]}"; shift
PY="${PGC_HVD_VENV:-$ROOT/.venv}/bin/python"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n "${SCRIPT:-}" ]]; then
  exec timeout "${TIMEOUT:-3600}" "$(dirname "$PY")/horovodrun" --gloo -np "$NP" -H "localhost:$NP" --network-interface lo "$PY" "$SCRIPT" "$@"
fi
exec timeout "${TIMEOUT:-3600}" "$(dirname "$PY")/horovodrun" --gloo -np "$NP" -H "localhost:$NP" --network-interface lo "$PY" -m pgc_hvd train "$@"
