"""Top-kappa compression by magnitude and error feedback (compressed messages of PGC/BCGC).

A message g in R^d is sent as the kappa entries of largest magnitude,

    C_kappa(g) = (g_I, I),   I = the kappa indices of largest |g_i|,

and decompressed as the d-vector D(g_I, I) holding g_I at I and 0 elsewhere. Ties in |g_i| are
broken by the lower index, so I is a deterministic function of g; I is returned ascending.

Two selection methods give the same I whenever it is well defined:

* ``"exact"``: radix select on the bit patterns of |g_i| (a histogram pass over the 11 leading
  bits, a compaction pass keeping the elements at or above the bin of the kappa-th magnitude,
  then radix select among those few candidates) -- never a sort of g.
* ``"threshold"`` (as in Deep Gradient Compression): a threshold tau estimated from a strided
  sample of s = min(d, 65536) magnitudes -- the r-th largest with
  r = ceil(1.05 mu + 3 sqrt(mu)) + 1, mu = s kappa / d, so that #{|g_i| >= tau} >= kappa with
  high probability -- then one compare-and-compact pass collecting {i : |g_i| >= tau} and
  trimming it to exactly kappa by the exact selection among these candidates. If fewer than
  kappa survive the threshold is lowered (tau / 2, then tau / 2^9, then 0) and the pass is
  redone, which tops the set up to kappa. Since the candidates then contain the exact top-kappa,
  the result equals the exact one; the method is faster because it skips the histogram pass.

On CUDA the digit walk of radix select runs on the device by default, so a selection queues
without host round trips except one small read-back (the candidate count, and the Inf/NaN
count behind the ValueError below). ``PGC_HVD_CUDA_TOPK_WALK=host`` selects the first,
host-driven version (one blocking read-back per digit), kept as a fallback and as the reference
that ``benchmarks/ops_report.py`` times alongside; ``PGC_HVD_CUDA_TOPK_COMPACT=0`` makes the
exact path walk all digits over x instead of compacting candidates (a design alternative timed
alongside). Every setting gives the same result.

Error feedback (EF-SGD): with a residual e (fp32, the part of past messages not yet sent),

    a = x + e,   (v, I) = C_kappa(a),   e <- a - D(v, I),

so v and the new e together hold exactly x + e (nothing is lost, bit for bit: the sum is formed
once in fp32 and the entries are moved, not recomputed).

NaN and Inf: selection is undefined on non-finite magnitudes, so both ops raise ValueError when
x (or x + e) holds any. ``topk_compress`` then has no side effects; ``error_feedback_compress``
has already stored x + e into ``residual`` (nothing was sent, nothing lost: zero or sanitise the
residual before the next step). kappa = 0 returns empty tensors without inspecting x (error
feedback still adds x into the residual).
"""

from __future__ import annotations

import operator
from typing import Tuple

import torch

from pgc_hvd.ops._ext import ext

METHODS = ("exact", "threshold")


def _index64(index_dtype: torch.dtype) -> bool:
    if index_dtype == torch.int64:
        return True
    if index_dtype == torch.int32:
        return False
    raise TypeError(f"index_dtype must be torch.int64 or torch.int32, got {index_dtype}")


def _check_k(k) -> int:
    """k as a Python int; refuses bools and floats such as 0.01 (a fraction, not a count)."""
    if not isinstance(k, bool):
        try:
            return operator.index(k)
        except TypeError:
            pass
    raise TypeError(f"k must be an int (a count, not a fraction), got {k!r}")


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def topk_compress(
    x: torch.Tensor, k: int, method: str = "exact", *, index_dtype: torch.dtype = torch.int64
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The k entries of largest magnitude of ``x``: ``(values, indices)``.

    Args:
        x: flat, contiguous float32/float16/bfloat16 buffer of d elements (CPU or CUDA).
        k: number of entries kept, 0 <= k <= d.
        method: ``"exact"`` or ``"threshold"`` (see the module docstring; same result).
        index_dtype: ``torch.int64`` (default) or ``torch.int32``.

    Returns ``values`` (x's dtype, ``values == x[indices]``) and ``indices`` ascending, ties in
    |x| broken by the lower index. Raises TypeError (dtype), ValueError (shape, contiguity,
    k outside [0, d], Inf/NaN in x: nothing is returned then).
    """
    return tuple(ext().topk_compress(x, _check_k(k), _check_method(method), _index64(index_dtype)))


def error_feedback_compress(
    x: torch.Tensor,
    residual: torch.Tensor,
    k: int,
    method: str = "exact",
    *,
    index_dtype: torch.dtype = torch.int64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``x + residual`` with error feedback; updates ``residual`` in place.

    ``a = x + residual`` (fp32); returns ``(values, indices) = topk_compress(a, k, method)`` and
    leaves ``residual = a`` with ``a[indices]`` set to zero, so ``values`` scattered at
    ``indices`` plus ``residual`` equal ``x + old residual`` exactly. ``x`` is read once.

    Args:
        x: flat contiguous float32/float16/bfloat16 gradient of d elements.
        residual: flat contiguous float32 buffer of d elements on x's device (not aliasing x).
        k, method, index_dtype: as in :func:`topk_compress`.

    Returns fp32 ``values`` and ascending ``indices``. Inf/NaN in x + residual raise ValueError
    after ``residual`` already holds x + residual (see the module docstring).
    """
    return tuple(
        ext().error_feedback_compress(
            x, residual, _check_k(k), _check_method(method), _index64(index_dtype)
        )
    )


def compression_error_norm(message: torch.Tensor, values: torch.Tensor,
                           residual: torch.Tensor | None = None) -> float:
    """||eps|| with eps = C(u) - u, the compression error of one sent message (the minimum-error
    class decoder's input, BCGC paper Sec. VI-B, where each worker sends this scalar).

    Without error feedback u = g^_i (``message``), and since C keeps kappa entries of u exactly,
    ||eps||^2 = ||u||^2 - ||values||^2. Both sums run in float64 over the same squares of the
    kept entries, so the difference is the dropped mass to float64 rounding, with no cancellation
    when compression keeps almost all of it (clamped at 0). With error feedback u is the message
    plus the old residual, and ``residual`` is the new one, u - C(u), so ||eps|| is its norm. The
    simulator and the runtime both call this, so their decoders see the same numbers for the
    same message."""
    if residual is not None:
        return float(torch.linalg.vector_norm(residual, dtype=torch.float64))

    def mass(v: torch.Tensor) -> torch.Tensor:
        m = v.abs() if v.is_complex() else v
        return (m * m).sum(dtype=torch.float64)

    return float(torch.sqrt(torch.clamp(mass(message) - mass(values), min=0)))
