"""Per-partition gradients g_k(beta) = grad of the mean loss over D_k, for all k at once.

:class:`PartitionGradients` holds the training tensors split into the n partitions and
computes the (n, d) matrix G(beta) whose row k is g_k(beta), with parameters given as one flat
vector. Models without batch norm go through one batched pass: ``torch.func.vmap`` over the
partitions of ``grad`` of the masked mean loss (partitions padded to the largest size); others
(ResNet-18) loop over partitions. ``gradient(flat, X, y)`` is the plain gradient on one batch
(the validation minibatch of the staleness diagnostics).

Minibatch mode (``batch_size=B``): ``all(flat, step=v)`` returns row k = gradient of the mean
loss over a minibatch of min(B, |D_k|) samples of D_k drawn without replacement, a seeded
function of (seed, v) alone (:meth:`PartitionGradients.minibatch_weights`): every scheme and
every worker evaluating partition k at model version v gets the same minibatch, so GC stays
exact (two workers' copies of g_k agree) and the schemes see identical gradients, as the PGC
paper's runs (stochastic minibatch SGD with controlled seeds). Without ``step`` (or with
``batch_size=None``) rows are full-partition gradients (gradient descent).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from pgc_hvd.flat_layout import FlatLayout


class PartitionGradients:
    def __init__(self, task, X: torch.Tensor, y: torch.Tensor, parts: Sequence[np.ndarray],
                 chunk: int | None = None, batch_size: int | None = None, seed: int = 0):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = None if batch_size is None else int(batch_size)
        self.seed = int(seed)
        self.task = task
        self.model = task.model
        self.layout = FlatLayout.of_module(self.model)
        self.buffers = dict(self.model.named_buffers())
        self.n = len(parts)
        self.parts = [torch.as_tensor(np.asarray(p), dtype=torch.long) for p in parts]
        if any(len(p) == 0 for p in self.parts):
            raise ValueError("every partition needs at least one sample (fewer samples than n?)")
        self.X, self.y = X, y
        self.vmap = task.supports_vmap
        if self.vmap:
            m = max(len(p) for p in self.parts)
            self.m = m
            idx = torch.zeros(self.n, m, dtype=torch.long)
            w = torch.zeros(self.n, m, dtype=X.dtype)
            for k, p in enumerate(self.parts):
                idx[k, :len(p)] = p
                w[k, :len(p)] = 1.0 / len(p)
            self.Xp, self.yp, self.wp = X[idx], y[idx], w
            # bound the memory of one vmapped pass (activations ~ chunk * m * width)
            self.chunk = chunk or max(1, min(self.n, 200_000 // max(1, m * X[0].numel())))

            def part_loss(params, xb, yb, wb):
                out = functional_call(self.model, ({**params, **self.buffers}), (xb,))
                return (self.task.per_sample_loss(out, yb) * wb).sum()

            self._g = vmap(grad(part_loss), in_dims=(None, 0, 0, 0))
            # linear models (softmax / logistic regression): closed form, one batched matmul
            from pgc_hvd.models import LogisticRegression, SoftmaxRegression
            self.linear = isinstance(self.model, (SoftmaxRegression, LogisticRegression))
            if self.linear:
                self.Xflat = self.Xp.reshape(self.n, m, -1)
        self.evaluations = 0

    def minibatch_weights(self, step: int) -> torch.Tensor:
        """(n, m) per-sample weights of step ``step``'s minibatches over the padded partitions:
        1/B_k on the B_k = min(B, |D_k|) samples drawn (without replacement, seeded by
        (seed, step)) from partition k, 0 elsewhere. Rows sum to 1."""
        return self._minibatch(step)[0]

    def _minibatch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (n, m) as :meth:`minibatch_weights`, pick (n, min(B, m)): the padded
        columns drawn; weight 0 on a pick beyond a partition smaller than B)."""
        sizes = torch.tensor([len(p) for p in self.parts])
        m = int(sizes.max())
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence([self.seed, 104729, int(step)])
                                                .generate_state(1)[0]))
        scores = torch.rand(self.n, m, generator=gen, dtype=torch.float64)
        scores[torch.arange(m).unsqueeze(0) >= sizes.unsqueeze(1)] = 2.0  # padding: never drawn
        B = min(self.batch_size, m)
        pick = scores.topk(B, dim=1, largest=False).indices              # (n, B)
        bk = torch.clamp(sizes, max=self.batch_size).to(self.X.dtype)   # (n,)
        w = torch.zeros(self.n, m, dtype=self.X.dtype)
        w.scatter_(1, pick, (1.0 / bk).unsqueeze(1).expand(-1, B).contiguous())
        w[scores >= 2.0] = 0.0  # partitions smaller than B: only their own samples
        return w, pick

    def all(self, flat: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """(n, d): row k = g_k at the parameters ``flat`` (minibatch of ``step`` in minibatch
        mode, see the module docstring)."""
        self.evaluations += self.n
        mb = self.batch_size is not None and step is not None
        if self.vmap:
            if self.linear:
                return self._linear(flat.detach(), self.minibatch_weights(step) if mb else self.wp)
            Xp, yp, wp = self.Xp, self.yp, self.wp
            if mb:  # only the B drawn samples of each partition go through the network
                w, pick = self._minibatch(step)
                Xp = torch.stack([self.Xp[k, pick[k]] for k in range(self.n)])
                yp, wp = self.yp.gather(1, pick), w.gather(1, pick)
            params = self.layout.unflatten(flat.detach())
            rows = []
            for a in range(0, self.n, self.chunk):
                g = self._g(params, Xp[a:a + self.chunk], yp[a:a + self.chunk],
                            wp[a:a + self.chunk])
                rows.append(torch.cat([g[name].reshape(g[name].shape[0], -1)
                                       for name in self.layout.names], dim=1))
            return torch.cat(rows).contiguous()
        if mb:
            w = self.minibatch_weights(step)
            return torch.stack([self._one(flat, p[w[k, :len(p)] > 0]) for k, p in enumerate(self.parts)])
        return torch.stack([self._one(flat, p) for p in self.parts])

    def _linear(self, flat: torch.Tensor, wp: torch.Tensor | None = None) -> torch.Tensor:
        """g_k = sum_i w_ki r_ki [x_ki, 1], r = dloss/dlogits (softmax - onehot, sigmoid - y)."""
        wp = self.wp if wp is None else wp
        p = self.layout.unflatten(flat)
        W, b = p["linear.weight"], p["linear.bias"]
        logits = torch.matmul(self.Xflat, W.t()) + b                  # (n, m, K)
        if self.task.binary:
            r = (torch.sigmoid(logits) - self.yp.unsqueeze(-1).to(logits.dtype))
        else:
            r = torch.softmax(logits, dim=-1)
            r = r - torch.nn.functional.one_hot(self.yp, r.shape[-1]).to(r.dtype)
        r = r * wp.unsqueeze(-1)
        gW = torch.bmm(r.transpose(1, 2), self.Xflat)                 # (n, K, d)
        gb = r.sum(1)                                                 # (n, K)
        return torch.cat([gW.reshape(self.n, -1), gb], dim=1).contiguous()

    def _one(self, flat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return self.gradient(flat, self.X[idx], self.y[idx])

    def gradient(self, flat: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Gradient of the mean loss on (X, y) at ``flat``; the model's own parameters are
        left untouched (``functional_call`` on views of a detached copy)."""
        leaf = flat.detach().clone().requires_grad_(True)
        params = self.layout.unflatten(leaf)
        out = functional_call(self.model, {**params, **self.buffers}, (X,))
        (g,) = torch.autograd.grad(self.task.loss(out, y), [leaf])
        return g

    def measure_partition_time(self, flat: torch.Tensor, repeats: int = 3) -> float:
        """Seconds per partition gradient on this machine (median of ``repeats`` full passes / n)."""
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            self.all(flat)
            times.append(time.thread_time() - t0)
        self.evaluations -= repeats * self.n
        return float(np.median(times)) / self.n
