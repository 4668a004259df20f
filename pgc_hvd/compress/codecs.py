"""Codecs: how one coded message m (a d-vector, real or complex) becomes a payload row of float32
words, and how weighted payloads become a dense real update. Both engines use them.

GRACE splits compression into compressor / memory / communicator; here

* a **codec** (this module) encodes a message into a payload row and adds weighted payloads into
  a dense d-vector, ``out (+)= Re sum_u a_u D(p_u)``;
* the **memory** is error feedback's residual (:class:`ResidualMemory`), one per worker;
* the **communicator**'s choice (:func:`choose_collective`, at the end of this module) says
  which collective carries the step's messages, from the bytes.

Payload rows (float32 words, one row per message):

==============================  ========  ===========================================
codec                           width     row
==============================  ========  ===========================================
:class:`DenseCodec`             d         m
:class:`ComplexCodec`           2d        (Re m_0, Im m_0, Re m_1, ...) (Reed-Solomon)
``SparseCodec`` (*)             2 kappa   [values | int32 indices bit-cast]
``SparseComplexCodec`` (*)      3 kappa   [Re values | Im values | int32 indices]
``Fp16Codec`` (*)               1+⌈d/2⌉   [scale | fp16(m / scale), 2 per word]
``Fp16SparseCodec`` (*)         1+⌈κ/2⌉+κ [scale | fp16(values / scale) | int32 indices]
==============================  ========  ===========================================

(*) the compressed codecs (top-kappa, fp16 wire), with the factory
:func:`~pgc_hvd.compress.encoder.make_codec` and
:class:`~pgc_hvd.compress.encoder.MessageEncoder`, are :mod:`pgc_hvd.compress.encoder`'s (off a
dense step's path; issue 46).

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
  fp16 messages (:class:`~pgc_hvd.compress.encoder.Fp16Codec`: the sum moves in fp16, as a ring
  allreduce or as an alltoall + allgather of chunks, :func:`alltoall_reduce_bytes`).
* ``"allgather"``: the owners allgather the used payload rows: 4 w U bytes, less the rank's own.
  Chosen for sparse top-kappa rows when that is fewer bytes than the allreduce
  (2 kappa U < 2 (n-1)/n d words), else they are densified into the allreduce.
* ``"cached"``: every used payload already reached every rank with the control rows (optimistic
  one-collective steps, for small messages, see :func:`optimistic_default`): no collective;
  every ready rank's payload then reaches every rank, n payloads of 4 w bytes.

The choice depends only on the decision, the codec and n, which every rank has identically, so
every rank picks the same collective.

The per-step part of the message encoder (:class:`Encoder`, the base of
:class:`~pgc_hvd.compress.encoder.MessageEncoder`): the coded message of one worker at one step,
formed from its ring slots, then encoded:

* :func:`coded_sum` (:meth:`Encoder.form`): m_j = sum_l b_{j,l} g_l from the ring slots
  g_l with the plan's coefficients b_{j,l} (:func:`pgc_hvd.ops.coded_accumulate`, one pass over
  d, for fp32); for complex codes (Reed-Solomon) the sum is complex, m_j in C^d. Written here
  once: the runtime and the simulator (``sim/workers.py``) call it through the encoder;
* :meth:`Encoder.encode`: the payload row C(m_j) and, when the decoder needs it, ||C(u) - u||;
* decoding kept payloads (the simulator's decoder): :func:`dense_payload` (a (values, indices)
  pair as the d-vector it stands for, complex for Reed-Solomon, whose weighted sum the
  scheme's :meth:`~pgc_hvd.schemes.Decision.combine` then takes) and :func:`decode_real`
  (real weights: :func:`pgc_hvd.ops.decode_accumulate`, the runtime's kernel, for fp32).

Owns the codec interface, the dense codecs, the residual memory, the choice of collective and
the encoder's per-step part.
May import: ``ops`` (layers 0-2); never an engine, nor ``schemes``
(the complex weighted sum is the scheme's ``Decision.combine``, called by the engine).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch

import pgc_hvd.ops as ops


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


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one read of x and no allocation: any NaN or
    Inf entry makes the sum NaN or Inf; a finite sum proves them all finite. Only a sum that
    overflowed (or a real NaN/Inf) is checked entry by entry."""
    total = float(x.sum()) if not x.is_complex() else complex(x.sum())
    if (math.isfinite(total) if isinstance(total, float)
            else math.isfinite(total.real) and math.isfinite(total.imag)):
        return True
    return bool(torch.isfinite(x).all())


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


#: the wire dtypes a codec exists for (the dtype of the payload values and of the allreduce)
WIRE_DTYPES = (torch.float32, torch.float16)


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


class Encoder:
    """The per-step part of a worker's message encoder (the base class of
    :class:`~pgc_hvd.compress.encoder.MessageEncoder`, which builds it from a run's settings;
    not built alone): the message formed from the ring slots (:func:`coded_sum`) and encoded by
    :attr:`codec`; the error-feedback :attr:`residual`."""

    codec: Optional[Codec]
    complex: bool
    residual: Optional[torch.Tensor]

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
