#!/usr/bin/env bash
# One-stop, idempotent set-up of pgc_hvd's environment.
#
#   bash launch/setup.sh          # creates .venv (or $PGC_HVD_VENV) and installs everything
#
# Steps (each names itself on failure):
#   1. virtual environment
#   2. torch==2.14.1, torchvision==0.29.1
#   3. build tools (setuptools, wheel, scikit-build-core, pybind11, ninja)
#   4. horovod==0.28.1 built from source against that torch: every host C++ compile is forced to
#      -std=gnu++20 (torch 2.14 headers need C++20, horovod pins C++14) through a compiler
#      wrapper; gloo + PyTorch, no MPI/TensorFlow/MXNet; NCCL when a GPU and NCCL are present
#   5. test and runtime dependencies
#   6. pgc_hvd itself (editable; CMake builds pgc_hvd._C, with CUDA when a toolkit is found)
#   7. checks: import pgc_hvd, pgc_hvd._C, horovod.torch; horovodrun --check-build lists
#      PyTorch and Gloo
# A second run on the same machine only verifies (and rebuilds pgc_hvd._C if csrc/ changed).
# PGC_HVD_WITH_HOROVOD=0: skip step 4 and its checks (torchrun only: the torch engine,
# pgc_hvd.torch, needs no Horovod; docs/install.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PGC_HVD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
HOROVOD_VERSION=0.28.1
LOG_DIR="$VENV/pgc-hvd-setup-logs"
CURRENT_STEP="(start)"

on_error() {
  local rc=$?
  echo "" >&2
  echo "pgc_hvd set-up FAILED at step: $CURRENT_STEP (exit code $rc)." >&2
  echo "Logs of the failing command, if any, are in $LOG_DIR." >&2
  exit "$rc"
}
trap on_error ERR

step() { CURRENT_STEP="$1"; echo "[setup] $1"; }

# logged LOG CMD...: runs CMD with its output in LOG, printing a heartbeat every 30 s so that a
# long compile is visibly alive; returns CMD's exit status.
logged() {
  local log="$1"; shift
  "$@" >"$log" 2>&1 &
  local pid=$! t0=$SECONDS next=30
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - t0 >= next )); then
      echo "[setup]   ... still working ($(( SECONDS - t0 )) s; log: $log)"
      next=$(( next + 30 ))
    fi
  done
  wait "$pid"
}
t0=$(date +%s)

# ---------------------------------------------------------------- 1. venv
step "1/7 virtual environment at $VENV"
if [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV"
fi
mkdir -p "$LOG_DIR"
"$PY" -c 'import sys; assert sys.version_info >= (3, 9), sys.version' \
  || { echo "Python >= 3.9 is needed in $VENV" >&2; false; }

have_version() {  # have_version MODULE VERSION-PREFIX
  "$PY" - "$1" "$2" <<'PYEOF' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PYEOF
}

# ---------------------------------------------------------------- 2. torch
step "2/7 torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
if ! have_version torch "$TORCH_VERSION" || ! have_version torchvision "$TORCHVISION_VERSION"; then
  logged "$LOG_DIR/torch.log" "${PIP[@]}" install "torch==$TORCH_VERSION" \
    "torchvision==$TORCHVISION_VERSION" || { tail -20 "$LOG_DIR/torch.log" >&2; false; }
fi

# ---------------------------------------------------------------- 3. build tools
step "3/7 build tools"
BUILD_REQS=("setuptools>=70" wheel "scikit-build-core>=0.10" "pybind11>=2.12" ninja packaging)
if ! "$PY" -c 'import setuptools, wheel, scikit_build_core, pybind11, ninja, packaging' 2>/dev/null; then
  "${PIP[@]}" install "${BUILD_REQS[@]}" >"$LOG_DIR/build-tools.log" 2>&1 \
    || { tail -20 "$LOG_DIR/build-tools.log" >&2; false; }
fi

# ---------------------------------------------------------------- 4. horovod
step "4/7 horovod==$HOROVOD_VERSION (built from source against torch $TORCH_VERSION)"
horovod_ok() {
  have_version horovod "$HOROVOD_VERSION" && "$PY" -c 'import horovod.torch' 2>/dev/null
}
WITH_HOROVOD="${PGC_HVD_WITH_HOROVOD:-1}"
if [[ "$WITH_HOROVOD" == 0 ]]; then
  echo "[setup]   skipped (PGC_HVD_WITH_HOROVOD=0: torchrun and pgc_hvd.torch only)"
elif ! horovod_ok; then
  # A compiler wrapper that forces C++20 on every host C++ compile (nvcc passes its own
  # host flags through -Xcompiler and is not routed through this wrapper).
  WRAP_DIR="$VENV/pgc-hvd-cxx20"
  mkdir -p "$WRAP_DIR"
  REAL_CXX="$(command -v "${CXX:-g++}")"
  cat >"$WRAP_DIR/c++" <<WRAPEOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in
    -std=c++*|-std=gnu++*) a="-std=gnu++20" ;;
  esac
  args+=("\$a")
done
exec "$REAL_CXX" "\${args[@]}"
WRAPEOF
  chmod +x "$WRAP_DIR/c++"
  export CXX="$WRAP_DIR/c++"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
  export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  if [[ -z "${CUDA_HOME:-}" && -x /usr/local/cuda/bin/nvcc ]]; then export CUDA_HOME=/usr/local/cuda; fi
  if [[ -n "${CUDA_HOME:-}" ]]; then
    # horovod's bundled FindCUDAToolkit derives the toolkit root from the first nvcc on PATH;
    # point it at the real toolkit (a wrapper such as /usr/local/bin/nvcc misleads it).
    export CUDAToolkit_ROOT="$CUDA_HOME" CUDACXX="$CUDA_HOME/bin/nvcc" PATH="$CUDA_HOME/bin:$PATH"
  fi
  # NCCL operations only where a GPU and NCCL exist (a GPU node); CPU machines use gloo.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    NCCL_DIR="$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)"
    if [[ -n "$NCCL_DIR" && -d "$NCCL_DIR/include" ]]; then
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$NCCL_DIR"
      echo "[setup]   GPU and NCCL found: building horovod with NCCL operations"
    fi
  fi
  export MAKEFLAGS="-j$(nproc)"
  echo "[setup]   compiling horovod (5 to 17 minutes on 2 cores, see docs/install.md; pip caches the wheel, so later installs reuse it)"
  logged "$LOG_DIR/horovod.log" "${PIP[@]}" install --no-build-isolation \
    "horovod==$HOROVOD_VERSION" || { grep -iE "error" "$LOG_DIR/horovod.log" | tail -20 >&2; false; }
fi

# ---------------------------------------------------------------- 5. dependencies
step "5/7 runtime and test dependencies"
DEPS=(numpy pytest pytest-benchmark hypothesis scikit-learn matplotlib nvidia-ml-py mnist1d
      "lightning==2.6.*")
if ! "$PY" -c 'import numpy, pytest, pytest_benchmark, hypothesis, sklearn, matplotlib, pynvml, mnist1d, lightning' 2>/dev/null; then
  "${PIP[@]}" install "${DEPS[@]}" >"$LOG_DIR/deps.log" 2>&1 \
    || { tail -20 "$LOG_DIR/deps.log" >&2; false; }
fi

# ---------------------------------------------------------------- 6. pgc_hvd
step "6/7 pgc_hvd (CMake build of pgc_hvd._C)"
STAMP="$VENV/pgc-hvd-build.stamp"
# the sources of _C, and the list of the package's modules: the editable install ("redirect"
# mode) maps the modules it saw, so a new module or subpackage needs a reinstall
src_hash() {
  (cd "$ROOT" && find csrc CMakeLists.txt pyproject.toml -type f -print0 | sort -z \
     | xargs -0 sha256sum; find pgc_hvd -name '*.py' | LC_ALL=C sort;
   echo "${PGC_HVD_CUDA_ARCH:-}") | sha256sum | cut -d' ' -f1
}
HASH="$(src_hash)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$HASH" ]] \
   || ! "$PY" -c 'import pgc_hvd._C' 2>/dev/null; then
  echo "[setup]   building pgc_hvd._C (log: $LOG_DIR/pgc_hvd.log)"
  (cd "$ROOT" && logged "$LOG_DIR/pgc_hvd.log" "$PY" -m pip --disable-pip-version-check \
    install -v --no-build-isolation --no-deps -e .) || { grep -iE "error|fail" "$LOG_DIR/pgc_hvd.log" | tail -30 >&2; false; }
  # Show what CMake decided and which CUDA objects nvcc built (CI logs must show them).
  grep -E "pgc_hvd: |Building CUDA object" "$LOG_DIR/pgc_hvd.log" | sed 's/^ */[setup]   /' || true
  echo "$HASH" >"$STAMP"
fi

# ---------------------------------------------------------------- 7. checks
step "7/7 checks"
if [[ "$WITH_HOROVOD" == 0 ]]; then
  "$PY" -c 'import pgc_hvd, pgc_hvd._C, pgc_hvd.torch; print("[setup]   pgc_hvd", pgc_hvd.__version__, "(torch engine only) | CUDA kernels compiled:", pgc_hvd._C.cuda_compiled())'
  echo "[setup] done in $(( $(date +%s) - t0 )) s; environment: $VENV"
  exit 0
fi
"$PY" -c 'import pgc_hvd, pgc_hvd._C, horovod.torch; print("[setup]   pgc_hvd", pgc_hvd.__version__, "| CUDA kernels compiled:", pgc_hvd._C.cuda_compiled())'
CHECK="$("$VENV/bin/horovodrun" --check-build 2>&1)"
for want in PyTorch Gloo; do
  if ! grep -qE "\[X\] $want" <<<"$CHECK"; then
    echo "$CHECK" >&2
    echo "horovodrun --check-build does not list $want as available" >&2
    false
  fi
done
echo "[setup]   horovodrun --check-build lists PyTorch and Gloo"
echo "[setup] done in $(( $(date +%s) - t0 )) s; environment: $VENV"
