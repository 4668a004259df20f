"""Generalized fractional repetition code (GFRC) of Charalambides et al.,
binary, any 0 <= s <= n-1 (BCGC paper, Definition IV.10).

Write n = l (s+1) + r with l = floor(n/(s+1)), 0 <= r <= s, and use the classes
K_j = {j + q(s+1)} (|K_j| = l+1 for j < r, l otherwise). Worker i_q = j + q(s+1)
(the q-th worker of K_j) gets the q-th of consecutive (non-cyclic) blocks of
[n], larger blocks first, with lengths

    j <  r:  lambda+1 for q < r~,  lambda for q >= r~,   lambda = floor(n/(l+1)), r~ = n mod (l+1)
    j >= r:  mu+1     for q < u,   mu     for q >= u,    mu = floor(n/l),         u  = n mod l

so every class of size l+1 uses the same partition G_1 of [n] and every class
of size l the same partition G_2. When (s+1) | n this is FRC.

Recovery groups: G_1 and G_2, block q of G_1 fillable by any worker
j + q(s+1) with j < r (those workers share that support), likewise for G_2.
"""

from __future__ import annotations

from .binary import BinaryClassCode
from .validation import check_n_s


def _blocks(n: int, parts: int) -> list[list[int]]:
    """Split [n] into ``parts`` consecutive blocks, the n mod parts larger ones first."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for q in range(parts):
        length = base + (1 if q < extra else 0)
        out.append(list(range(start, start + length)))
        start += length
    return out


class GeneralizedFractionalRepetitionCode(BinaryClassCode):
    name = "gfrc"

    def __init__(self, n: int, s: int):
        n, s = check_n_s(self.name, n, s)
        c = s + 1
        ell, r = divmod(n, c)
        classes = [[j + q * c for q in range(ell + (1 if j < r else 0))] for j in range(c)]
        g1 = _blocks(n, ell + 1) if r else None   # partition G_1 (classes of size l+1)
        g2 = _blocks(n, ell)                     # partition G_2 (classes of size l)
        supports: list[list[int]] = [[] for _ in range(n)]
        for j, K in enumerate(classes):
            blocks = g1 if j < r else g2
            for q, i in enumerate(K):
                supports[i] = blocks[q]
        groups = []
        if r:
            groups.append([[j + q * c for j in range(r)] for q in range(ell + 1)])
        if r < c:
            groups.append([[j + q * c for j in range(r, c)] for q in range(ell)])
        super().__init__(n, s, supports, classes, recovery_groups=groups)
        self.ell, self.r = ell, r
