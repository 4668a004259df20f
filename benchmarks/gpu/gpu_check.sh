#!/usr/bin/env bash
# GPU check of pgc_hvd, for a machine where the repository is already built with CUDA
# (bash launch/setup.sh; venv at .venv): the kernels (CUDA tests, memcheck, the CUDA benchmark
# table, where one top-k's time goes), then training on CUDA tensors (benchmarks/gpu/gpu_check_runs.py:
# train runs under torchrun on the torch engine, ResNet-18 beside DDP, NCCL, fp16 + AMP).
#
#   bash benchmarks/gpu/gpu_check.sh          # from the repository root; writes $OUT/gpu_report.md,
#                                         # $OUT/topk_profile.md, $OUT/gpu_runs.{json,log} when
#                                         # OUT is set, and prints everything to stdout
#   bash benchmarks/gpu/gpu_check.sh --only kernels|train     # one half (a rerun of what failed)
#   bash benchmarks/gpu/gpu_check.sh --rehearse               # on a CPU machine: every step, on the
#        CPU where it can run there (ops_report/topk_profile --device cpu, the runs --device cpu),
#        skipped where it cannot (memcheck, NCCL); about 2 minutes on 2 cores
# About 5-7 minutes on an H200; the kernel steps are capped at 120, 90, 150 (memcheck), 90 and
# 90 s, the training runs at 420 s. The report times the CUDA radix-select variants
# ("[host walk]", "[no compaction]" rows) next to the default.
# On the workplace's GPU machine (torch 2.11 at /opt/torch/.venv, CXX=/opt/gcc/bin/g++ by default,
# which links libstdc++ statically and is refused by CMakeLists.txt), build and check in one go:
#   PGC_HVD_VENV=/opt/torch/.venv bash benchmarks/gpu/gpu_check.sh --build
# --build first runs, with the system compilers (about 50 s on 16 cores; log in $OUT/build.log),
#   CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ \
#     python -m pip install --no-build-isolation --no-deps -e .
# Prints: the GPU, the pytest summaries (failures listed), one markdown table (ops_report.py;
# $OUT/gpu_report.md), where one top-k's time goes (topk_profile.py; $OUT/topk_profile.md), then
# the training runs' table (gpu_check_runs.py; $OUT/gpu_runs.json, the runs' output tails in
# $OUT/gpu_runs.log).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PGC_HVD_VENV:-.venv}/bin/python"
rc=0
XDIST=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n 8)

BUILD=0; REHEARSE=0; ONLY=all
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD=1 ;;
    --rehearse) REHEARSE=1 ;;
    --only) ONLY="${2:-}"; shift ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --build, --rehearse, --only kernels|train)"
       exit 2 ;;
  esac
  shift
done
case "$ONLY" in all|kernels|train) ;; *) echo "gpu_check.sh: --only kernels or train, got '$ONLY'"; exit 2 ;; esac
DEV=cuda
[[ $REHEARSE -eq 1 ]] && DEV=cpu

if [[ $BUILD -eq 1 ]]; then
  build_log="${OUT:-/tmp}/build.log"
  mkdir -p "$(dirname "$build_log")"
  echo "== build (log: $build_log)"
  if ! CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      timeout 240 "$PY" -m pip install --no-build-isolation --no-deps -v -e . >"$build_log" 2>&1; then
    echo "build failed; its last messages:"
    grep -iE "error|fatal" "$build_log" | tail -30
    exit 2
  fi
fi

echo "== GPU: $(nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv,noheader 2>/dev/null || echo unknown)"
"$PY" -c 'import torch, pgc_hvd._C as C; print("== torch", torch.__version__, "| cuda", torch.cuda.is_available(), "| pgc_hvd._C CUDA kernels:", C.cuda_compiled())' || exit 2

if [[ $REHEARSE -eq 1 ]]; then
  echo "== rehearsal on the CPU: the CUDA tests skip, memcheck and NCCL are skipped, the reports"
  echo "   and the training runs run with --device cpu"
fi

if [[ "$ONLY" != train ]]; then
echo "== pytest -m gpu: tests/ops (device-side radix walk, the default), train --device, the torch engine on NCCL"
timeout 120 "$PY" -m pytest tests/ops tests/runtime/test_train_device.py tests/torchdist/test_backend.py \
  -m gpu -q "${XDIST[@]}" \
  -p no:cacheprovider -o addopts="" -rf 2>&1 \
  | tail -40
rc=${PIPESTATUS[0]}

echo "== pytest top-k and error-feedback GPU tests (PGC_HVD_CUDA_TOPK_WALK=host)"
PGC_HVD_CUDA_TOPK_WALK=host timeout 90 "$PY" -m pytest tests/ops/test_topk.py \
  tests/ops/test_error_feedback.py -m gpu -q "${XDIST[@]}" -p no:cacheprovider -o addopts="" -rf \
  2>&1 | tail -20
host_rc=${PIPESTATUS[0]}
[[ $host_rc -ne 0 ]] && rc=$host_rc

# compute-sanitizer's memcheck on small cases of both walks (out-of-bounds or misaligned device
# accesses fail here even when the results happen to be right).
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
if [[ $REHEARSE -eq 1 ]]; then
  echo "== compute-sanitizer memcheck: skipped in the rehearsal (no GPU)"
elif [[ -n "$SANITIZER" ]]; then
  echo "== compute-sanitizer memcheck: walk-agreement tests at d = 1031"
  # no caching allocator: small tensors get their own allocations, so memcheck sees overruns
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$SANITIZER" --tool memcheck --error-exitcode 3 \
    "$PY" -m pytest \
    tests/ops/test_topk.py -m gpu -k "walks_agree and 1031" -q -p no:cacheprovider -o addopts="" \
    -rf 2>&1 | tail -15
  san_rc=${PIPESTATUS[0]}
  [[ $san_rc -ne 0 ]] && { echo "memcheck exit status $san_rc (124: timed out)"; rc=$san_rc; }
else
  echo "== compute-sanitizer not found: memcheck skipped"
fi

echo "== benchmarks/kernels/ops_report.py --device $DEV"
report_out=()
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT"; report_out=(--out "$OUT/gpu_report.md"); fi
[[ $REHEARSE -eq 1 ]] && report_out+=(--quick)    # the script's path, not the CPU's figures
log="$(mktemp)"
if ! timeout 90 "$PY" benchmarks/kernels/ops_report.py --device "$DEV" "${report_out[@]}" 2>"$log"; then
  rc=1
  echo "ops_report.py failed; its last messages:"
  tail -30 "$log"
fi
rm -f "$log"

echo "== benchmarks/kernels/topk_profile.py (per-kernel GPU time of one top-k, both walks)"
profile_out=/dev/null
[[ -n "${OUT:-}" ]] && profile_out="$OUT/topk_profile.md"
plog="$(mktemp)"
timeout 90 "$PY" benchmarks/kernels/topk_profile.py --device "$DEV" >"$plog" 2>&1
prc=$?
grep -v "^USDT\|^ERROR:" "$plog" | tee "$profile_out"  # drop the profiler's own log lines
rm -f "$plog"
[[ $prc -ne 0 ]] && rc=$prc
fi

if [[ "$ONLY" != kernels ]]; then
echo "== benchmarks/gpu/gpu_check_runs.py --device $DEV: training on $DEV tensors under torchrun"
runs_out="${OUT:-$(mktemp -d)}"
timeout 420 "$PY" benchmarks/gpu/gpu_check_runs.py --device "$DEV" --out "$runs_out"
trc=$?
[[ $trc -ne 0 ]] && { echo "gpu_check_runs.py exit status $trc (124: timed out)"; rc=$trc; }
fi
exit "$rc"
