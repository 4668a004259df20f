#!/usr/bin/env bash
# GPU check of pgc_hvd.ops, for a machine where the repository is already built with CUDA
# (bash launch/setup.sh; venv at .venv). Runs the CUDA tests, then the CUDA benchmark table.
#
#   bash benchmarks/gpu_check.sh          # from the repository root; writes $OUT/gpu_report.md
#                                         # when OUT is set, and prints everything to stdout
# About 3-5 minutes on an H200; the steps are capped at 120, 90, 150 (memcheck), 90 and 90 s.
# The report times the CUDA radix-select variants ("[host walk]", "[no compaction]" rows) next to
# the default.
# On the workplace's GPU machine (torch 2.11 at /opt/torch/.venv, CXX=/opt/gcc/bin/g++ by default,
# which links libstdc++ statically and is refused by CMakeLists.txt), build and check in one go:
#   PGC_HVD_VENV=/opt/torch/.venv bash benchmarks/gpu_check.sh --build
# --build first runs, with the system compilers (about 50 s on 16 cores; log in $OUT/build.log),
#   CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++ \
#     python -m pip install --no-build-isolation --no-deps -e .
# Prints: the GPU, the pytest summaries (failures listed), one markdown table (ops_report.py;
# $OUT/gpu_report.md), then where one top-k's time goes (topk_profile.py; $OUT/topk_profile.md).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PGC_HVD_VENV:-.venv}/bin/python"
rc=0
XDIST=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n 8)

if [[ "${1:-}" == "--build" ]]; then
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

echo "== pytest -m gpu: tests/ops (device-side radix walk, the default) and train --device"
timeout 120 "$PY" -m pytest tests/ops tests/runtime/test_train_device.py -m gpu -q "${XDIST[@]}" \
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
if [[ -n "$SANITIZER" ]]; then
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

echo "== benchmarks/ops_report.py --device cuda"
report_out=()
if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT"; report_out=(--out "$OUT/gpu_report.md"); fi
log="$(mktemp)"
if ! timeout 90 "$PY" benchmarks/ops_report.py --device cuda "${report_out[@]}" 2>"$log"; then
  rc=1
  echo "ops_report.py failed; its last messages:"
  tail -30 "$log"
fi
rm -f "$log"

echo "== benchmarks/topk_profile.py (per-kernel GPU time of one top-k, both walks)"
profile_out=/dev/null
[[ -n "${OUT:-}" ]] && profile_out="$OUT/topk_profile.md"
plog="$(mktemp)"
timeout 90 "$PY" benchmarks/topk_profile.py >"$plog" 2>&1
prc=$?
grep -v "^USDT\|^ERROR:" "$plog" | tee "$profile_out"  # drop the profiler's own log lines
rm -f "$plog"
[[ $prc -ne 0 ]] && rc=$prc
exit "$rc"
