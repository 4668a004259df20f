"""Flat gradient buffers: one contiguous fp32 buffer per ring slot instead of one per parameter.

A :class:`FlatLayout` maps every parameter that requires a gradient to a segment
``[offset, offset + numel)`` of a flat vector of d elements. The ring of a worker (PGC paper,
Sec. IV: the last c partition gradients it evaluated) is ``c`` such vectors, the coded message
m_j = sum_l b_{j,l} g_l is formed from them in one pass by :func:`pgc_hvd.ops.coded_accumulate`,
and the decoded update is scattered back into ``p.grad`` views of one flat vector.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch


class FlatLayout:
    """Segments of the parameters inside one flat vector (order = optimizer's param groups)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("the optimizer holds no parameter that requires a gradient")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"all parameters must live on one device, got {sorted(map(str, devices))}")
        self.device = next(iter(devices))
        self.offsets: dict[int, tuple[int, int]] = {}
        off = 0
        for p in self.params:
            self.offsets[id(p)] = (off, p.numel())
            off += p.numel()
        self.numel = off

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.numel, dtype=torch.float32, device=self.device)

    def view(self, flat: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        off, k = self.offsets[id(p)]
        return flat[off:off + k].view_as(p)

    def views(self, flat: torch.Tensor) -> Iterable[tuple[torch.nn.Parameter, torch.Tensor]]:
        for p in self.params:
            yield p, self.view(flat, p)

    def signature(self) -> list[int]:
        """[number of tensors, d]: compared across ranks at construction."""
        return [len(self.params), self.numel]
