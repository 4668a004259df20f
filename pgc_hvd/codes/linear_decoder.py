"""Linear-solve decoder for real and complex gradient codes, cached per responder set.

For responders I, solve a_I B_I = 1_{1 x n} in the least-squares sense
(B_I^T a_I^T = 1, an n x |I| system; min-norm solution when |I| > n - s), and
report the decoding vector a (zero outside I), ||a_I||_1 and the residual
||a_I B_I - 1||_2. The decoding vector depends only on the set I, so results
are cached (LRU) by the sorted tuple of responders.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from .base import DecodeResult


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
        res = self._solve(key)
        self._cache[key] = res
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return res

    def _solve(self, I: tuple[int, ...]) -> DecodeResult:
        n = self.n
        a = np.zeros(n, dtype=self.B.dtype)
        if not I:
            return DecodeResult(a=a, norm1=0.0, residual=float(np.sqrt(n)))
        BI = self.B[list(I), :]
        ones = np.ones(n, dtype=self.B.dtype)
        aI, *_ = np.linalg.lstsq(BI.T, ones, rcond=None)
        a[list(I)] = aI
        residual = float(np.linalg.norm(aI @ BI - ones))
        a.setflags(write=False)
        return DecodeResult(a=a, norm1=float(np.abs(aI).sum()), residual=residual)

    def clear(self) -> None:
        self._cache.clear()
