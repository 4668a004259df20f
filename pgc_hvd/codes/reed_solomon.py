"""Reed-Solomon gradient code of Halbawi et al. (complex).

Partition k is held by the workers W_k = {k-s, ..., k} mod n (so worker i holds {i, ..., i+s},
the same placement as cyclic repetition). Worker i evaluates at the point alpha_i, and column k
of B is the codeword of the [n, n-s] Reed-Solomon code given by the polynomial

    p_k(x) = prod_{m not in W_k} (x - alpha_m) / (-alpha_m),   deg p_k = n-s-1,  p_k(0) = 1,

i.e. B[i, k] = p_k(alpha_i), which vanishes outside W_k. Hence B = G T with G the
n x (n-s) Vandermonde matrix [alpha_i^e] and T the coefficients, whose first row
is p_k(0) = 1. For any |I| = n-s, G_I is invertible and a_I = e_0^T G_I^{-1}
(the Lagrange weights of evaluation at 0) gives a_I B_I = 1.

Evaluation points. Halbawi et al. allow any distinct non-zero points; we take the n-th roots of
unity in the order of a stride q coprime to n,

    alpha_i = exp(2 pi sqrt(-1) q i / n),

because the order decides how large B is. Since prod_{m != i} |alpha_i - alpha_m| = n for the
n-th roots of unity,

    |B[i, k]| = n / prod_{m in W_k, m != i} |alpha_i - alpha_m|    (i in W_k),

the same for every k (W_k is a shift of W_0). With q = 1 the s+1 holders of a partition sit next
to each other on the circle (distances ~ 2 pi / n), so at n = 100, s = 20 the entries of B reach
1e13 and decoding in double precision fails (||a_I B_I - 1|| ~ 1-10: the messages cancel to
~1e-13 relative). The default ``stride=None`` takes the q in [1, n/2] coprime to n that minimises
max |B[i, k]| (smallest q on ties; q and n - q give conjugate points): the holders are spread
round the circle, max |B| ~ 10 and the residual is ~1e-12 at n = 100 (docs/codes.md).
``stride=1`` is the consecutive order (the evaluation points of the first version of this
module), kept to show the instability.

Messages are complex; the real part of the decoded sum is the gradient.
"""

from __future__ import annotations

import math

import numpy as np

from .linear import LinearCode, cyclic_supports
from .validation import check_n_s


def rs_points(n: int, stride: int = 1) -> np.ndarray:
    """alpha_i = exp(2 pi sqrt(-1) stride i / n), i in [n] (distinct when gcd(stride, n) = 1)."""
    return np.exp(2j * np.pi * ((stride * np.arange(n)) % n) / n)


def log_max_entry(n: int, s: int, stride: int) -> float:
    """log max_{i, k} |B[i, k]| for the points of ``stride`` (closed form, O(s^2))."""
    pts = rs_points(n, stride)[: s + 1]  # the points of W_0 = {0, ..., s} up to a rotation
    worst = -math.inf
    for t in range(s + 1):
        others = np.delete(pts, t)
        worst = max(worst, math.log(n) - float(np.sum(np.log(np.abs(pts[t] - others)))))
    return worst


def best_stride(n: int, s: int) -> int:
    """The stride q in [1, n/2], gcd(q, n) = 1, that minimises max |B| (smallest q on ties)."""
    candidates = [q for q in range(1, n // 2 + 1) if math.gcd(q, n) == 1] or [1]
    scores = [(round(log_max_entry(n, s, q), 9), q) for q in candidates]
    return min(scores)[1]


class ReedSolomonCode(LinearCode):
    name = "rs"

    def __init__(self, n: int, s: int, stride: int | None = None, cache_size: int = 4096):
        n, s = check_n_s(self.name, n, s)
        if stride is None:
            stride = best_stride(n, s)
        elif isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not (
            1 <= stride < n or n == 1
        ) or math.gcd(int(stride), n) != 1:
            raise ValueError(
                f"rs: stride must be an integer in [1, n) coprime to n={n} (distinct evaluation "
                f"points), got {stride!r}; omit it to pick the best-conditioned stride"
            )
        stride = int(stride)
        alpha = rs_points(n, stride)
        B = np.zeros((n, n), dtype=complex)
        for k in range(n):
            holders = [(k - t) % n for t in range(s + 1)]
            others = np.setdiff1d(np.arange(n), holders)
            for i in holders:
                B[i, k] = np.prod((alpha[i] - alpha[others]) / (-alpha[others]))
        super().__init__(n, s, B, cyclic_supports(n, s), cache_size=cache_size)
        self.alpha = alpha
        self.stride = stride
