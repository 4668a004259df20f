"""The gradient-code object shared by every construction.

A gradient code for n workers, n data partitions D_0..D_{n-1} and s stragglers
is an encoding matrix B in F^{n x n} (F = R or C). Worker i holds the
partitions in supp(b_i) (its *support*, listed in the order in which a
pipelined worker rotates through them) and sends the coded message

    g^_i = sum_k B[i, k] g_k .

Given the set I of responders, a decoding vector a (zero outside I) with

    a_I B_I = 1_{1 x n}                                                     (B-span)

recovers g = sum_k g_k = sum_{i in I} a_i g^_i. A code tolerates s stragglers
when every I with |I| = n - s admits such an a.

Two families share this interface:

* binary class codes (``uncoded``, ``fr``, ``gfrc``, ``bcgc``): B in {0,1}, the
  workers split into classes K_0..K_s, each of whose supports partition [n],
  so a = 1_{K_j} for any complete class; decoded by
  :class:`~pgc_hvd.codes.class_decoder.FirstCompleteDecoder` (O(1) per arrival);
* linear codes (``cr``, ``gmds``, ``rs``, ``cyclic-mds``): real or complex B,
  decoded by a least-squares solve cached per responder set
  (:class:`~pgc_hvd.codes.linear_decoder.LinearSolveDecoder`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

from .errors import NotDecodable

#: default tolerance of :meth:`GradientCode.decode`: the RMS error of the
#: recovered partition weights, ||a_I B_I - 1||_2 / sqrt(n), above which the
#: responders are declared unable to recover the gradient. Exact decodes land at
#: <= 3e-9 (docs/codes.md, n = 100); 1e-3 once accepted RS (n=26, s=9) from 16 < n-s
#: responders at RMS error 7e-4, an approximate gradient reported as exact.
DEFAULT_DECODE_TOL = 1e-6


@dataclass(frozen=True)
class DecodeResult:
    """A decoding vector and how good it is.

    a:        length-n vector, zero outside the responders, a @ B ~= 1.
    norm1:    ||a_I||_1 (the amplification of per-message errors, BCGC Prop. V.2).
    residual: ||a_I B_I - 1||_2 (0 for binary codes).
    group:    index of the recovery partition / class used (binary codes), else None.
    """

    a: np.ndarray
    norm1: float
    residual: float
    group: Optional[int] = None


def _as_responders(n: int, responders: Iterable[int]) -> list[int]:
    out: list[int] = []
    seen = set()
    for i in responders:
        try:
            i = operator.index(i)  # 1.9 is not worker 1
        except TypeError:
            raise TypeError(f"responders must be worker indices (ints), got {i!r}") from None
        if not 0 <= i < n:
            raise ValueError(f"responder {i} is not a worker index in [0, {n - 1}]")
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


class GradientCode:
    """Base class: holds B and the supports; subclasses implement ``decode_result``.

    Attributes
    ----------
    name:     registry name (``"bcgc"``, ``"rs"``, ...).
    n, s:     workers (= partitions) and stragglers tolerated.
    B:        encoding matrix, numpy (n, n), float64 or complex128.
    supports: supports[i] = partitions held by worker i, in rotation order.
    classes:  list of worker lists K_j for binary class codes, else None.
    """

    name: str = "code"
    is_binary: bool = False

    def __init__(self, n: int, s: int, B: np.ndarray, supports: Sequence[Sequence[int]],
                 classes: Optional[Sequence[Sequence[int]]] = None):
        self.n = int(n)
        self.s = int(s)
        self.B = np.asarray(B)
        self.B.setflags(write=False)
        self.supports = [list(map(int, S)) for S in supports]
        self.classes = None if classes is None else [list(map(int, K)) for K in classes]

    # -- structure ---------------------------------------------------------
    @property
    def is_complex(self) -> bool:
        return np.iscomplexobj(self.B)

    @property
    def loads(self) -> list[int]:
        """L_i = |supp(b_i)|, the number of partitions worker i evaluates (GC) or rotates through (PGC)."""
        return [len(S) for S in self.supports]

    def coefficients(self, worker: int) -> list[tuple[int, complex | float]]:
        """(partition, B[worker, partition]) pairs of worker's coded message, in support order."""
        row = self.B[worker]
        return [(k, row[k].item()) for k in self.supports[worker]]

    # -- decoding ----------------------------------------------------------
    def decode_result(self, responders: Sequence[int]) -> DecodeResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, responders: Iterable[int], tol: float = DEFAULT_DECODE_TOL) -> np.ndarray:
        """Decoding vector a (length n, zero outside ``responders``) with a @ B ~= 1.

        ``responders`` is taken in arrival order (binary codes return the first
        recovery group completed in that order). Raises :class:`NotDecodable`
        when no such vector exists (binary: no complete group; linear: RMS
        residual ||a_I B_I - 1||_2 / sqrt(n) > tol).
        """
        if not (isinstance(tol, (int, float)) and 0 < tol < 1):
            raise ValueError(f"tol is the largest RMS residual accepted, in (0, 1) (default "
                             f"{DEFAULT_DECODE_TOL}), got {tol!r}")
        res = self.decode_result(_as_responders(self.n, responders))
        if res.residual > tol * np.sqrt(self.n):
            raise NotDecodable(
                f"{self.name}(n={self.n}, s={self.s}): responders cannot recover the gradient "
                f"(residual {res.residual:.3g}); at least n-s={self.n - self.s} responders are needed"
            )
        return res.a

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} n={self.n} s={self.s}>"
