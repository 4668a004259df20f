"""Error decomposition of the update (PGC paper, Lemmas 1 and 3), on demand in the simulator.

With grad F(beta_t) the full gradient (all data, no minibatch) at the current model and

    nabla_bar_t = sum_m a_m sum_l b_{m,l} grad F_{k(l)}(beta_{v(l)})

the *full-data* partition gradients at the versions the used entries were evaluated at (the
"averaged full gradient" of Lemma 3; Lemma 1's (1/n) sum_i grad F_i(beta^{s(t,i)}) for PGC-FR),

    ||g_hat - grad F(beta_t)||^2 = ||nabla_bar - grad F(beta_t)||^2      staleness bias (+ coding)
                                 + ||g_hat - nabla_bar||^2               stochastic (minibatch, compression)
                                 + 2 <g_hat - nabla_bar, nabla_bar - grad F(beta_t)>   cross (0 in expectation)

The bias is split further into ``lemma_coding`` = ||sum_k p_k grad F_k(beta_t) - grad F(beta_t)||^2
(straggler/decoding weights p_k != 1/n, 0 for exact schemes) and ``lemma_stale`` = ||nabla_bar -
sum_k p_k grad F_k(beta_t)||^2. Unlike :func:`pgc_hvd.metrics.diagnostics.error_decomposition`
(which compares with the minibatch gradients of the step), this needs full-partition gradients at
every stale version: it is a probe, run every ``every`` steps via ``SimConfig.step_hook``::

    probe = DecompositionProbe(every=10)
    simulate(..., step_hook=probe);  summary = probe.summary()
"""

from __future__ import annotations

import numpy as np
import torch

from pgc_hvd.sim.gradients import PartitionGradients


def _sq(x) -> float:
    return float(x.double().pow(2).sum())


class DecompositionProbe:
    def __init__(self, every: int = 10, chain=None):
        self.every = max(1, int(every))
        self.chain = chain          # another step_hook to call first (e.g. the control rule)
        self._full = None
        self._cache: dict[int, torch.Tensor] = {}
        self.rows: list[dict] = []

    def _full_grads(self, sim, v: int) -> torch.Tensor:
        if self._full is None:
            parts = [p.numpy() for p in sim.grads.parts]
            self._full = PartitionGradients(sim.task, sim.X, sim.y, parts, batch_size=None,
                                            seed=sim.cfg.seed)
        G = self._cache.get(v)
        if G is None:
            G = self._full.all(sim.snapshots[v], step=v)
            self._cache[v] = G
        return G

    def __call__(self, sim, step, decision, g_hat, extra) -> None:
        if self.chain is not None:
            self.chain(sim, step, decision, g_hat, extra)
        if step % self.every:
            return
        G_t = self._full_grads(sim, step)
        grad_F = G_t.mean(0)   # the engine's convention: the mean of the partition gradients
        nabla_bar = torch.zeros_like(grad_F)
        fresh = torch.zeros_like(grad_F)
        for u in decision.uses:
            arr = sim.store[(u.worker, u.step)]["arrival"]
            plan = sim.scheme.work_plan(u.worker, u.step)
            vers = arr.slot_versions or tuple(u.version for _ in plan.combine)
            wgt = u.weight
            for (slot, coef), v in zip(plan.combine, vers):
                k = plan.slot_partitions[slot]
                c = complex(coef) * complex(wgt)
                c = c.real
                nabla_bar += c * self._full_grads(sim, v)[k]
                fresh += c * G_t[k]
        g = g_hat.to(grad_F.dtype)
        row = {"step": step,
               "lemma_total": _sq(g - grad_F),
               "lemma_bias": _sq(nabla_bar - grad_F),
               "lemma_stale": _sq(nabla_bar - fresh),
               "lemma_coding": _sq(fresh - grad_F),
               "lemma_stochastic": _sq(g - nabla_bar),
               "grad_F_sq": _sq(grad_F)}
        row["lemma_cross"] = row["lemma_total"] - row["lemma_bias"] - row["lemma_stochastic"]
        extra.update(row)
        self.rows.append(row)
        for old in [k for k in self._cache if k < step - 64]:
            del self._cache[old]

    def summary(self) -> dict:
        if not self.rows:
            return {}
        keys = [k for k in self.rows[0] if k != "step"]
        out = {k + "_mean": float(np.mean([r[k] for r in self.rows])) for k in keys}
        tot = out["lemma_total_mean"]
        if tot > 1e-20:
            out["share_bias"] = out["lemma_bias_mean"] / tot
            out["share_stochastic"] = out["lemma_stochastic_mean"] / tot
        out["probes"] = len(self.rows)
        return out
