"""Pure-PyTorch references of the ops in :mod:`pgc_hvd.ops`, used by tests and benchmarks."""

from __future__ import annotations

from typing import Sequence

import torch


def coded_accumulate_ref(
    out: torch.Tensor, slots: Sequence[torch.Tensor], coeffs: Sequence[float], accumulate: bool = False
) -> torch.Tensor:
    """Reference for :func:`pgc_hvd.ops.coded_accumulate`: chained ``add_`` in fp32."""
    if not accumulate:
        out.zero_()
    for slot, a in zip(slots, coeffs):
        out.add_(slot.to(torch.float32), alpha=float(a))
    return out


def topk_compress_ref(x: torch.Tensor, k: int, method: str = "exact", *,
                      index_dtype: torch.dtype = torch.int64):
    """Reference for :func:`pgc_hvd.ops.topk_compress` (both methods give this result).

    A stable descending sort of |x| puts equal magnitudes in index order, so its first k
    positions are the k largest with ties broken by the lower index; they are returned
    ascending with ``values = x[indices]``.
    """
    if not 0 <= k <= x.numel():
        raise ValueError(f"k must lie in [0, d], got {k}")
    order = torch.sort(x.abs().float(), descending=True, stable=True).indices[:k]
    idx = torch.sort(order).values
    return x[idx], idx.to(index_dtype)


def error_feedback_compress_ref(x: torch.Tensor, residual: torch.Tensor, k: int,
                                method: str = "exact", *, index_dtype: torch.dtype = torch.int64):
    """Reference for :func:`pgc_hvd.ops.error_feedback_compress`: a = x + e in fp32, top-k of
    a, e <- a with the selected entries zeroed."""
    a = x.float() + residual
    values, idx = topk_compress_ref(a, k, method, index_dtype=index_dtype)
    residual.copy_(a)
    residual[idx.long()] = 0.0
    return values, idx


def decode_accumulate_ref(out: torch.Tensor, messages, weights, *, accumulate: bool = True,
                          check_finite: bool = True) -> torch.Tensor:
    """Reference for :func:`pgc_hvd.ops.decode_accumulate`: messages applied in the order
    given, dense by ``add_``, sparse by ``index_add_`` (repeated indices accumulate)."""
    if not accumulate:
        out.zero_()
    for m, w in zip(messages, weights):
        if isinstance(m, torch.Tensor):
            out.add_(m.float(), alpha=float(w))
        else:
            values, idx = m
            out.index_add_(0, idx.long(), values.float() * float(w))
    return out
