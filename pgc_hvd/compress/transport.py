"""The communicator: which collective carries a step's messages, chosen from the bytes.

Every decoded update is linear in the messages, g_hat = Re sum_{u in uses} a_u D(p_u), and every
use (worker, step) is owned by one rank, its sender. Three ways to move them, with the bytes a
rank receives per step (n ranks, d entries, payload rows of w float32 words, U uses):

* ``"allreduce"``: each rank adds its own uses, sum_{u owned} a_u D(p_u) (zeros when it owns
  none), into a dense fp32 d-vector and ONE ring allreduce (sum) hands every rank the same
  update: 2 (n-1)/n * 4d bytes, whatever n and U are (Horovod's own cost); 2 (n-1)/n * 2d with
  fp16 messages (:class:`~pgc_hvd.compress.codecs.Fp16Codec`: the sum moves in fp16, as a ring
  allreduce or as an alltoall + allgather of chunks, :func:`alltoall_reduce_bytes`).
* ``"allgather"``: the owners allgather the used payload rows: 4 w U bytes, less the rank's own.
  Chosen for sparse top-kappa rows when that is fewer bytes than the allreduce
  (2 kappa U < 2 (n-1)/n d words), else they are densified into the allreduce.
* ``"cached"``: every used payload already reached every rank with the control rows (optimistic
  one-collective steps, for small messages, see :func:`optimistic_default`): no collective;
  every ready rank's payload then reaches every rank, n payloads of 4 w bytes.

The choice depends only on the decision, the codec and n, which every rank has identically, so
every rank picks the same collective.
"""

from __future__ import annotations

import os

#: payloads ride with the control rows (one collective per step) by default while the n payloads
#: a rank then receives, n * 4 w bytes, are at most this many; above it the step is decided on
#: control rows alone and the data move in the allreduce / allgather. Measured crossover
#: (``benchmarks/runtime_bench.py --crossover``, docs/benchmarks.md): at np = 4 the one
#: collective is 1.09-1.15x faster up to 1 MB payloads and 0.80x at 4 MB; at np = 2 the two are
#: within 5% from 256 KB to 4 MB. ``PGC_HVD_OPTIMISTIC_BYTES`` overrides.
OPTIMISTIC_BYTES = 4 * 1024 * 1024


def optimistic_threshold() -> int:
    """The byte threshold of optimistic rounds (``PGC_HVD_OPTIMISTIC_BYTES`` or the default)."""
    raw = os.environ.get("PGC_HVD_OPTIMISTIC_BYTES")
    if raw is None or raw.strip() == "":
        return OPTIMISTIC_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes (>= 0), "
                         f"e.g. 4194304") from None
    if value < 0:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes >= 0")
    return value


def optimistic_default(payload_bytes: int, on_cpu: bool, n: int = 1) -> bool:
    """Whether payloads ride with control rows by default: CPU payloads whose n copies a rank
    receives, n * ``payload_bytes``, are at most :func:`optimistic_threshold` bytes (latency
    dominates there; above it, n payloads cost more than the allreduce's two)."""
    return bool(on_cpu) and int(n) * int(payload_bytes) <= optimistic_threshold()


def allreduce_bytes(n: int, d: int, itemsize: int = 4) -> float:
    """Bytes a rank receives in a ring allreduce of d entries of ``itemsize`` bytes (4: fp32,
    2: fp16): 2 (n-1)/n * itemsize * d."""
    return 2.0 * (n - 1) / n * float(itemsize) * d if n > 1 else 0.0


def alltoall_reduce_bytes(n: int, d: int, itemsize: int = 2) -> float:
    """Bytes a rank receives when a sum of d entries moves as an alltoall of n equal chunks of
    m = ceil(d/n) entries (each rank sums one chunk) and an allgather of the summed chunks:
    2 (n-1) m * itemsize, the ring allreduce's 2 (n-1)/n * itemsize * d up to the padding."""
    return 2.0 * (n - 1) * -(-int(d) // int(n)) * float(itemsize) if n > 1 else 0.0


def choose_collective(*, sparse: bool, n: int, d: int, width: int, needed: int,
                      itemsize: int = 4) -> str:
    """``"cached"`` when no used payload is missing (``needed`` = 0), ``"allreduce"`` for dense
    rows, and for sparse rows whichever of ``"allgather"`` (4 w needed bytes) and
    ``"allreduce"`` (of entries of ``itemsize`` bytes) moves fewer bytes (ties to the
    allgather, which is exact in the rows)."""
    if needed <= 0:
        return "cached"
    if not sparse:
        return "allreduce"
    return ("allgather" if 4.0 * width * needed <= allreduce_bytes(n, d, itemsize)
            else "allreduce")
