"""The coded message of one worker at one step: formed from its ring slots, then encoded.

Owns :class:`MessageEncoder`: the codec of a run's messages (:func:`make_codec`), its
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

May import: ``ops`` and this package's codecs (layers 0-2); never an engine, nor ``schemes``
(the complex weighted sum is the scheme's ``Decision.combine``, called by the engine).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

import pgc_hvd.ops as ops
from pgc_hvd.ops.reference import topk_compress_ref
from pgc_hvd.compress.codecs import DenseCodec, ResidualMemory, make_codec
from pgc_hvd.compress.topk import TopK


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
