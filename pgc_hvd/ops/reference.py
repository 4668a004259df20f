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
