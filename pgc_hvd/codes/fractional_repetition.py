"""Fractional repetition code (FRC) of Tandon et al., needs (s+1) | n.

With c = s+1 and l = n/c groups, worker i belongs to group q = floor(i/c) and
holds D_{qc}, ..., D_{qc+c-1}; every worker sends the plain sum of its c
partition gradients (B = I_l (x) 1_{c x c}, binary). One worker per group
recovers g; s stragglers cannot empty a group of s+1 workers.

Classes (BCGC paper, Sec. II-B): K_j = {j + q c : q in [l]}, j = 0..s, picks the
j-th worker of every group. The recovery groups used by the default ("cover")
decoder are coarser: any one worker per group.
"""

from __future__ import annotations

from .binary import BinaryClassCode
from .validation import check_n_s, divisors_minus_one


class FractionalRepetitionCode(BinaryClassCode):
    name = "fr"

    def __init__(self, n: int, s: int):
        n, s = check_n_s(self.name, n, s)
        c = s + 1
        if n % c:
            ok = divisors_minus_one(n)
            up = -(-n // c) * c
            raise ValueError(
                f"fr: fractional repetition needs (s+1) | n, got n={n}, s={s} (s+1={c}); "
                f"use s in {{{', '.join(map(str, ok))}}} for n={n}, or n={up} for s={s}, or code 'gfrc' / 'bcgc' which accept any s"
            )
        groups = n // c
        supports = [[(i // c) * c + l for l in range(c)] for i in range(n)]
        classes = [[j + q * c for q in range(groups)] for j in range(c)]
        cover = [[[q * c + j for j in range(c)] for q in range(groups)]]
        super().__init__(n, s, supports, classes, recovery_groups=cover)
        self.c = c
        self.groups = groups
