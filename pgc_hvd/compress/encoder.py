"""A run's message encoder, built from its settings, and the compressed codecs.

:class:`MessageEncoder` is the encoder both engines build for a worker (the runtime's wiring,
the simulator's workers): the codec its compression and wire dtype pick (:func:`make_codec`)
and the error-feedback memory, over the per-step part it inherits
(:class:`~pgc_hvd.compress.codecs.Encoder`: the message formed from the ring slots and
encoded, on the step's path with the dense codecs); :meth:`MessageEncoder.compress` is the
simulator's form of the top-kappa step (:func:`topk_message`, payloads kept as tensors or
(values, indices) pairs).

The compressed codecs (the rows are in :mod:`pgc_hvd.compress.codecs`' table): top-kappa rows
(:class:`SparseCodec`, :class:`SparseComplexCodec`, with error feedback) and fp16 rows
(:class:`Fp16Codec`, :class:`Fp16SparseCodec`; ``hvd.Compression.fp16``, mapped by
:func:`pgc_hvd.runtime.config.wire_format`): the dense message is rounded to float16 when
encoded, so a payload row is 2d + 4 bytes instead of 4d (half the bytes in the optimistic rows
and the data allgather), and the allreduce of the ranks' weighted contributions runs in float16
too (half the bytes, 2 (n-1)/n * 2d); see :class:`Fp16Codec` for the rounding and what happens
on overflow. Kept apart from the dense codecs since issue 46: a dense fp32 step runs none of
this module.

May import: ``ops``, ``compress.codecs``, ``compress.topk`` (layers 0-2); never an engine, nor
``schemes``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

import pgc_hvd.ops as ops
from pgc_hvd.compress.codecs import (WIRE_DTYPES, Codec, ComplexCodec, DenseCodec, Encoder,
                                     ResidualMemory)
from pgc_hvd.compress.topk import TopK
from pgc_hvd.ops.reference import topk_compress_ref


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

    def select(self, msg):
        """``(values, int32 indices, residual or None)``: the top-kappa of m, or of m + e
        through the error-feedback memory (which then keeps what was not selected)."""
        res = None if self.memory is None else self.memory.residual
        if res is not None:
            values, idx = ops.error_feedback_compress(msg, res, self.kappa, self.topk.method,
                                                      index_dtype=torch.int32)
        else:
            values, idx = ops.topk_compress(msg, self.kappa, self.topk.method,
                                            index_dtype=torch.int32)
        return values, idx, res

    def encode(self, msg, out, *, error_norm=False):
        k = self.kappa
        values, idx, res = self.select(msg)
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


#: the largest finite float16
FP16_MAX = 65504.0


class Fp16Codec(Codec):
    """Real dense messages on an fp16 wire (Horovod's ``hvd.Compression.fp16``).

    Payload row (``width`` = 1 + ceil(d/2) float32 words, 2d + 4 bytes, 2d + 6 for odd d)::

        [ scale (fp32) | fp16(m / scale) for the d entries, two per word, zero-padded ]

    ``scale`` is 1 whenever max|m| <= 65504 (the fp16 range): the payload is then exactly
    Horovod's cast, fp16(m), each entry rounded to nearest with relative error <= 2^-11 (entries
    below 6.1e-5 become fp16 subnormals, absolute error <= 2^-25, and below 3e-8 they flush to
    0). A message beyond the range is sent as fp16(m / 2^e) with scale 2^e the smallest power of
    two that brings max|m| / 2^e below 65504, so encoding never overflows; dividing by a power of
    two is exact, only the small entries lose (more of them fall into the subnormals).
    D(p) = scale * fp32(fp16 entries).

    Decoding (cached and allgathered rows, :meth:`add_weighted`) is in fp32:
    ``out (+)= sum_u a_u scale_u fp32(p_u)``, exact up to fp32 rounding of the sum.

    The sum over ranks of the ranks' contributions moves in fp16 too (``wire_dtype``; the agent,
    :meth:`~pgc_hvd.runtime.agent.CommAgent._allreduce_narrow`): rank r's contribution
    c_r = sum_{u owned} a_u D(p_u) is rounded once to fp16 (<= 2^-11 relative), and either

    * (CPU default) an alltoall of n chunks hands rank j the j-th chunk of every rank, which it
      sums in fp32 and rounds once, and an allgather spreads the summed chunks: the update is
      fp16(sum_r fp16(c_r)), |error| <= 2^-11 (|g| + sum_r |c_r|) entrywise; or
    * (GPU default) Horovod's fp16 ring allreduce, each of the n - 1 partial sums rounded to
      fp16: |error| <= about (n + 1) 2^-11 sum_r |c_r|,

    widened back to fp32; 2 (n-1)/n * 2d bytes either way, against 2^-24 and 4d in fp32. A sum
    beyond 65504 becomes inf (a ring partial sum too: inf absorbs, or inf - inf = nan), so
    overflow anywhere shows in the result: the agent checks the summed fp16 update is finite
    (the same bits on every rank, so every rank decides alike) and, when it is not, repeats that
    step's sum as an fp32 allreduce of the fp32 contributions (``Update.info["fp16_fallback"]``
    is then True, the step's bytes count both). An overflowed sum is never applied.
    """

    def __init__(self, d: int):
        self.d = int(d)
        self.width = 1 + (self.d + 1) // 2
        self.wire_dtype = torch.float16

    def values(self, p: torch.Tensor) -> torch.Tensor:
        """The d fp16 entries of payload row ``p`` (a view)."""
        return p[1:].view(torch.float16)[: self.d]

    @staticmethod
    def scale_for(amax: float) -> float:
        """1 when ``amax`` <= 65504, else the smallest power of two 2^e > amax / 65504."""
        if amax <= FP16_MAX:
            return 1.0
        _, e = math.frexp(amax / FP16_MAX)   # amax / 65504 = f 2^e, 0.5 <= f < 1
        return math.ldexp(1.0, e)

    def encode(self, msg, out, *, error_norm=False):
        if msg.numel() != self.d or out.numel() != self.width:
            raise ValueError(f"Fp16Codec(d={self.d}): got a message of {msg.numel()} entries "
                             f"and a payload row of {out.numel()} words ({self.width} expected)")
        if out.numel() * 2 - 2 > self.d:
            out[-1] = 0.0          # the padding half of the last word
        half = self.values(out)
        half.copy_(msg)            # the cast; entries past the fp16 range become inf
        scale = 1.0
        if not fp16_finite(half):  # rare: find the power-of-two scale (or a NaN/Inf message)
            lo, hi = torch.aminmax(msg)
            amax = max(-float(lo), float(hi))
            if not math.isfinite(amax):
                raise ValueError("Fp16Codec.encode: the message holds NaN/Inf; report it as a "
                                 "non-finite message (CommAgent.report_bad) instead of "
                                 "encoding it")
            scale = self.scale_for(amax)
            half.copy_(msg * (1.0 / scale))
        out[0] = scale
        if not error_norm:
            return math.nan
        return float(torch.linalg.vector_norm(half.float().mul_(scale) - msg,
                                              dtype=torch.float64))

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        return _add_scaled_rows(out, payloads, weights, self.values, accumulate)

    def add_weighted_narrow(self, out16, payloads, weights, scratch=None):
        """``out16 = fp16(sum_u weights[u] D(p_u))``, a rank's contribution to the fp16
        allreduce. One payload (the usual case): one pass, fp16(a scale fp16(m)) rounded once
        from fp32; several: summed in fp32 into ``scratch`` (a d-vector), then rounded."""
        if not payloads:
            return out16.zero_()
        if len(payloads) == 1:
            p = payloads[0].to(out16.device)
            return torch.mul(self.values(p), float(weights[0]) * float(p[0]), out=out16)
        if scratch is None:
            scratch = torch.empty(self.d, dtype=torch.float32, device=out16.device)
        return out16.copy_(self.add_weighted(scratch, payloads, weights))


class Fp16SparseCodec(SparseCodec):
    """Real top-kappa messages with fp16 values (``TopK`` + ``wire_dtype=torch.float16``):
    ``width`` = 1 + ceil(kappa/2) + kappa float32 words, 6 kappa + 4 bytes instead of 8 kappa::

        [ scale (fp32) | fp16(values / scale), two per word | int32 indices ]

    The kappa values are the top-kappa of m (+ e) as :class:`SparseCodec` selects them, then
    rounded to fp16 as :class:`Fp16Codec` rounds (scale 1 within the fp16 range, else the power
    of two that brings them in). With error feedback the rounding error goes into the memory
    too, e[I] = v - D(fp16 v), so residual + D(payload) = m + old residual still holds (to
    fp32 rounding) and the rounding is compensated in later steps like the dropped entries.
    Densified into the allreduce, the contributions are summed in fp16 (``wire_dtype``), with
    the fp32 fallback on overflow described in :class:`Fp16Codec`."""

    def __init__(self, d: int, topk: TopK, memory: Optional[ResidualMemory] = None):
        super().__init__(d, topk, memory)
        self.half_words = (self.kappa + 1) // 2
        self.width = 1 + self.half_words + self.kappa
        self.wire_dtype = torch.float16

    def split(self, p):
        k, h = self.kappa, self.half_words
        return (p[1: 1 + h].view(torch.float16)[:k],
                p[1 + h:].contiguous().view(torch.int32))

    def encode(self, msg, out, *, error_norm=False):
        k, h = self.kappa, self.half_words
        values, idx, res = self.select(msg)
        lo, hi = torch.aminmax(values)
        amax = max(-float(lo), float(hi))
        if not math.isfinite(amax):
            raise ValueError("Fp16SparseCodec.encode: the message holds NaN/Inf; report it as "
                             "a non-finite message (CommAgent.report_bad) instead")
        scale = Fp16Codec.scale_for(amax)
        out[0] = scale
        out[h] = 0.0                    # the padding half when kappa is odd
        half = out[1: 1 + h].view(torch.float16)[:k]
        half.copy_(values if scale == 1.0 else values * (1.0 / scale))
        out[1 + h:].copy_(idx.view(torch.float32))
        sent = half.float().mul_(scale)
        rounding = values - sent
        if res is not None:
            res.index_add_(0, idx.long(), rounding)
            return ops.compression_error_norm(msg, values, res) if error_norm else math.nan
        if not error_norm:
            return math.nan
        dropped = ops.compression_error_norm(msg, values)
        return math.hypot(dropped, float(torch.linalg.vector_norm(rounding,
                                                                  dtype=torch.float64)))

    def add_weighted(self, out, payloads, weights, *, accumulate=False):
        return _add_scaled_rows(out, payloads, weights, self.split, accumulate)


def _add_scaled_rows(out, payloads, weights, view, accumulate):
    """out (+)= sum_u w_u s_u v_u for fp16 rows [s_u | v_u...] (word 0: the row's power-of-two
    scale s_u; ``view`` reads v_u, dense or sparse), in one decode-accumulate pass."""
    if not payloads:
        return out if accumulate else out.zero_()
    rows = [p.to(out.device) for p in payloads]
    ops.decode_accumulate(out, [view(p) for p in rows],
                          [float(w) * float(p[0]) for p, w in zip(rows, weights)],
                          accumulate=accumulate, check_finite=False)
    return out


def fp16_finite(x: torch.Tensor) -> bool:
    """Whether an fp16 tensor holds no inf/NaN: its min and max are finite (one pass, NaN
    propagates; ~1 ms at d = 11.7M here, where ``isfinite().all()`` and an inf-norm take
    60-90 ms)."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def make_codec(d: int, compression: Optional[TopK], *, complex_messages: bool,
               memory: Optional[ResidualMemory] = None,
               wire_dtype: Optional[torch.dtype] = None) -> Codec:
    """The codec for messages of d entries under ``compression`` (None: dense).

    ``compression`` and ``wire_dtype`` are typed values, as the optimizer's configuration
    (:meth:`pgc_hvd.runtime.config.RuntimeConfig.checked`, which maps Horovod's
    ``compression`` keyword) and the simulator give them. ``wire_dtype``: None or
    ``torch.float32`` (default, fp32 payloads and allreduce) or ``torch.float16``
    (``hvd.Compression.fp16``): :class:`Fp16Codec` for dense real messages,
    :class:`Fp16SparseCodec` (fp16 values, int32 indices) with ``TopK``; not for complex
    (Reed-Solomon) messages."""
    if wire_dtype is not None and wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype={wire_dtype!r}: use torch.float32 (default) or "
                         f"torch.float16 (fp16 messages, like hvd.Compression.fp16)")
    if wire_dtype == torch.float16:
        if complex_messages:
            raise ValueError("fp16 messages (wire_dtype=torch.float16, hvd.Compression.fp16) "
                             "apply to real codes only; the Reed-Solomon scheme (rs) sends "
                             "complex messages: use wire_dtype=torch.float32 with it")
        return Fp16Codec(d) if compression is None else Fp16SparseCodec(d, compression, memory)
    if compression is None:
        return ComplexCodec(d) if complex_messages else DenseCodec(d)
    if complex_messages:
        return SparseComplexCodec(d, compression)
    return SparseCodec(d, compression, memory)


def topk_message(dense: torch.Tensor, kappa: int, *, error_feedback: bool = False,
                 residual: Optional[torch.Tensor] = None, method: str = "exact") -> tuple:
    """Top-kappa of one message: ``(values, int32 indices, ||C(u) - u||)``. With
    ``error_feedback`` the kept entries are those of u + e (``residual`` e, updated in place
    to u + e - C(u + e); real fp32 messages only). fp32 messages use the compiled kernels;
    complex (by modulus) and fp64 ones the pure-PyTorch reference. ``method``: the selection of
    the compiled kernels (:data:`pgc_hvd.compress.topk.METHODS`; both select the same
    entries)."""
    if dense.is_complex() or dense.dtype != torch.float32:
        if error_feedback:
            raise ValueError("error feedback is implemented for real fp32 messages only: "
                             "compress complex (RS) or fp64 messages with error_feedback="
                             "False (--compression topk:R,ef=0)")
        vals, idx = topk_compress_ref(dense, kappa)
    elif error_feedback:
        vals, idx = ops.error_feedback_compress(dense, residual, kappa, method,
                                                index_dtype=torch.int32)
    else:
        vals, idx = ops.topk_compress(dense, kappa, method, index_dtype=torch.int32)
    err = ops.compression_error_norm(dense, vals, residual if error_feedback else None)
    return vals, idx.to(torch.int32), err


class MessageEncoder(Encoder):
    """Forms and encodes one worker's coded messages of d entries (module doc).

    ``compression``: None (dense) or :class:`TopK` (typed values, trusted: the optimizer's
    configuration checks them, :meth:`pgc_hvd.runtime.config.RuntimeConfig.checked`); error
    feedback (``TopK(ef=True)``) keeps
    the residual u - C(u) in :attr:`residual` for real messages; ``complex_messages`` for
    Reed-Solomon codes; ``wire_dtype`` float16 for fp16 payloads. ``rows=False`` (the
    simulator): no payload-row codec; :meth:`compress` keeps payloads as tensors or
    (values, indices) pairs, in the message's own dtype (fp64 too), and the residual is made at
    the first real fp32 message."""

    def __init__(self, d: int, compression: Optional[TopK], *, complex_messages: bool,
                 device=None, wire_dtype: Optional[torch.dtype] = None, rows: bool = True):
        self.d = int(d)
        self.compression = compression
        #: entries a compressed message keeps (None: dense messages)
        self.kappa: Optional[int] = None if compression is None else compression.kappa(self.d)
        self.complex = bool(complex_messages)
        memory = (ResidualMemory(d, device) if rows and compression is not None and
                  compression.error_feedback and not complex_messages else None)
        self.codec = (make_codec(d, compression, complex_messages=complex_messages,
                                 memory=memory, wire_dtype=wire_dtype) if rows else None)
        #: the error-feedback residual u - C(u) (None without error feedback)
        self.residual: Optional[torch.Tensor] = None if memory is None else memory.residual

    def compress(self, msg: torch.Tensor) -> tuple:
        """``(payload, ||C(u) - u||)``: the message itself and None when dense, else the
        top-kappa pair ``(values, int32 indices)`` (:func:`topk_message`, through the
        error-feedback residual when the compression keeps one; real fp32 messages only)."""
        if self.kappa is None:
            return msg, None
        ef = self.compression.error_feedback
        if ef and self.residual is None and not msg.is_complex() and msg.dtype == torch.float32:
            self.residual = torch.zeros(self.d)
        vals, idx, err = topk_message(msg, self.kappa, error_feedback=ef, residual=self.residual,
                                      method=self.compression.method)
        return (vals, idx), err


__all__ = ["Fp16Codec", "Fp16SparseCodec", "MessageEncoder", "SparseCodec",
           "SparseComplexCodec", "fp16_finite", "make_codec", "topk_message"]
