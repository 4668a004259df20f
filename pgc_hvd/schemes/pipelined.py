"""Pipelined gradient coding (PGC paper, Secs. IV-V) and pipelined BCGC.

Every worker j holds the partitions of its support S_j (|S_j| = L_j, c = s+1 for
FR and CR) and a ring of L_j slots, slot l holding the newest evaluation of
S_j[l]. Warm-up step 0 evaluates all L_j partitions; at step t >= 1 worker j
evaluates only S_j[(t-1) mod L_j] (for CR: D_{(j + (t-1) mod c) mod n}; for FR:
D_{qc + (t-1) mod c}) and sends the ring sum with coefficients 1,

    g^_j^(t) = sum_{l=0}^{c-1} g^{(t-l)}_{S_j[(t-1-l) mod c]},

which equals the GC message when nothing is stale.

* PGC-FR: decode exactly like GC-FR: one message per group, weights 1/n
  (default: wait for n-s arrivals as in the paper; ``decoder="first-complete"``
  fires as soon as every group has a message).
* PGC-CR: sum the first n-s messages with weight 1/(n mu), mu = (n-s)c/n. Over a
  uniformly random straggler set this is unbiased for
  g-bar = (1/(nc)) sum_{i,j} g_i^{(s(t,i,j))} (eq. (2)), and partition k enters with
  total weight |N_k|/mu in [0, 2).
  ``decay`` = rho in [0, 1] (default 1, the paper's) weights the ring slot of age a by rho^a:
  m_j^(t) = sum_{a<c} rho^a g^{(t-a)}_{S_j[(t-1-a) mod c]}, and mu = (n-s)W/n with
  W = sum_{a<c} rho^a. Partition k is evaluated at t, t-1, ..., t-c+1 by its c holders (one
  each), so the decoder is unbiased for (1/(nW)) sum_k sum_{a<c} rho^a g_k^{(t-a)}; rho = 0
  keeps only the n-s fresh gradients (IS-SGD with rotating partitions). Which rho is fastest
  depends on the workload (docs/experiments.md, section 5: 1 on the convex softmax, 0.25-0.5 on
  the digits CNN, 0-0.05 on MNIST-1D); the decision's ``mean_age`` is then the
  coefficient-weighted mean (``age_weighted``), which the momentum correction reads. Built
  through ``DistributedOptimizer`` or ``simulate`` with an optimizer that has momentum beta and
  no ``decay`` given, rho = 1 - beta (the remedy, :func:`pgc_hvd.control.momentum.
  fresh_leaning_decay`; off with ``momentum_correction=False``).
* naive PGC-CR: GC-CR's real coefficients c_{j,l} = B[j, (j+l) mod n] on the ring
  and GC-CR's decoding a_I; exact without staleness but the effective
  coefficients alpha_{m,k} = a_m c_{j_m,l} are unbounded (``alpha_min/max`` in
  every decision) and amplify staleness errors -- kept to show why it diverges.
* PGC-BCGC: BCGC's cyclic supports (loads L_i of eq. (16)) with the PGC rotation
  (ring of L_i slots, staleness up to L_i - 1 <= s + r) and first-complete-class
  decoding; every partition keeps weight exactly 1.
"""

from __future__ import annotations

from pgc_hvd.codes.linear import cyclic_supports

from .coded import BinaryGCScheme, LinearGCScheme
from .protocol import FirstKRound, Scheme


class PGCFRScheme(BinaryGCScheme):
    name = "pgc-fr"
    code_name = "fr"
    pipelined = True
    uses_stale_gradients = True
    default_decoder = "n-s"


class PGCBCGCScheme(BinaryGCScheme):
    name = "pgc-bcgc"
    code_name = "bcgc"
    pipelined = True
    uses_stale_gradients = True

    def __init__(self, n: int, s: int, decoder: str | None = None, recovery: str = "class"):
        super().__init__(n, s, decoder=decoder, recovery=recovery)


class NaivePGCCRScheme(LinearGCScheme):
    name = "pgc-cr-naive"
    code_name = "cr"
    pipelined = True
    uses_stale_gradients = True


class PGCCRScheme(Scheme):
    name = "pgc-cr"
    exact = False
    pipelined = True
    uses_stale_gradients = True
    round_type = FirstKRound

    def __init__(self, n: int, s: int, decay: float = 1.0):
        super().__init__(n, s)        # checks s against n (check_stragglers)
        n, s = self.n, self.s
        decay = float(decay)
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"pgc-cr decay must be in [0, 1] (1: the paper's equal ring sum, "
                             f"0: the fresh gradient only); got {decay}")
        self._supports = cyclic_supports(n, s)
        self.code = None
        self.decay = decay
        self.age_weighted = decay != 1.0
        c = s + 1
        self.ring_weight = sum(decay ** a for a in range(c))     # W = sum_{a<c} rho^a
        self.mu = (n - s) * self.ring_weight / n

    def supports(self):
        return self._supports

    def work_plan(self, worker: int, step: int):
        plan = super().work_plan(worker, step)
        if self.decay == 1.0:
            return plan
        c = len(plan.slot_partitions)
        if step == 0:       # warm-up: every slot fresh; equal coefficients of the same sum W
            coefs = [self.ring_weight / c] * c
        else:               # slot (t-1-a) mod c was evaluated a steps ago
            coefs = [0.0] * c
            for a in range(c):
                coefs[(step - 1 - a) % c] = self.decay ** a
        return type(plan)(plan.worker, plan.step, plan.evaluate,
                          tuple(enumerate(coefs)), plan.slot_partitions)

    def message_key(self, worker: int, step: int):
        """The ring sum's coefficients rotate with the step only when ``decay`` < 1."""
        return worker if self.decay == 1.0 else self.plan_key(worker, step)

    def weights_for(self, workers, rnd):
        w = 1.0 / (self.n * self.mu)
        # ring_decay: the rho this run weights its ring with (the remedy's 1 - beta under
        # momentum, control.momentum.remedy_scheme_options), in every record
        return {i: w for i in workers}, {"mu": self.mu, "ring_decay": self.decay}
