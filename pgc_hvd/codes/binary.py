"""Common base of the binary class codes: B in {0,1}^{n x n}, classes K_j whose
supports partition [n], decoding by summation of one complete recovery group."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .base import DecodeResult, GradientCode
from .class_decoder import FirstCompleteDecoder


def binary_matrix(n: int, supports: Sequence[Sequence[int]]) -> np.ndarray:
    B = np.zeros((n, n))
    for i, S in enumerate(supports):
        B[i, list(S)] = 1.0
    return B


class BinaryClassCode(GradientCode):
    """Binary code whose workers split into classes K_0..K_s; sum_{i in K_j} b_i = 1.

    ``recovery_groups`` (default: the classes, one worker per block) says which
    worker sets can be summed; FRC and GFRC override it with their coarser
    "one worker per block" groups.
    """

    is_binary = True

    def __init__(self, n: int, s: int, supports, classes,
                 recovery_groups: Optional[Sequence[Sequence[Sequence[int]]]] = None):
        super().__init__(n, s, binary_matrix(n, supports), supports, classes)
        if recovery_groups is None:
            recovery_groups = [[[i] for i in K] for K in self.classes]
        self.recovery_groups = [[list(b) for b in g] for g in recovery_groups]

    def decoder(self, mode: str = "cover") -> FirstCompleteDecoder:
        """A fresh streaming decoder over the recovery groups (``mode="cover"``)
        or strictly over the classes (``mode="class"``, BCGC Algorithm 1)."""
        if mode == "cover":
            return FirstCompleteDecoder(self.n, self.recovery_groups)
        if mode == "class":
            return FirstCompleteDecoder(self.n, [[[i] for i in K] for K in self.classes])
        raise ValueError(f"decoder mode must be 'cover' or 'class', got {mode!r}")

    def decode_result(self, responders: Sequence[int], mode: str = "cover") -> DecodeResult:
        dec = self.decoder(mode)
        for i in responders:
            if dec.offer(i) is not None:
                a = dec.vector()
                return DecodeResult(a=a, norm1=float(a.sum()), residual=0.0, group=dec.complete)
        # no complete group: report the best effort (zero vector) with residual ||1|| = sqrt(n)
        return DecodeResult(a=np.zeros(self.n), norm1=0.0, residual=float(np.sqrt(self.n)), group=None)
