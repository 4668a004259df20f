"""Codecs and communicators shared by both engines (GRACE's compressor / memory / communicator).

* :class:`TopK`, :func:`parse_compression`: top-kappa settings, one kappa(d) rule, one spelling
  (``topk:RATIO[,ef=0|1][,method=exact|threshold]``);
* :mod:`~pgc_hvd.compress.codecs`: dense, complex and sparse payload rows, error-feedback memory;
* :mod:`~pgc_hvd.compress.transport`: which collective carries a step's messages, from the bytes.
"""

from pgc_hvd.compress.codecs import (Codec, ComplexCodec, DenseCodec, ResidualMemory, SparseCodec,
                                     SparseComplexCodec, make_codec)
from pgc_hvd.compress.topk import TopK, parse_compression
from pgc_hvd.compress.transport import allreduce_bytes, choose_collective, optimistic_default

__all__ = ["TopK", "parse_compression", "Codec", "DenseCodec", "ComplexCodec", "SparseCodec",
           "SparseComplexCodec", "ResidualMemory", "make_codec", "choose_collective",
           "optimistic_default", "allreduce_bytes"]
