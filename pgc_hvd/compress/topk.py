"""Top-kappa compression settings, one spelling for both engines.

``TopK(ratio=0.01)`` keeps kappa = max(1, min(d, floor(ratio * d))) entries of a coded message of
d entries (or ``k`` entries when given); with ``error_feedback`` (EF-SGD, default on, as top-kappa
without memory is known to lose the mass it never sends) every worker keeps a residual
e <- (m + e) - D(C_kappa(m + e)). ``method`` picks the selection ("exact" radix select or
"threshold", :mod:`pgc_hvd.ops.compress`); both select the same entries.

The command-line spelling, shared by ``pgc-hvd simulate`` and ``pgc-hvd train``::

    --compression topk:RATIO[,ef=0|1][,method=exact|threshold]

parsed by :func:`parse_compression`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from pgc_hvd.options import is_count, split_spec

METHODS = ("exact", "threshold")


@dataclass(frozen=True)
class TopK:
    """Top-kappa compression of the coded message: keep ``ratio * d`` entries (or ``k``)."""

    ratio: float = 0.01
    k: Optional[int] = None
    error_feedback: bool = True
    method: str = "exact"

    def __post_init__(self) -> None:
        if self.k is None and not (isinstance(self.ratio, (int, float))
                                   and not isinstance(self.ratio, bool) and 0 < self.ratio <= 1):
            raise ValueError(f"TopK: ratio = {self.ratio!r}; the fraction kappa/d of entries kept "
                             "must lie in (0, 1], e.g. 0.01")
        if self.k is not None and not is_count(self.k):
            raise ValueError(f"TopK: k = {self.k!r}; give an int >= 1 entries, or None to use "
                             "ratio")
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"TopK: error_feedback = {self.error_feedback!r}; give True or False")
        if self.method not in METHODS:
            raise ValueError(f"TopK: method = {self.method!r}; use 'exact' or 'threshold'")

    def kappa(self, d: int) -> int:
        """kappa = max(1, min(d, k or floor(ratio * d))): the one rule of both engines."""
        k = self.k if self.k is not None else int(math.floor(self.ratio * d))
        return max(1, min(int(k), int(d)))

    def spec(self) -> str:
        """The command-line spelling of this setting (``parse_compression(c.spec()) == c``)."""
        head = f"topk:k={self.k}" if self.k is not None else f"topk:{self.ratio!r}"
        return f"{head},ef={int(self.error_feedback)},method={self.method}"


def parse_compression(spec: Optional[str]) -> Optional[TopK]:
    """``None`` / ``"none"`` -> None (dense messages); ``"topk:RATIO[,ef=0|1][,method=M]"``
    (or ``topk:k=K,...``) -> :class:`TopK`. Raises ValueError naming the part that is wrong and
    an example of the right spelling."""
    if spec is None or str(spec).strip().lower() in ("", "none"):
        return None
    example = ("use topk:RATIO[,ef=0|1][,method=exact|threshold] (or topk:k=COUNT,...), e.g. "
               "topk:0.01 or topk:0.01,ef=0,method=threshold")
    kind, rest, parts = split_spec(spec)
    if kind.lower() != "topk" or not rest or not parts:
        raise ValueError(f"compression {spec!r}: use 'none' or a top-kappa spec; {example}")
    kw: dict = {}
    head = parts[0].text
    try:
        if head.startswith("k="):
            kw["k"] = int(head[2:])
        else:
            kw["ratio"] = float(head)
    except ValueError:
        raise ValueError(f"compression {spec!r}: {head!r} is not a ratio (a number in (0, 1]) "
                         f"nor k=COUNT; {example}") from None
    for part in parts[1:]:
        key, value = (part.key or "").lower(), part.value
        if part.key is None:
            raise ValueError(f"compression {spec!r}: {part.text!r} is not KEY=VALUE; {example}")
        if key == "ef":
            if value not in ("0", "1"):
                raise ValueError(f"compression {spec!r}: ef={value!r}; use ef=0 (no error "
                                 f"feedback) or ef=1; {example}")
            kw["error_feedback"] = value == "1"
        elif key == "method":
            kw["method"] = value.strip()
        elif key == "k":
            raise ValueError(f"compression {spec!r}: give either RATIO or k=COUNT first, "
                             f"{example}")
        else:
            raise ValueError(f"compression {spec!r}: unknown option {key!r} (known: ef, method); "
                             f"{example}")
    if "ratio" in kw and not (math.isfinite(kw["ratio"]) and 0 < kw["ratio"] <= 1):
        raise ValueError(f"compression {spec!r}: the ratio kappa/d must lie in (0, 1]; {example}")
    try:
        return TopK(**kw)
    except ValueError as err:
        raise ValueError(f"compression {spec!r}: {err}; {example}") from None
