"""Flat parameter vectors: the parameters of a model as segments of one vector in R^d.

The papers' gradients live in R^d: the partition gradients g_k of the simulator, the ring slots
and coded messages m_j = sum_l b_{j,l} g_l of the runtime (PGC paper, Sec. IV: a worker's ring
holds the last c partition gradients it evaluated), the decoded update. A :class:`FlatLayout`
maps every parameter that requires a gradient to the segment ``[offset, offset + numel)`` of such
a vector, in the order given (an optimizer's param groups, or a module's named parameters), and
back: views into a flat vector shaped like the parameters, by parameter or by name.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch


class FlatLayout:
    """Segments of the parameters inside one flat vector of d = ``numel`` elements."""

    def __init__(self, params: Sequence[torch.Tensor], names: Optional[Sequence[str]] = None):
        params = list(params)
        names = [str(i) for i in range(len(params))] if names is None else list(names)
        if len(names) != len(params):
            raise ValueError(f"{len(names)} names for {len(params)} parameters")
        kept = [(n, p) for n, p in zip(names, params) if p.requires_grad]
        if not kept:
            raise ValueError("no parameter requires a gradient (frozen model, or an empty "
                             "optimizer?)")
        self.names = [n for n, _ in kept]
        self.params = [p for _, p in kept]
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

    @classmethod
    def of_module(cls, model: torch.nn.Module) -> "FlatLayout":
        """The layout of ``model.named_parameters()``, segments named like the parameters (the
        names ``torch.func.functional_call`` expects)."""
        named = list(model.named_parameters())
        return cls([p for _, p in named], [n for n, _ in named])

    @property
    def dim(self) -> int:
        """d, the length of a flat vector (the papers' symbol)."""
        return self.numel

    def zeros(self) -> torch.Tensor:
        """A new fp32 flat vector of zeros on the parameters' device."""
        return torch.zeros(self.numel, dtype=torch.float32, device=self.device)

    def view(self, flat: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The segment of ``flat`` that belongs to parameter ``p``, shaped like ``p``."""
        off, k = self.offsets[id(p)]
        return flat[off:off + k].view_as(p)

    def views(self, flat: torch.Tensor) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, its segment of ``flat``) for every parameter, in layout order."""
        for p in self.params:
            yield p, self.view(flat, p)

    def unflatten(self, flat: torch.Tensor) -> dict:
        """{name: segment of ``flat`` shaped like that parameter}, in layout order."""
        return {n: self.view(flat, p) for n, p in zip(self.names, self.params)}

    def flatten(self) -> torch.Tensor:
        """A new flat vector holding the parameters' current values (their dtype)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def load(self, flat: torch.Tensor) -> None:
        """Copies ``flat`` into the parameters."""
        with torch.no_grad():
            for p, v in self.views(flat):
                p.copy_(v)

    def signature(self) -> list[int]:
        """[number of tensors, d]: compared across ranks at construction."""
        return [len(self.params), self.numel]
