"""Shared helpers for the code tests: responder sets of size n - s."""

from __future__ import annotations

import itertools
import math

import numpy as np


def responder_sets(n: int, s: int, rng: np.random.Generator, limit: int = 120):
    """Every responder set of size n-s (as an arrival order) when C(n, s) <= limit,
    otherwise ``limit`` random ones (random arrival order)."""
    if math.comb(n, s) <= limit:
        for stragglers in itertools.combinations(range(n), s):
            rest = [i for i in range(n) if i not in stragglers]
            yield list(rng.permutation(rest))
    else:
        for _ in range(limit):
            yield list(rng.permutation(n)[: n - s])
