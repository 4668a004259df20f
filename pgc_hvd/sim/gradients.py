"""Per-partition gradients g_k(beta) = grad of the mean loss over D_k, for all k at once.

:class:`PartitionGradients` holds the training tensors split into the n partitions and
computes the (n, d) matrix G(beta) whose row k is g_k(beta), with parameters given as one flat
vector. Models without batch norm go through one batched pass: ``torch.func.vmap`` over the
partitions of ``grad`` of the masked mean loss (partitions padded to the largest size); others
(ResNet-18) loop over partitions. ``gradient(flat, X, y)`` is the plain gradient on one batch
(the validation minibatch of the staleness diagnostics).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch
from torch.func import functional_call, grad, vmap


class ParamLayout:
    """Flat vector <-> named parameter tensors of ``model``."""

    def __init__(self, model: torch.nn.Module):
        self.names = [n for n, _ in model.named_parameters()]
        self.shapes = [p.shape for _, p in model.named_parameters()]
        self.sizes = [p.numel() for _, p in model.named_parameters()]
        self.dim = int(sum(self.sizes))
        self.buffers = {n: b for n, b in model.named_buffers()}

    def unflatten(self, flat: torch.Tensor) -> dict:
        out, i = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes):
            out[name] = flat[i:i + size].view(shape)
            i += size
        return out

    @staticmethod
    def flatten(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def load(self, model: torch.nn.Module, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, v in zip(model.parameters(), self.unflatten(flat).values()):
                p.copy_(v)


class PartitionGradients:
    def __init__(self, task, X: torch.Tensor, y: torch.Tensor, parts: Sequence[np.ndarray],
                 chunk: int | None = None):
        self.task = task
        self.model = task.model
        self.layout = ParamLayout(self.model)
        self.n = len(parts)
        self.parts = [torch.as_tensor(np.asarray(p), dtype=torch.long) for p in parts]
        if any(len(p) == 0 for p in self.parts):
            raise ValueError("every partition needs at least one sample (fewer samples than n?)")
        self.X, self.y = X, y
        self.vmap = task.supports_vmap
        if self.vmap:
            m = max(len(p) for p in self.parts)
            idx = torch.zeros(self.n, m, dtype=torch.long)
            w = torch.zeros(self.n, m, dtype=X.dtype)
            for k, p in enumerate(self.parts):
                idx[k, :len(p)] = p
                w[k, :len(p)] = 1.0 / len(p)
            self.Xp, self.yp, self.wp = X[idx], y[idx], w
            # bound the memory of one vmapped pass (activations ~ chunk * m * width)
            self.chunk = chunk or max(1, min(self.n, 200_000 // max(1, m * X[0].numel())))

            def part_loss(params, xb, yb, wb):
                out = functional_call(self.model, ({**params, **self.layout.buffers}), (xb,))
                return (self.task.per_sample_loss(out, yb) * wb).sum()

            self._g = vmap(grad(part_loss), in_dims=(None, 0, 0, 0))
            # linear models (softmax / logistic regression): closed form, one batched matmul
            from pgc_hvd.models import LogisticRegression, SoftmaxRegression
            self.linear = isinstance(self.model, (SoftmaxRegression, LogisticRegression))
            if self.linear:
                self.Xflat = self.Xp.reshape(self.n, m, -1)
        self.evaluations = 0

    def all(self, flat: torch.Tensor) -> torch.Tensor:
        """(n, d): row k = g_k at the parameters ``flat``."""
        self.evaluations += self.n
        if self.vmap and self.linear:
            return self._linear(flat.detach())
        if self.vmap:
            params = self.layout.unflatten(flat.detach())
            rows = []
            for a in range(0, self.n, self.chunk):
                g = self._g(params, self.Xp[a:a + self.chunk], self.yp[a:a + self.chunk],
                            self.wp[a:a + self.chunk])
                rows.append(torch.cat([g[name].reshape(g[name].shape[0], -1)
                                       for name in self.layout.names], dim=1))
            return torch.cat(rows).contiguous()
        return torch.stack([self._one(flat, p) for p in self.parts])

    def _linear(self, flat: torch.Tensor) -> torch.Tensor:
        """g_k = sum_i w_ki r_ki [x_ki, 1], r = dloss/dlogits (softmax - onehot, sigmoid - y)."""
        p = self.layout.unflatten(flat)
        W, b = p["linear.weight"], p["linear.bias"]
        logits = torch.matmul(self.Xflat, W.t()) + b                  # (n, m, K)
        if self.task.binary:
            r = (torch.sigmoid(logits) - self.yp.unsqueeze(-1).to(logits.dtype))
        else:
            r = torch.softmax(logits, dim=-1)
            r = r - torch.nn.functional.one_hot(self.yp, r.shape[-1]).to(r.dtype)
        r = r * self.wp.unsqueeze(-1)
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
        out = functional_call(self.model, {**params, **self.layout.buffers}, (X,))
        (g,) = torch.autograd.grad(self.task.loss(out, y), [leaf])
        return g

    def measure_partition_time(self, flat: torch.Tensor, repeats: int = 3) -> float:
        """Seconds per partition gradient on this machine (median of ``repeats`` full passes / n)."""
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.all(flat)
            times.append(time.perf_counter() - t0)
        self.evaluations -= repeats * self.n
        return float(np.median(times)) / self.n
