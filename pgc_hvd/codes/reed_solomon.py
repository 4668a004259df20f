"""Reed-Solomon gradient code of Halbawi et al. (complex).

Evaluation points alpha_i = exp(2 pi sqrt(-1) i / n), i in [n] (distinct, non-zero).
Partition k is held by the workers W_k = {k-s, ..., k} mod n (so worker i holds
{i, ..., i+s}, the same placement as cyclic repetition). Column k of B is the
codeword of the [n, n-s] Reed-Solomon code given by the polynomial

    p_k(x) = prod_{m not in W_k} (x - alpha_m) / (-alpha_m),   deg p_k = n-s-1,  p_k(0) = 1,

i.e. B[i, k] = p_k(alpha_i), which vanishes outside W_k. Hence B = G T with G the
n x (n-s) Vandermonde matrix [alpha_i^e] and T the coefficients, whose first row
is p_k(0) = 1. For any |I| = n-s, G_I is invertible and a_I = e_0^T G_I^{-1}
(the Lagrange weights of evaluation at 0) gives a_I B_I = e_0^T T = 1.

Messages are complex; the real part of the decoded sum is the gradient.
"""

from __future__ import annotations

import numpy as np

from .linear import LinearCode, cyclic_supports
from .validation import check_n_s


def rs_points(n: int) -> np.ndarray:
    return np.exp(2j * np.pi * np.arange(n) / n)


class ReedSolomonCode(LinearCode):
    name = "rs"

    def __init__(self, n: int, s: int, cache_size: int = 4096):
        n, s = check_n_s(self.name, n, s)
        alpha = rs_points(n)
        B = np.zeros((n, n), dtype=complex)
        for k in range(n):
            holders = [(k - t) % n for t in range(s + 1)]
            others = np.setdiff1d(np.arange(n), holders)
            for i in holders:
                B[i, k] = np.prod((alpha[i] - alpha[others]) / (-alpha[others]))
        super().__init__(n, s, B, cyclic_supports(n, s), cache_size=cache_size)
        self.alpha = alpha
