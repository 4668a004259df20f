"""Cyclic repetition codes with real coefficients (Tandon et al., Algorithm 2).

Worker i holds S_i = {i, ..., i+s} mod n. Draw H in R^{s x n} at random with
H 1 = 0 (its last column is minus the sum of the others). Row b_i has support
S_i, b_{i,i} = 1, and its other s entries x solve H[:, S_i \\ {i}] x = -H[:, i],
so B H^T = 0. The rows lie in the (n-s)-dimensional null space of H, which
contains 1; for a generic H every n - s rows are linearly independent, hence
span that null space and so the all-ones vector (the B-span condition).

* ``cr`` (GC-CR of the PGC paper): H with i.i.d. U(0, 1) entries.
* ``gmds`` (the "Gaussian MDS" code of Tandon et al. as used in the BCGC paper):
  H with i.i.d. N(0, 1) entries. The null space of a Gaussian H is an MDS code
  and the rows of B are its minimum-weight codewords on the cyclic supports.

Both are seeded (option ``seed``, default 0) so every rank builds the same B.
Decoding: least-squares solve of a_I B_I = 1 (:class:`LinearSolveDecoder`).
The decoding coefficients are unbounded: ||a_I||_1 grows quickly with n and s.
"""

from __future__ import annotations

import numpy as np

from .linear import LinearCode, cyclic_supports
from .validation import check_n_s


def tandon_cyclic_matrix(n: int, s: int, H: np.ndarray) -> np.ndarray:
    """B with cyclic supports and b_{i,i} = 1, rows in the null space of H (s x n, H 1 = 0)."""
    B = np.zeros((n, n))
    for i, S in enumerate(cyclic_supports(n, s)):
        B[i, i] = 1.0
        if s:
            rest = S[1:]
            B[i, rest] = np.linalg.solve(H[:, rest], -H[:, i])
    return B


def _draw_h(n: int, s: int, rng: np.random.Generator, dist: str) -> np.ndarray:
    H = rng.standard_normal((s, n)) if dist == "normal" else rng.uniform(0.0, 1.0, (s, n))
    if s:
        H[:, -1] = -H[:, :-1].sum(axis=1)
    return H


class _TandonCyclicCode(LinearCode):
    dist = "uniform"

    def __init__(self, n: int, s: int, seed: int = 0, cache_size: int = 4096):
        n, s = check_n_s(self.name, n, s)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"{self.name}: seed must be an integer, got {seed!r}; e.g. seed=0")
        rng = np.random.default_rng(int(seed))
        B = tandon_cyclic_matrix(n, s, _draw_h(n, s, rng, self.dist))
        super().__init__(n, s, B, cyclic_supports(n, s), cache_size=cache_size)
        self.seed = int(seed)


class CyclicRepetitionCode(_TandonCyclicCode):
    name = "cr"
    dist = "uniform"


class GaussianMDSCode(_TandonCyclicCode):
    name = "gmds"
    dist = "normal"
