"""One rank's streamed (overlapped) steps built by hand, for the one-process unit tests of the
overlap (tests/runtime/test_overlap.py) and of the s = 0 path (tests/runtime/test_sum_rows.py):
a small real model under dgd at n ranks, the overlap's buckets, the real
:class:`~pgc_hvd.runtime.agent.CommAgent` (its keywords the caller's: the control plane, the s
= 0 path, ...), the capture and the :class:`~pgc_hvd.runtime.step.Step`, started through
``Step.start()``; run on thread ranks by tests/runtime/thread_world.py."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime.agent import CommAgent
from pgc_hvd.runtime.capture import GradientCapture
from pgc_hvd.runtime.overlap import Buckets
from pgc_hvd.runtime.step import Step
from pgc_hvd.schemes import Ring, get_scheme

#: the buckets' cap: 30 floats, so the model's 3 layers make several buckets
BUCKET_CAP_MB = 30 * 4 / 2 ** 20


def mlp(widths=(5, 7, 6, 3)) -> nn.Sequential:
    """Linear layers of these widths with a tanh between two."""
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


class StreamedRank:
    """Rank ``rank`` of n: its model (the same start on every rank), optimizer, layout,
    buckets, agent (``CommAgent(..., buckets=..., **agent_kw)``), capture and step.
    ``unused=True`` adds a parameter that never has a gradient."""

    def __init__(self, ops, rank: int = 0, n: int = 1, *, unused: bool = False, **agent_kw):
        self.rank = rank
        self.model = mlp((5, 9, 8, 3))
        self.spare = nn.Linear(3, 3) if unused else None   # a parameter with no gradient
        params = list(self.model.parameters()) + (list(self.spare.parameters()) if unused
                                                    else [])
        with torch.no_grad():   # the same start on every rank (threads share torch's RNG)
            for i, p in enumerate(params):
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.3)
        self.opt = torch.optim.SGD(params, lr=0.1)
        self.layout = lay = FlatLayout(params)
        self.buckets = Buckets(lay, BUCKET_CAP_MB)
        self.scheme = get_scheme("dgd", n, 0)
        enc = MessageEncoder(lay.numel, None, complex_messages=False, device="cpu")
        self.seen: list = []
        self.agent = CommAgent(ops, self.scheme, rank, lay.numel, self.scheme.lookback,
                               codec=enc.codec, device="cpu", buckets=self.buckets, **agent_kw)
        self.capture = GradientCapture(lay, Ring(self.scheme, rank), ring_mode=False,
                                       passes_per_step=1, scheme=self.scheme, rank=rank)
        self.capture.buckets = self.buckets
        self.step = Step(self.capture, enc, self.agent, self.scheme, rank,
                         param_groups=self.opt.param_groups,
                         on_update=lambda t, flat: self.seen.append((t, flat.clone())))
        self.capture.attach()
        self.step.start()

    def loss(self, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        X, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        return F.cross_entropy(self.model(X), y)

    def true_grad(self, seed: int) -> torch.Tensor:
        """The flat gradient of batch ``seed``, hooks off (zeros for a parameter without)."""
        self.capture.remove_hooks()
        for p in self.layout.params:
            p.grad = None
        self.loss(seed).backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                       for p in self.layout.params])
        for p in self.layout.params:
            p.grad = None
        self.capture.attach()
        return g

    def one(self, seed: int, *, loss=None, clip: bool = False) -> dict:
        """One step on batch ``seed`` (``loss`` handed to the step; ``clip``: the gradient
        clipped after the backward); returns the step's info."""
        self.step.begin()
        self.loss(seed).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e-3)
        self.step.send(loss=loss)
        self.agent.wait_for(self.step.version)
        self.step.load(self.agent.take(self.step.version))
        info = self.step.last.info
        self.step.apply(self.opt.step, correct_momentum=False)
        return info

    def close(self) -> None:
        self.capture.remove_hooks()
        self.agent.finish()
