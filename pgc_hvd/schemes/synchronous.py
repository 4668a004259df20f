"""Uncoded schemes: every worker holds one partition (B = I).

* DGD: wait for all n workers, g^ = (1/n) sum_i g_i.
* IS-SGD (ignore-straggler SGD): use the first n-s arrivals, rescaled,
  g^ = (1/(n-s)) sum_{i in I} g_i -- unbiased over a uniformly random straggler
  set, but only n-s partitions contribute to each step.
"""

from __future__ import annotations

from pgc_hvd.codes import get_code

from .protocol import Scheme
from .rounds import FirstKRound
from .validation import check_scheme_n_s


class DGD(Scheme):
    name = "dgd"
    round_type = FirstKRound

    def __init__(self, n: int, s: int = 0):
        n, s = check_scheme_n_s(self.name, n, s)
        super().__init__(n, s)
        self.code = get_code("uncoded", n, 0)
        self.wait_for = n

    def supports(self):
        return self.code.supports

    def weights_for(self, workers, rnd):
        return {i: 1.0 / self.n for i in workers}, {}


class ISSGD(DGD):
    name = "is-sgd"
    exact = False

    def __init__(self, n: int, s: int):
        super().__init__(n, s)
        self.wait_for = self.n - self.s

    def weights_for(self, workers, rnd):
        k = len(workers)
        return {i: 1.0 / k for i in workers}, {}
