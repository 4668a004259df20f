"""Cyclic MDS gradient code of Raviv, Tamo, Tandon and Dimakis (complex).

Let beta = exp(2 pi sqrt(-1) / n) and C the cyclic [n, n-s] Reed-Solomon code over C
with generator polynomial g(x) = prod_{m=1}^{s} (x - beta^m). Row i of B is the
codeword x^i g(x) mod (x^n - 1), supported on {i, ..., i+s} mod n (a cyclic shift
of the generator, so B is circulant). The all-ones word sum_j x^j vanishes at
every beta^m, m != 0 mod n, so 1 is in C; since C is MDS, any n-s of the shifts
are linearly independent and span C, hence 1 (the B-span condition).
Decoding: least-squares solve of a_I B_I = 1 (complex); the decoding vectors get
very large for big n (BCGC paper: norm ~1e8 at n = 100).
"""

from __future__ import annotations

import numpy as np

from .linear import LinearCode, cyclic_supports
from .validation import check_n_s


def _root(n: int, e: int) -> complex:
    """beta^e with the exponent reduced mod n first (keeps |beta^e| = 1 to rounding)."""
    return complex(np.exp(2j * np.pi * (e % n) / n))


def generator_coefficients(n: int, s: int) -> np.ndarray:
    """Coefficients g_0..g_s of g(x) = prod_{m=1}^{s} (x - q^m), q = beta.

    Expanding the product by repeated multiplication loses about s digits of
    accuracy's worth of rounding (1e-7 at n = 40); instead use the q-binomial
    theorem: e_j(q, ..., q^s) = q^{j(j+1)/2} [s choose j]_q with
    [s choose j]_q = prod_{i=1}^{j} (1 - q^{s-j+i}) / (1 - q^i) (never 0/0 since
    s < n), so g_k = (-1)^{s-k} e_{s-k}, each to a few ulps.
    """
    g = np.zeros(s + 1, dtype=complex)
    for k in range(s + 1):
        j = s - k
        binom = 1.0 + 0j
        for i in range(1, j + 1):
            binom *= (1 - _root(n, s - j + i)) / (1 - _root(n, i))
        g[k] = (-1) ** j * _root(n, j * (j + 1) // 2) * binom
    return g


class CyclicMDSCode(LinearCode):
    name = "cyclic-mds"

    def __init__(self, n: int, s: int, cache_size: int = 4096):
        n, s = check_n_s(self.name, n, s)
        g = generator_coefficients(n, s)
        B = np.zeros((n, n), dtype=complex)
        for i in range(n):
            for t in range(s + 1):
                B[i, (i + t) % n] = g[t]
        super().__init__(n, s, B, cyclic_supports(n, s), cache_size=cache_size)
