"""Codecs and communicators shared by both engines (GRACE's compressor / memory / communicator).

* :class:`TopK`, :func:`parse_compression`: top-kappa settings, one kappa(d) rule, one spelling
  (``topk:RATIO[,ef=0|1][,method=exact|threshold]``);
* :mod:`~pgc_hvd.compress.codecs`: dense, complex and sparse payload rows, error-feedback memory,
  fp16 messages (:class:`Fp16Codec`; ``hvd.Compression.none/fp16`` are mapped to a wire dtype
  by the optimizer's configuration, :func:`pgc_hvd.runtime.config.wire_format`);
  and which collective carries a step's messages, from the bytes (the communicator's choice).
"""

from pgc_hvd.compress.codecs import (Codec, ComplexCodec, DenseCodec, ResidualMemory, WIRE_DTYPES,
                                     allreduce_bytes, alltoall_reduce_bytes, choose_collective,
                                     optimistic_default)
from pgc_hvd.compress.encoder import (Fp16Codec, Fp16SparseCodec, MessageEncoder, SparseCodec,
                                      SparseComplexCodec, make_codec)
from pgc_hvd.compress.topk import TopK, parse_compression

__all__ = ["TopK", "parse_compression", "Codec", "DenseCodec", "ComplexCodec", "SparseCodec",
           "SparseComplexCodec", "Fp16Codec", "Fp16SparseCodec", "ResidualMemory", "make_codec",
           "WIRE_DTYPES", "choose_collective", "optimistic_default", "allreduce_bytes",
           "alltoall_reduce_bytes", "MessageEncoder"]
