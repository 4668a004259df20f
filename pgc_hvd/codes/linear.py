"""Common base of the real and complex codes decoded by a linear solve."""

from __future__ import annotations

from typing import Sequence

from .base import DecodeResult, GradientCode
from .linear_decoder import LinearSolveDecoder


class LinearCode(GradientCode):
    is_binary = False

    def __init__(self, n, s, B, supports, cache_size: int = 4096):
        super().__init__(n, s, B, supports, classes=None)
        self.solver = LinearSolveDecoder(self.B, cache_size=cache_size)

    def decode_result(self, responders: Sequence[int]) -> DecodeResult:
        return self.solver.solve(responders)


def cyclic_supports(n: int, s: int) -> list[list[int]]:
    """S_i = {i, i+1, ..., i+s} mod n: the cyclic repetition placement."""
    return [[(i + t) % n for t in range(s + 1)] for i in range(n)]
