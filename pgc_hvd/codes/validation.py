"""Checks on the code parameters (n, s) with error messages that name the
constraint and a valid alternative."""

from __future__ import annotations

import numbers


def check_n_s(name: str, n, s, *, min_n: int = 1) -> tuple[int, int]:
    """Return (n, s) as ints after checking 1 <= min_n <= n and 0 <= s <= n - 1.

    s is the number of stragglers tolerated; a code needs n - s >= 1 responders,
    so s = n - 1 (every worker holds every partition) is the largest valid s.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"{name}: n (number of workers) must be an integer, got {n!r}; e.g. n=12")
    if isinstance(s, bool) or not isinstance(s, numbers.Integral):
        raise ValueError(f"{name}: s (stragglers tolerated) must be an integer, got {s!r}; e.g. s=1")
    n, s = int(n), int(s)
    if n < min_n:
        raise ValueError(f"{name}: needs n >= {min_n} workers, got n={n}; use n={min_n} or more")
    if not 0 <= s <= n - 1:
        raise ValueError(
            f"{name}: needs 0 <= s <= n-1 (at least one of the n workers must respond), "
            f"got n={n}, s={s}; use s in [0, {n - 1}]"
        )
    return n, s


def divisors_minus_one(n: int) -> list[int]:
    """All s with (s+1) | n, i.e. the s for which the fractional repetition code exists."""
    return [d - 1 for d in range(1, n + 1) if n % d == 0]
