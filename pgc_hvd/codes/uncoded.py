"""The uncoded scheme: B = I_n, worker i holds only D_i (DGD, IS-SGD).

Exact recovery needs every worker (a = 1_{[n]}), so as a code it tolerates no
straggler and only s = 0 is valid; IS-SGD builds it with s = 0 and ignores its
own s stragglers on top.
"""

from __future__ import annotations

from .binary import BinaryClassCode
from .validation import check_n_s


class UncodedCode(BinaryClassCode):
    name = "uncoded"

    def __init__(self, n: int, s: int = 0):
        n, s = check_n_s(self.name, n, s)
        if s != 0:
            raise ValueError(
                f"uncoded: B = I tolerates no straggler, so s must be 0, got s={s}; "
                f"use s=0, or a code that tolerates s={s} such as 'bcgc' or 'gfrc'"
            )
        supports = [[i] for i in range(n)]
        super().__init__(n, s, supports, classes=[list(range(n))])
