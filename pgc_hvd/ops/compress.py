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
count behind the ValueError below). ``walk="host"`` selects the first, host-driven version (one
blocking read-back per digit), kept as a fallback and as the reference that
``benchmarks/kernels/ops_report.py`` times alongside; ``compact=False`` makes the exact path walk all
digits over x instead of compacting candidates (a design alternative timed alongside). Every
setting gives the same result, and the CPU kernels ignore both. Their defaults come from the
environment, read once, at the import of this module (:func:`cuda_topk_defaults`; a bad value
makes every top-k raise ValueError):
``PGC_HVD_CUDA_TOPK_WALK`` = ``device`` (default) or ``host``, ``PGC_HVD_CUDA_TOPK_COMPACT`` =
``1`` (default) or ``0``; both are arguments of the torch ops (``torch.ops.pgc_hvd``).

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
import os
from typing import Mapping, Optional, Tuple

import torch

from pgc_hvd.ops import _ext


METHODS = ("exact", "threshold")
WALKS = ("device", "host")
WALK_ENV = "PGC_HVD_CUDA_TOPK_WALK"
COMPACT_ENV = "PGC_HVD_CUDA_TOPK_COMPACT"


def cuda_topk_from_env(environ: Mapping[str, str] = os.environ) -> Tuple[str, bool]:
    """``(walk, compact)`` as ``environ`` sets them: ``PGC_HVD_CUDA_TOPK_WALK`` = ``device``
    (default) or ``host``, ``PGC_HVD_CUDA_TOPK_COMPACT`` = ``1`` (default) or ``0``; an unset or
    empty variable means its default. Raises ValueError naming the variable otherwise."""
    walk = environ.get(WALK_ENV) or "device"
    if walk not in WALKS:
        raise ValueError(f"{WALK_ENV} must be 'device' (the default) or 'host', got {walk!r}")
    compact = environ.get(COMPACT_ENV) or "1"
    if compact not in ("1", "0"):
        raise ValueError(f"{COMPACT_ENV} must be 1 (the default) or 0, got {compact!r}")
    return walk, compact == "1"


def _read_env_once():
    try:
        return cuda_topk_from_env()
    except ValueError as err:  # raised by the first top-k, not by the import
        return err


# (walk, compact) from the environment, read once, when this module is imported; or the
# ValueError that every top-k call then raises.
_CUDA_TOPK_DEFAULTS = _read_env_once()


def cuda_topk_defaults() -> Tuple[str, bool]:
    """The default ``(walk, compact)`` of the top-k ops: the environment as it was when
    :mod:`pgc_hvd.ops` was imported (:func:`cuda_topk_from_env`); a later change is not seen
    (pass ``walk=`` / ``compact=`` to choose per call). Raises the ValueError of a bad value."""
    if isinstance(_CUDA_TOPK_DEFAULTS, ValueError):
        raise ValueError(*_CUDA_TOPK_DEFAULTS.args)
    return _CUDA_TOPK_DEFAULTS


def _walk_compact(walk: Optional[str], compact: Optional[bool]) -> Tuple[str, bool]:
    if walk is None or compact is None:
        env_walk, env_compact = cuda_topk_defaults()
        walk = env_walk if walk is None else walk
        compact = env_compact if compact is None else compact
    if walk not in WALKS:
        raise ValueError(f"walk must be one of {WALKS}, got {walk!r}")
    return walk, bool(compact)


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
    x: torch.Tensor,
    k: int,
    method: str = "exact",
    *,
    index_dtype: torch.dtype = torch.int64,
    walk: Optional[str] = None,
    compact: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The k entries of largest magnitude of ``x``: ``(values, indices)``.

    Args:
        x: flat, contiguous float32/float16/bfloat16 buffer of d elements (CPU or CUDA).
        k: number of entries kept, 0 <= k <= d.
        method: ``"exact"`` or ``"threshold"`` (see the module docstring; same result).
        index_dtype: ``torch.int64`` (default) or ``torch.int32``.
        walk, compact: how CUDA runs the radix select (``"device"``/``"host"``; compact the
            candidates or not); None takes :func:`cuda_topk_defaults`. Same result either way.

    Returns ``values`` (x's dtype, ``values == x[indices]``) and ``indices`` ascending, ties in
    |x| broken by the lower index. Raises TypeError (dtype), ValueError (shape, contiguity,
    k outside [0, d], Inf/NaN in x: nothing is returned then).
    """
    k, method, index64 = _check_k(k), _check_method(method), _index64(index_dtype)
    ops = _ext.LIBRARY or _ext.library()   # bound once: no module entered per call
    return tuple(ops.topk_compress(x, k, method, index64, *_walk_compact(walk, compact)))


def error_feedback_compress(
    x: torch.Tensor,
    residual: torch.Tensor,
    k: int,
    method: str = "exact",
    *,
    index_dtype: torch.dtype = torch.int64,
    walk: Optional[str] = None,
    compact: Optional[bool] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``x + residual`` with error feedback; updates ``residual`` in place.

    ``a = x + residual`` (fp32); returns ``(values, indices) = topk_compress(a, k, method)`` and
    leaves ``residual = a`` with ``a[indices]`` set to zero, so ``values`` scattered at
    ``indices`` plus ``residual`` equal ``x + old residual`` exactly. ``x`` is read once.

    Args:
        x: flat contiguous float32/float16/bfloat16 gradient of d elements.
        residual: flat contiguous float32 buffer of d elements on x's device (not aliasing x).
        k, method, index_dtype, walk, compact: as in :func:`topk_compress`.

    Returns fp32 ``values`` and ascending ``indices``. Inf/NaN in x + residual raise ValueError
    after ``residual`` already holds x + residual (see the module docstring).
    """
    k, method, index64 = _check_k(k), _check_method(method), _index64(index_dtype)
    ops = _ext.LIBRARY or _ext.library()   # bound once: no module entered per call
    return tuple(ops.error_feedback_compress(x, residual, k, method, index64,
                                             *_walk_compact(walk, compact)))


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
