"""Gradient codes: placements, encoding matrices B and decoders (pure numpy).

    >>> from pgc_hvd.codes import get_code
    >>> code = get_code("bcgc", 6, 2)
    >>> a = code.decode([0, 3, 1, 4])      # responders in arrival order
    >>> bool(((a @ code.B) == 1).all())
    True

Every code has ``.B`` (n x n), ``.supports`` (partitions per worker),
``.classes`` (binary class codes, else None) and ``.decode(responders)``
which returns a with a @ B ~= 1 or raises :class:`NotDecodable`.
See ``docs/codes.md`` for the constructions and measured decode norms.
"""

from .base import DEFAULT_DECODE_TOL, DecodeResult, GradientCode
from .bcgc import BinaryCyclicCode, bcgc_loads
from .binary import BinaryClassCode
from .class_decoder import FirstCompleteDecoder, complete_classes, min_error_class
from .cyclic_mds import CyclicMDSCode
from .cyclic_repetition import CyclicRepetitionCode, GaussianMDSCode
from .errors import NotDecodable
from .fractional_repetition import FractionalRepetitionCode
from .gfrc import GeneralizedFractionalRepetitionCode
from .linear import LinearCode
from .linear_decoder import LinearSolveDecoder
from .reed_solomon import ReedSolomonCode
from .registry import BINARY_CODES, CODES, LINEAR_CODES, get_code
from .uncoded import UncodedCode

__all__ = [
    "get_code", "NotDecodable", "CODES", "BINARY_CODES", "LINEAR_CODES",
    "GradientCode", "BinaryClassCode", "LinearCode", "DecodeResult", "DEFAULT_DECODE_TOL",
    "FirstCompleteDecoder", "LinearSolveDecoder", "complete_classes", "min_error_class",
    "UncodedCode", "FractionalRepetitionCode", "GeneralizedFractionalRepetitionCode",
    "BinaryCyclicCode", "bcgc_loads", "CyclicRepetitionCode", "GaussianMDSCode",
    "ReedSolomonCode", "CyclicMDSCode",
]
