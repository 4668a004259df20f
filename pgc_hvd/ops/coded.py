"""Coded accumulation over the pipeline ring buffer (PGC paper, Sec. IV).

Worker j's coded message at step t is a linear combination of the partition gradients it holds,

    m_j = sum_{l=0}^{c-1} b_{j,l} * g_l,

where the g_l are the c slots of its ring buffer (for PGC, the gradients of the partitions it
evaluated at steps t, t-1, ..., t-c+1, all with coefficient 1; for GC, the c = s+1 partitions of
row j of the encoding matrix B with coefficients B[j, k]). The kernels form m_j in one pass over
memory, accumulating in fp32 whatever the slots' dtype (fp32, fp16, bf16).
"""

from __future__ import annotations

from typing import Sequence

import torch

from pgc_hvd.ops import _ext


def coded_accumulate(
    out: torch.Tensor,
    slots: Sequence[torch.Tensor],
    coeffs: Sequence[float],
    accumulate: bool = False,
) -> torch.Tensor:
    """``out = sum_l coeffs[l] * slots[l]`` in place (``out +=`` when ``accumulate``).

    Args:
        out: flat, contiguous float32 buffer of d elements.
        slots: c flat, contiguous buffers of d elements, one dtype among fp32/fp16/bf16, on
            out's device; none may alias ``out``.
        coeffs: c finite floats (the code's coefficients b_{j,l}).
        accumulate: add into ``out`` instead of overwriting it.

    Returns ``out``. NaN or Inf inside the slots propagate into ``out`` (IEEE arithmetic);
    callers that must not apply such a message check it (the runtime treats it as a straggler).
    Raises ValueError/TypeError on shapes, dtypes, devices or non-finite coefficients.
    """
    coeffs = [float(a) for a in coeffs]
    ops = _ext.LIBRARY or _ext.library()   # bound once: no module entered per call
    ops.coded_accumulate(out, list(slots), coeffs, bool(accumulate))
    return out


def add_slot(out: torch.Tensor, slot: torch.Tensor, coeff: float = 1.0) -> torch.Tensor:
    """``out += coeff * slot`` in place: the form used while backward passes of the c partitions
    of one GC step run one after another."""
    return coded_accumulate(out, [slot], [coeff], accumulate=True)
