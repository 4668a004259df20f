"""Codecs: how one coded message m (a d-vector, real or complex) becomes a payload row of float32
words, and how weighted payloads become a dense real update. Both engines use them.

GRACE splits compression into compressor / memory / communicator; here

* a **codec** (this module) encodes a message into a payload row and adds weighted payloads into
  a dense d-vector, ``out (+)= Re sum_u a_u D(p_u)``;
* the **memory** is error feedback's residual (:class:`ResidualMemory`), one per worker;
* the **communicator** (:mod:`pgc_hvd.compress.transport`) says which collective carries the
  step's messages, from the bytes.

Payload rows (float32 words, one row per message):

============================  ========  ===========================================
codec                         width     row
============================  ========  ===========================================
:class:`DenseCodec`           d         m
:class:`ComplexCodec`         2d        (Re m_0, Im m_0, Re m_1, ...) (Reed-Solomon)
:class:`SparseCodec`          2 kappa   [values | int32 indices bit-cast]
:class:`SparseComplexCodec`   3 kappa   [Re values | Im values | int32 indices]
============================  ========  ===========================================

Every decoded update is linear in the messages, g_hat = Re sum_u a_u D(p_u) (a_u: the decision's
weights, complex for RS), so :meth:`Codec.add_weighted` serves both the decoder (all uses) and a
rank's own contribution to the allreduce (its own uses only): the sum over ranks of the
contributions is the decoded update.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

import pgc_hvd.ops as ops
from pgc_hvd.compress.topk import TopK
from pgc_hvd.ops.reference import topk_compress_ref


class ResidualMemory:
    """Error feedback's memory e (fp32, d entries, the part of past messages not yet sent):
    a = m + e, (v, I) = C_kappa(a), e <- a - D(v, I)."""

    def __init__(self, d: int, device=None):
        self.residual = torch.zeros(int(d), dtype=torch.float32, device=device)


class Codec:
    """Encodes messages of d entries into payload rows of :attr:`width` float32 words."""

    d: int
    width: int
    sparse: bool = False
    complex: bool = False

    def encode(self, msg: torch.Tensor, out: torch.Tensor, *, error_norm: bool = False) -> float:
        """Write the payload row of ``msg`` into ``out`` (``width`` words). Returns the
        compression error ||C(u) - u|| when ``error_norm`` (the minimum-error class decoder's
        input; costs a pass over d), nan otherwise."""
        raise NotImplementedError

    def add_weighted(self, out: torch.Tensor, payloads: Sequence[torch.Tensor],
                     weights: Sequence, *, accumulate: bool = False) -> torch.Tensor:
        """``out (+)= Re sum_u weights[u] * D(payloads[u])`` into the dense fp32 d-vector
        ``out`` (overwritten unless ``accumulate``). Payloads were checked finite when sent."""
        raise NotImplementedError

    @property
    def payload_bytes(self) -> int:
        return 4 * self.width


class DenseCodec(Codec):
    """Real dense messages: the payload is the message itself."""

    def __init__(self, d: int):
        self.d = self.width = int(d)

    def encode(self, msg, out, *, error_norm=False):
        if out.data_ptr() != msg.data_ptr():
            out.copy_(msg)
        return math.nan

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        if not payloads:
            return out if accumulate else out.zero_()
        ops.decode_accumulate(out, [p.to(out.device) for p in payloads],
                              [float(w) for w in weights], accumulate=accumulate,
                              check_finite=False)
        return out


class ComplexCodec(Codec):
    """Complex dense messages (Reed-Solomon): 2d words; Re(a m) = Re a Re m - Im a Im m."""

    complex = True

    def __init__(self, d: int):
        self.d, self.width = int(d), 2 * int(d)

    def encode(self, msg, out, *, error_norm=False):
        out.copy_(torch.view_as_real(msg.to(torch.complex64)).reshape(-1))
        return math.nan

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        if not accumulate:
            out.zero_()
        for p, w in zip(payloads, weights):
            w = complex(w)
            pr = p.view(self.d, 2)
            out.add_(pr[:, 0], alpha=w.real)
            if w.imag != 0.0:
                out.add_(pr[:, 1], alpha=-w.imag)
        return out


class SparseCodec(Codec):
    """Real top-kappa messages: [values | int32 indices], with optional error feedback."""

    sparse = True

    def __init__(self, d: int, topk: TopK, memory: Optional[ResidualMemory] = None):
        self.d, self.topk = int(d), topk
        self.kappa = topk.kappa(self.d)
        self.width = 2 * self.kappa
        self.memory = memory

    def split(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.kappa
        return p[:k], p[k:].contiguous().view(torch.int32)

    def encode(self, msg, out, *, error_norm=False):
        k = self.kappa
        res = None if self.memory is None else self.memory.residual
        if res is not None:
            values, idx = ops.error_feedback_compress(msg, res, k, self.topk.method,
                                                      index_dtype=torch.int32)
        else:
            values, idx = ops.topk_compress(msg, k, self.topk.method, index_dtype=torch.int32)
        out[:k].copy_(values)
        out[k:].copy_(idx.view(torch.float32))
        return ops.compression_error_norm(msg, values, res) if error_norm else math.nan

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        if not payloads:
            return out if accumulate else out.zero_()
        ops.decode_accumulate(out, [self.split(p.to(out.device)) for p in payloads],
                              [float(w) for w in weights], accumulate=accumulate,
                              check_finite=False)
        return out


class SparseComplexCodec(Codec):
    """Complex top-kappa messages (Reed-Solomon under compression): the kappa entries of largest
    modulus, [Re values | Im values | int32 indices]; D(v, I) is complex and the update keeps
    Re(a v) = Re a Re v - Im a Im v at I. No error feedback (as in the simulator)."""

    sparse = True
    complex = True

    def __init__(self, d: int, topk: TopK):
        if topk.error_feedback:
            raise ValueError("top-kappa of complex (Reed-Solomon) messages has no error feedback: "
                             "use TopK(..., error_feedback=False) (--compression topk:R,ef=0)")
        self.d, self.topk = int(d), topk
        self.kappa = topk.kappa(self.d)
        self.width = 3 * self.kappa

    def encode(self, msg, out, *, error_norm=False):
        k = self.kappa
        values, idx = topk_compress_ref(msg, k, index_dtype=torch.int32)
        values = values.to(torch.complex64)
        out[:k].copy_(values.real)
        out[k:2 * k].copy_(values.imag)
        out[2 * k:].copy_(idx.view(torch.float32))
        return ops.compression_error_norm(msg, values) if error_norm else math.nan

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        k = self.kappa
        pairs, ones = [], []
        for p, w in zip(payloads, weights):
            w = complex(w)
            p = p.to(out.device)
            real = p[:k] * w.real - p[k:2 * k] * w.imag
            pairs.append((real, p[2 * k:].contiguous().view(torch.int32)))
            ones.append(1.0)
        if not pairs:
            return out if accumulate else out.zero_()
        ops.decode_accumulate(out, pairs, ones, accumulate=accumulate, check_finite=False)
        return out


def make_codec(d: int, compression: Optional[TopK], *, complex_messages: bool,
               memory: Optional[ResidualMemory] = None) -> Codec:
    """The codec for messages of d entries under ``compression`` (None: dense)."""
    if compression is None:
        return ComplexCodec(d) if complex_messages else DenseCodec(d)
    if not isinstance(compression, TopK):
        raise TypeError(f"compression must be None or pgc_hvd.compress.TopK(...), got "
                        f"{compression!r}")
    if complex_messages:
        return SparseComplexCodec(d, compression)
    return SparseCodec(d, compression, memory)
