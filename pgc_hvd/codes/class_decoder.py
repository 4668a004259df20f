"""Decoders for binary class codes (FRC, GFRC, BCGC, uncoded).

A *recovery group* is a partition of the data [n] into blocks, each block being
the support shared by a set of interchangeable workers. Receiving one worker of
every block of a group recovers g = sum_k g_k by plain summation:
a = sum over blocks of 1_{representative}, a B = 1_{1 x n}.

* BCGC (and the class decoder of FRC/GFRC): the groups are the classes
  K_0..K_s, every block holds a single worker (BCGC paper, Algorithms 1-2).
* FRC / GFRC "cover" decoding: the workers of classes that use the same
  partition are interchangeable block by block (FRC: one worker per group of
  s+1 identical workers, Tandon et al.; GFRC: partitions G_1 and G_2), so more
  responder sets decode (BCGC paper, Remark III.9).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


class FirstCompleteDecoder:
    """Streaming first-complete-group decoder.

    Feed arrivals one at a time with :meth:`offer`; each costs O(number of
    blocks the worker belongs to) = O(1). The first group whose every block
    has a responder is returned, together with the representatives (the first
    responder of each block), which give the binary decoding vector.

    ``groups[g][b]`` lists the workers that can fill block b of group g.
    """

    def __init__(self, n: int, groups: Sequence[Sequence[Sequence[int]]]):
        self.n = n
        self.groups = [[list(block) for block in group] for group in groups]
        self._sizes = [len(group) for group in self.groups]
        self._membership: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for g, group in enumerate(self.groups):
            for b, block in enumerate(group):
                for i in block:
                    self._membership[i].append((g, b))
        self.reset()

    def reset(self) -> None:
        """Forget all arrivals (start of a new step)."""
        self._rep = [[-1] * size for size in self._sizes]
        self._count = [0] * len(self._sizes)
        self._seen = bytearray(self.n)
        self.complete: Optional[int] = None

    def offer(self, worker: int) -> Optional[int]:
        """Record that ``worker`` responded; return the completed group index, else None."""
        if self.complete is not None:
            return self.complete
        if not 0 <= worker < len(self._seen):
            raise ValueError(f"worker {worker} is not a worker index in [0, {len(self._seen) - 1}]")
        if self._seen[worker]:
            return None
        self._seen[worker] = 1
        for g, b in self._membership[worker]:
            reps = self._rep[g]
            if reps[b] < 0:
                reps[b] = worker
                self._count[g] += 1
                if self._count[g] == self._sizes[g]:
                    self.complete = g
                    return g
        return None

    def representatives(self, group: Optional[int] = None) -> list[int]:
        """Workers whose messages are summed for ``group`` (default: the completed one)."""
        g = self.complete if group is None else group
        if g is None:
            raise ValueError("no group is complete yet")
        return list(self._rep[g])

    def vector(self) -> np.ndarray:
        """Binary decoding vector a = 1_{representatives} of the completed group."""
        a = np.zeros(self.n)
        a[self.representatives()] = 1.0
        return a


def complete_classes(classes: Sequence[Sequence[int]], responders: Sequence[int]) -> list[int]:
    """Indices j of the classes K_j contained in the responder set."""
    got = set(responders)
    return [j for j, K in enumerate(classes) if all(i in got for i in K)]


def min_error_class(classes: Sequence[Sequence[int]], responders: Sequence[int],
                    error_norms) -> Optional[int]:
    """Minimum-error class decoder (BCGC paper, Sec. VI-B).

    Among the classes K_j complete within ``responders`` (the master waits for
    n - s responses), return the j minimising the total compression error
    sum_{i in K_j} ||eps_i||, eps_i = C(g^_i) - g^_i, where
    ``error_norms[i]`` = ||eps_i|| (a mapping or sequence indexed by worker).
    Ties go to the smallest j. Returns None when no class is complete.
    """
    best_j, best_err = None, None
    for j in complete_classes(classes, responders):
        err = float(sum(error_norms[i] for i in classes[j]))
        if best_err is None or err < best_err:
            best_j, best_err = j, err
    return best_j
