"""Uncoded schemes: every worker holds one partition (B = I).

* DGD: wait for all n workers, g^ = (1/n) sum_i g_i.
* IS-SGD (ignore-straggler SGD): use the first n-s arrivals, rescaled,
  g^ = (1/(n-s)) sum_{i in I} g_i -- unbiased over a uniformly random straggler
  set, but only n-s partitions contribute to each step.
"""

from __future__ import annotations

from pgc_hvd.codes import get_code

from .protocol import FirstKRound, Scheme


class DGDScheme(Scheme):
    """Synchronous distributed gradient descent: every step waits for all n workers, so it
    tolerates no straggler and takes s = 0 only. A budget s > 0 is refused rather than ignored
    (a run asking for s = 1 would believe it tolerates a straggler): pass s = 0, ``is-sgd`` to
    drop the s slowest, or a coded scheme to tolerate s exactly
    (:meth:`~pgc_hvd.schemes.protocol.Scheme.check_stragglers`). The papers' experiments run
    DGD beside schemes of budget s: they ask for
    :meth:`~pgc_hvd.schemes.protocol.Scheme.setting_stragglers` (0 here) explicitly."""

    name = "dgd"
    round_type = FirstKRound
    waits_for_all = True     # so s must be 0 (IS-SGD, which waits for n - s, sets False)

    def __init__(self, n: int, s: int = 0):
        super().__init__(n, s)        # checks s against n: 0 only (check_stragglers)
        self.code = get_code("uncoded", self.n, 0)

    def supports(self):
        return self.code.supports

    def weights_for(self, workers, rnd):
        return {i: 1.0 / self.n for i in workers}, {}


class ISSGDScheme(DGDScheme):
    name = "is-sgd"
    exact = False
    waits_for_all = False

    def __init__(self, n: int, s: int):
        super().__init__(n, s)

    def weights_for(self, workers, rnd):
        k = len(workers)
        return {i: 1.0 / k for i in workers}, {}
