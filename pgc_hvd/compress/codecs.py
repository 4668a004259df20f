"""Codecs: how one coded message m (a d-vector, real or complex) becomes a payload row of float32
words, and how weighted payloads become a dense real update. Both engines use them.

GRACE splits compression into compressor / memory / communicator; here

* a **codec** (this module) encodes a message into a payload row and adds weighted payloads into
  a dense d-vector, ``out (+)= Re sum_u a_u D(p_u)``;
* the **memory** is error feedback's residual (:class:`ResidualMemory`), one per worker;
* the **communicator**'s choice (:func:`choose_collective`, at the end of this module) says
  which collective carries the step's messages, from the bytes.

Payload rows (float32 words, one row per message):

============================  ========  ===========================================
codec                         width     row
============================  ========  ===========================================
:class:`DenseCodec`           d         m
:class:`ComplexCodec`         2d        (Re m_0, Im m_0, Re m_1, ...) (Reed-Solomon)
:class:`SparseCodec`          2 kappa   [values | int32 indices bit-cast]
:class:`SparseComplexCodec`   3 kappa   [Re values | Im values | int32 indices]
:class:`Fp16Codec`            1+⌈d/2⌉   [scale | fp16(m / scale), 2 per word]
:class:`Fp16SparseCodec`      1+⌈κ/2⌉+κ [scale | fp16(values / scale) | int32 indices]
============================  ========  ===========================================

fp16 wire (:class:`Fp16Codec`, ``make_codec(..., wire_dtype=torch.float16)``, Horovod's
``hvd.Compression.fp16``, mapped by :func:`pgc_hvd.runtime.config.wire_format`): the dense message is
rounded to float16 when encoded, so a payload row is 2d + 4 bytes instead of 4d (half the bytes
in the optimistic rows and the data allgather), and the allreduce of the ranks' weighted
contributions runs in float16 too (half the bytes, 2 (n-1)/n * 2d). See :class:`Fp16Codec` for
the rounding and what happens on overflow.

Every decoded update is linear in the messages, g_hat = Re sum_u a_u D(p_u) (a_u: the decision's
weights, complex for RS), so :meth:`Codec.add_weighted` serves both the decoder (all uses) and a
rank's own contribution to the allreduce (its own uses only): the sum over ranks of the
contributions is the decoded update.

The communicator: which collective carries a step's messages, chosen from the bytes.

Every decoded update is linear in the messages, g_hat = Re sum_{u in uses} a_u D(p_u), and every
use (worker, step) is owned by one rank, its sender. Three ways to move them, with the bytes a
rank receives per step (n ranks, d entries, payload rows of w float32 words, U uses):

* ``"allreduce"``: each rank adds its own uses, sum_{u owned} a_u D(p_u) (zeros when it owns
  none), into a dense fp32 d-vector and ONE ring allreduce (sum) hands every rank the same
  update: 2 (n-1)/n * 4d bytes, whatever n and U are (Horovod's own cost); 2 (n-1)/n * 2d with
  fp16 messages (:class:`~pgc_hvd.compress.codecs.Fp16Codec`: the sum moves in fp16, as a ring
  allreduce or as an alltoall + allgather of chunks, :func:`alltoall_reduce_bytes`).
* ``"allgather"``: the owners allgather the used payload rows: 4 w U bytes, less the rank's own.
  Chosen for sparse top-kappa rows when that is fewer bytes than the allreduce
  (2 kappa U < 2 (n-1)/n d words), else they are densified into the allreduce.
* ``"cached"``: every used payload already reached every rank with the control rows (optimistic
  one-collective steps, for small messages, see :func:`optimistic_default`): no collective;
  every ready rank's payload then reaches every rank, n payloads of 4 w bytes.

The choice depends only on the decision, the codec and n, which every rank has identically, so
every rank picks the same collective.

The message encoder (:class:`MessageEncoder`, at the end of this module): the coded message of
one worker at one step, formed from its ring slots, then encoded. It owns the codec of a run's messages (:func:`make_codec`), its
error-feedback memory, and the two things done to a message, in order:

* :func:`coded_sum` (:meth:`MessageEncoder.form`): m_j = sum_l b_{j,l} g_l from the ring slots
  g_l with the plan's coefficients b_{j,l} (:func:`pgc_hvd.ops.coded_accumulate`, one pass over
  d, for fp32); for complex codes (Reed-Solomon) the sum is complex, m_j in C^d. Written here
  once: the runtime and the simulator (``sim/workers.py``) call it through the encoder;
* :meth:`MessageEncoder.encode`: the payload row C(m_j) (dense, top-kappa with error feedback,
  fp16) and, when the decoder needs it, ||C(u) - u||; :meth:`MessageEncoder.compress`
  (:func:`topk_message`) is the simulator's form of the same top-kappa step, the payload kept
  as a tensor or a (values, int32 indices) pair instead of a packed row (``rows=False``);
* decoding kept payloads (the simulator's decoder): :func:`dense_payload` (a (values, indices)
  pair as the d-vector it stands for, complex for Reed-Solomon, whose weighted sum the
  scheme's :meth:`~pgc_hvd.schemes.Decision.combine` then takes) and :func:`decode_real`
  (real weights: :func:`pgc_hvd.ops.decode_accumulate`, the runtime's kernel, for fp32).

Owns the codecs, the residual memory, the choice of collective and the message encoder.
May import: ``ops`` and ``compress.topk`` (layers 0-2); never an engine, nor ``schemes``
(the complex weighted sum is the scheme's ``Decision.combine``, called by the engine).
"""

from __future__ import annotations

import math
import os
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
    #: dtype of the allreduce of the ranks' weighted contributions (the agent's data phase)
    wire_dtype: torch.dtype = torch.float32

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

    def add_weighted_narrow(self, out16: torch.Tensor, payloads: Sequence[torch.Tensor],
                            weights: Sequence, scratch: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
        """``out16 = narrow(Re sum_u weights[u] D(p_u))``: a rank's contribution to an allreduce
        in ``wire_dtype``, summed in fp32 (into ``scratch``, a d-vector, when given), then
        rounded once."""
        if scratch is None:
            scratch = torch.empty(self.d, dtype=torch.float32, device=out16.device)
        return out16.copy_(self.add_weighted(scratch, payloads, weights))

    @property
    def wire_itemsize(self) -> int:
        """Bytes per entry of the allreduce of contributions (4 for fp32, 2 for fp16)."""
        return torch.finfo(self.wire_dtype).bits // 8


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


#: the wire dtypes a codec exists for (the dtype of the payload values and of the allreduce)
WIRE_DTYPES = (torch.float32, torch.float16)


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


# --- which collective carries a step's messages, from the bytes (the communicator's choice)

#: payloads ride with the control rows (one collective per step) by default while the n payloads
#: a rank then receives, n * 4 w bytes, are at most this many; above it the step is decided on
#: control rows alone and the data move in the allreduce / allgather. Measured crossover
#: (``benchmarks/runtime/runtime_bench.py --crossover``, docs/benchmarks.md): at np = 4 the one
#: collective is 1.09-1.15x faster up to 1 MB payloads and 0.80x at 4 MB; at np = 2 the two are
#: within 5% from 256 KB to 4 MB. ``PGC_HVD_OPTIMISTIC_BYTES`` overrides.
OPTIMISTIC_BYTES = 4 * 1024 * 1024


def optimistic_threshold() -> int:
    """The byte threshold of optimistic rounds (``PGC_HVD_OPTIMISTIC_BYTES`` or the default)."""
    raw = os.environ.get("PGC_HVD_OPTIMISTIC_BYTES")
    if raw is None or raw.strip() == "":
        return OPTIMISTIC_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes (>= 0), "
                         f"e.g. 4194304") from None
    if value < 0:
        raise ValueError(f"PGC_HVD_OPTIMISTIC_BYTES={raw!r}: give a number of bytes >= 0")
    return value


def optimistic_default(payload_bytes: int, on_cpu: bool, n: int = 1) -> bool:
    """Whether payloads ride with control rows by default: CPU payloads whose n copies a rank
    receives, n * ``payload_bytes``, are at most :func:`optimistic_threshold` bytes (latency
    dominates there; above it, n payloads cost more than the allreduce's two)."""
    return bool(on_cpu) and int(n) * int(payload_bytes) <= optimistic_threshold()


def allreduce_bytes(n: int, d: int, itemsize: int = 4) -> float:
    """Bytes a rank receives in a ring allreduce of d entries of ``itemsize`` bytes (4: fp32,
    2: fp16): 2 (n-1)/n * itemsize * d."""
    return 2.0 * (n - 1) / n * float(itemsize) * d if n > 1 else 0.0


def alltoall_reduce_bytes(n: int, d: int, itemsize: int = 2) -> float:
    """Bytes a rank receives when a sum of d entries moves as an alltoall of n equal chunks of
    m = ceil(d/n) entries (each rank sums one chunk) and an allgather of the summed chunks:
    2 (n-1) m * itemsize, the ring allreduce's 2 (n-1)/n * itemsize * d up to the padding."""
    return 2.0 * (n - 1) * -(-int(d) // int(n)) * float(itemsize) if n > 1 else 0.0


def choose_collective(*, sparse: bool, n: int, d: int, width: int, needed: int,
                      itemsize: int = 4) -> str:
    """``"cached"`` when no used payload is missing (``needed`` = 0), ``"allreduce"`` for dense
    rows, and for sparse rows whichever of ``"allgather"`` (4 w needed bytes) and
    ``"allreduce"`` (of entries of ``itemsize`` bytes) moves fewer bytes (ties to the
    allgather, which is exact in the rows)."""
    if needed <= 0:
        return "cached"
    if not sparse:
        return "allreduce"
    return ("allgather" if 4.0 * width * needed <= allreduce_bytes(n, d, itemsize)
            else "allreduce")


# ---- the message encoder: a worker's coded message formed from its ring, then encoded ------


def coded_sum(slots: Sequence[torch.Tensor], coefs: Sequence, *, complex_code: bool,
              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """m = sum_l b_l g_l over ``slots`` g_l with coefficients ``coefs`` b_l.

    Complex codes: sum_l b_l g_l in C^d (complex64, complex128 for fp64 slots; Python's
    ``sum`` in slot order). Real fp32 slots: :func:`pgc_hvd.ops.coded_accumulate` into ``out``
    (a new d-vector when None). Other real dtypes (fp64): the sum in slot order."""
    if complex_code:
        return sum(complex(c) * g.to(torch.complex128 if g.dtype == torch.float64
                                     else torch.complex64) for c, g in zip(coefs, slots))
    if slots[0].dtype == torch.float32:
        if out is None:
            out = torch.empty(slots[0].numel())
        return ops.coded_accumulate(out, list(slots), [float(c) for c in coefs])
    return sum(float(c) * g for c, g in zip(coefs, slots))


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


class MessageEncoder:
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

    @property
    def dense_rows(self) -> bool:
        """Whether the payload row is the message itself (dense fp32): then a message can be
        formed straight into the row that is sent (no copy)."""
        return isinstance(self.codec, DenseCodec)

    def form(self, slots: Sequence[torch.Tensor], coefs: Sequence, out: Optional[torch.Tensor]
             = None) -> torch.Tensor:
        """m = sum_l b_l g_l over the ring slots ``slots`` with coefficients ``coefs``: complex
        (a new complex64 d-vector) for complex codes, else written into ``out`` (fp32)."""
        return coded_sum(slots, coefs, complex_code=self.complex, out=out)

    def encode(self, msg: torch.Tensor, out: torch.Tensor, *, error_norm: bool = False) -> float:
        """Write the payload row of ``msg`` into ``out`` (no copy when ``out`` already is the
        dense message). Returns ||C(u) - u|| when ``error_norm`` (nan otherwise: it costs a pass
        over d)."""
        return self.codec.encode(msg, out, error_norm=error_norm)

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

    def reset(self) -> None:
        """Forget the error-feedback residual (a run restarted from another version)."""
        if self.residual is not None:
            self.residual.zero_()


def dense_payload(payload, d: int) -> torch.Tensor:
    """A kept payload as the d-vector it stands for: a tensor as it is; a top-kappa pair
    ``(values, indices)`` scattered into zeros of the values' dtype (complex for RS)."""
    if not isinstance(payload, tuple):
        return payload
    values, idx = payload
    dense = torch.zeros(int(d), dtype=values.dtype)
    dense[idx.long()] = values
    return dense


def decode_real(payloads: Sequence, weights: Sequence, d: int, dtype: torch.dtype
                ) -> torch.Tensor:
    """sum_u a_u D(p_u) for real weights ``weights`` over kept payloads (tensors or
    (values, indices) pairs), a new d-vector of ``dtype``: :func:`pgc_hvd.ops.decode_accumulate`
    for fp32 (the runtime's kernel); for other dtypes (fp64) the same sum in payload order."""
    if dtype == torch.float32:
        out = torch.zeros(int(d), dtype=torch.float32)
        return ops.decode_accumulate(out, list(payloads), [float(x) for x in weights],
                                     accumulate=False)
    acc = torch.zeros(int(d), dtype=dtype)
    for m, wgt in zip(payloads, weights):
        if isinstance(m, tuple):
            acc.index_add_(0, m[1].long(), m[0] * float(wgt))
        else:
            acc.add_(m, alpha=float(wgt))
    return acc
