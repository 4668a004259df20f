"""Binary cyclic gradient coding (BCGC), Ou-azzou, Kissami and Bergou.

Classes K_j = {i in [n] : i = j mod (s+1)}, j = 0..s. Worker i gets the cyclic
support S_i = {i, i+1, ..., i+L_i-1} mod n, b_{i,l} = 1 iff (l - i) mod n <= L_i - 1.

* (s+1) | n (Sec. III): L_i = s+1 for all i, B = Circ(1,...,1,0,...,0) is circulant.
* (s+1) does not divide n, n = l(s+1) + r, 1 <= r <= s (Sec. IV, eq. (16)):

      L_i = s+1      for 0 <= i <= n-s-2,
            s+1+r    for n-s-1 <= i <= n-r-1,
            r        for n-r <= i <= n-1,

  i.e. every worker of K_j has load s+1 except the last one, which gets the
  n - (|K_j|-1)(s+1) remaining chunks, so the supports of each class are
  consecutive cyclic intervals that partition [n] (Prop. IV.4).

Every column has weight s+1, nnz(B) = n(s+1), rank B = n-s, and the binary
recovering sets (R with 1_R B = 1) are exactly the classes (Thm. III.6, IV.5).
Decoding: sum the messages of the first complete class (Algorithms 1-2).
"""

from __future__ import annotations

from .binary import BinaryClassCode
from .validation import check_n_s


def bcgc_loads(n: int, s: int) -> list[int]:
    """The loads L_i of eq. (16) (all s+1 when (s+1) | n)."""
    c = s + 1
    ell, r = divmod(n, c)
    if r == 0:
        return [c] * n
    return [c if i <= n - s - 2 else (c + r if i <= n - r - 1 else r) for i in range(n)]


class BinaryCyclicCode(BinaryClassCode):
    name = "bcgc"

    def __init__(self, n: int, s: int):
        n, s = check_n_s(self.name, n, s)
        c = s + 1
        loads = bcgc_loads(n, s)
        supports = [[(i + t) % n for t in range(L)] for i, L in enumerate(loads)]
        classes = [list(range(j, n, c)) for j in range(c)]
        super().__init__(n, s, supports, classes)
        self.ell, self.r = divmod(n, c)

    def class_partitions(self) -> list[list[list[int]]]:
        """P_j = {S_i : i in K_j}, the partition of [n] induced by class K_j (Sec. V)."""
        return [[self.supports[i] for i in K] for K in self.classes]
