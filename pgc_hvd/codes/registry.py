"""Name -> construction table behind :func:`pgc_hvd.codes.get_code`."""

from __future__ import annotations

import inspect

from .base import GradientCode
from .bcgc import BinaryCyclicCode
from .cyclic_mds import CyclicMDSCode
from .cyclic_repetition import CyclicRepetitionCode, GaussianMDSCode
from .fractional_repetition import FractionalRepetitionCode
from .gfrc import GeneralizedFractionalRepetitionCode
from .reed_solomon import ReedSolomonCode
from .uncoded import UncodedCode

CODES = {
    "uncoded": UncodedCode,
    "fr": FractionalRepetitionCode,
    "cr": CyclicRepetitionCode,
    "gfrc": GeneralizedFractionalRepetitionCode,
    "bcgc": BinaryCyclicCode,
    "gmds": GaussianMDSCode,
    "rs": ReedSolomonCode,
    "cyclic-mds": CyclicMDSCode,
}

BINARY_CODES = ("uncoded", "fr", "gfrc", "bcgc")
LINEAR_CODES = ("cr", "gmds", "rs", "cyclic-mds")


def get_code(name: str, n: int, s: int, **options) -> GradientCode:
    """Build the gradient code ``name`` for n workers tolerating s stragglers.

    Names: uncoded, fr, cr, gfrc, bcgc, gmds, rs, cyclic-mds. Options: ``seed``
    (cr, gmds), ``cache_size`` (linear codes). Invalid n, s or options raise
    ValueError naming the constraint and a valid alternative.
    """
    key = str(name).lower().replace("_", "-")
    if key not in CODES:
        raise ValueError(f"unknown code {name!r}; valid names: {', '.join(CODES)}")
    cls = CODES[key]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "n", "s")]
    bad = sorted(set(options) - set(allowed))
    if bad:
        raise ValueError(
            f"code {key!r} does not take option(s) {bad}; valid options: {allowed or 'none'}"
        )
    return cls(n, s, **options)
