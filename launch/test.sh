#!/usr/bin/env bash
# The README's test command: installs what is needed (launch/setup.sh, idempotent), then runs
# the test suite: unit and property tests, reference-vs-kernel tests, multi-rank horovodrun
# tests; GPU tests skip without a GPU; benchmarks are not run (see docs/benchmarks.md).
# Extra arguments go to pytest, e.g.  bash launch/test.sh -k codes -x
#   bash launch/test.sh -m quick    # the quick suite: every part's unit tests and one multi-rank
#                                   # launch per engine (tests/conftest.py, is_quick; README)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PGC_HVD_VENV:-$ROOT/.venv}"
bash "$ROOT/launch/setup.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
