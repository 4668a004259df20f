"""IS-GC: ignore-straggler gradient coding (the PGC paper's baseline).

Cyclic placement with c partitions per worker (default c = 2, the smallest
value that codes at all), binary messages g^_i = sum_{k in S_i} g_k. The master
takes the first n-s arrivals and, in arrival order, greedily keeps every
worker whose support is disjoint from those already kept; the covered set
U (|U| = c * kept) gives the estimate g^ = (1/|U|) sum_{kept} g^_i of the average
gradient (weights 1/|U|; exact when U = [n]).
"""

from __future__ import annotations

from pgc_hvd.codes.linear import cyclic_supports

from .protocol import FirstKRound, Scheme
from .validation import check_positive_int


class ISGCScheme(Scheme):
    name = "is-gc"
    exact = False
    round_type = FirstKRound

    def __init__(self, n: int, s: int, c: int = 2):
        super().__init__(n, s)        # checks s against n (check_stragglers)
        n, s = self.n, self.s
        c = check_positive_int(self.name, "c", c, 1, n, hint=f"use c in [1, {n}], e.g. c=2")
        self._supports = cyclic_supports(n, c - 1)   # c partitions per worker
        self.code = None

    def supports(self):
        return self._supports

    def weights_for(self, workers, rnd):
        covered: set[int] = set()
        kept = []
        for i in workers:
            S = self._supports[i]
            if covered.isdisjoint(S):
                kept.append(i)
                covered.update(S)
        w = 1.0 / len(covered)
        return {i: w for i in kept}, {"covered": len(covered)}
