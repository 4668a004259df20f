"""Linear-solve decoder for real and complex gradient codes, cached per responder set.

For responders I, solve a_I B_I = 1_{1 x n} in the least-squares sense
(B_I^T a_I^T = 1, an n x |I| system, by QR; min-norm lstsq solution when |I| > n - s), and
report the decoding vector a (zero outside I), ||a_I||_1 and the residual
||a_I B_I - 1||_2. The decoding vector depends only on the set I, so results
are cached (LRU) by the sorted tuple of responders.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from .base import DecodeResult


def _solve_transposed(BI: np.ndarray, ones: np.ndarray) -> np.ndarray:
    """Least-squares a_I for B_I^T a_I = 1.

    Householder QR of B_I^T (n x |I|, full column rank when |I| <= n - s for an MDS-type
    code) is both faster and more accurate here than SVD-based lstsq, whose singular
    value cut-off truncates the ill-conditioned systems of RS / cyclic MDS at n = 100.
    Falls back to lstsq (minimum-norm solution) when R is numerically singular,
    e.g. when more than n - s responders are given.
    """
    M = BI.T
    Q, R = np.linalg.qr(M)
    d = np.abs(np.diag(R))
    if d.size and d.min() > d.max() * M.shape[0] * np.finfo(float).eps:
        return np.linalg.solve(R, Q.conj().T @ ones)
    return np.linalg.lstsq(M, ones, rcond=None)[0]


class LinearSolveDecoder:
    def __init__(self, B: np.ndarray, cache_size: int = 4096):
        self.B = np.asarray(B)
        self.n = self.B.shape[0]
        self.cache_size = int(cache_size)
        self._cache: "OrderedDict[tuple[int, ...], DecodeResult]" = OrderedDict()
        self.hits = 0
        self.misses = 0

    def solve(self, responders: Sequence[int]) -> DecodeResult:
        key = tuple(sorted(int(i) for i in responders))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return hit
        self.misses += 1
        res = self.solve_uncached(key)
        self._cache[key] = res
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return res

    def solve_uncached(self, I: tuple[int, ...]) -> DecodeResult:
        n = self.n
        a = np.zeros(n, dtype=self.B.dtype)
        if not I:
            return DecodeResult(a=a, norm1=0.0, residual=float(np.sqrt(n)))
        BI = self.B[list(I), :]
        ones = np.ones(n, dtype=self.B.dtype)
        aI = _solve_transposed(BI, ones)
        a[list(I)] = aI
        residual = float(np.linalg.norm(aI @ BI - ones))
        a.setflags(write=False)
        return DecodeResult(a=a, norm1=float(np.abs(aI).sum()), residual=residual)

    def clear(self) -> None:
        self._cache.clear()
