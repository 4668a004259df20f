"""The communicator: which collective carries a step's messages, chosen from the bytes.

Every decoded update is linear in the messages, g_hat = Re sum_{u in uses} a_u D(p_u), and every
use (worker, step) is owned by one rank, its sender. Three ways to move them, with the bytes a
rank receives per step (n ranks, d entries, payload rows of w float32 words, U uses):

* ``"allreduce"``: each rank adds its own uses, sum_{u owned} a_u D(p_u) (zeros when it owns
  none), into a dense fp32 d-vector and ONE ring allreduce (sum) hands every rank the same
  update: 2 (n-1)/n * 4d bytes, whatever n and U are (Horovod's own cost).
* ``"allgather"``: the owners allgather the used payload rows: 4 w U bytes, less the rank's own.
  Chosen for sparse top-kappa rows when that is fewer bytes than the allreduce
  (2 kappa U < 2 (n-1)/n d words), else they are densified into the allreduce.
* ``"cached"``: every used payload already reached every rank with the control rows (optimistic
  one-collective steps, for small messages, see :func:`optimistic_default`): no collective.

The choice depends only on the decision, the codec and n, which every rank has identically, so
every rank picks the same collective.
"""

from __future__ import annotations

import os

#: payload rows up to this many bytes ride with the control rows (one collective per step) by
#: default; above it the step is decided on control rows alone and the data move in the
#: allreduce/allgather. Measured crossover: docs/benchmarks.md ("Optimistic threshold"),
#: ``benchmarks/runtime_bench.py --crossover``. ``PGC_HVD_OPTIMISTIC_BYTES`` overrides.
OPTIMISTIC_BYTES = 65536


def optimistic_threshold() -> int:
    """The byte threshold of optimistic rounds (``PGC_HVD_OPTIMISTIC_BYTES`` or the default)."""
    raw = os.environ.get("PGC_HVD_OPTIMISTIC_BYTES")
    if raw is None or raw.strip() == "":
        return OPTIMISTIC_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes (>= 0), "
                         f"e.g. 65536") from None
    if value < 0:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes >= 0")
    return value


def optimistic_default(payload_bytes: int, on_cpu: bool) -> bool:
    """Whether payloads ride with control rows by default: CPU payloads of at most
    :func:`optimistic_threshold` bytes (latency dominates there; above it, every ready rank's
    payload reaching every rank costs n payloads of bytes where the allreduce costs two)."""
    return bool(on_cpu) and int(payload_bytes) <= optimistic_threshold()


def allreduce_bytes(n: int, d: int) -> float:
    """Bytes a rank receives in a ring allreduce of d float32: 2 (n-1)/n * 4d."""
    return 2.0 * (n - 1) / n * 4.0 * d if n > 1 else 0.0


def choose_collective(*, sparse: bool, n: int, d: int, width: int, needed: int) -> str:
    """``"cached"`` when no used payload is missing (``needed`` = 0), ``"allreduce"`` for dense
    rows, and for sparse rows whichever of ``"allgather"`` (4 w needed bytes) and
    ``"allreduce"`` moves fewer bytes (ties to the allgather, which is exact in the rows)."""
    if needed <= 0:
        return "cached"
    if not sparse:
        return "allreduce"
    return "allgather" if 4.0 * width * needed <= allreduce_bytes(n, d) else "allreduce"
