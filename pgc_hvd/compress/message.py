"""The coded message of one worker at one step: formed from its ring slots, then encoded.

Owns :class:`MessageEncoder`: the codec of a run's messages (:func:`make_codec`), its
error-feedback memory, and the two things done to a message, in order:

* :func:`coded_sum` (:meth:`MessageEncoder.form`): m_j = sum_l b_{j,l} g_l from the ring slots
  g_l with the plan's coefficients b_{j,l} (:func:`pgc_hvd.ops.coded_accumulate`, one pass over
  d, for fp32); for complex codes (Reed-Solomon) the sum is complex, m_j in C^d. Written here
  once: the runtime (through the encoder) and the simulator (``sim/engine.py``) call it;
* :meth:`MessageEncoder.encode`: the payload row C(m_j) (dense, top-kappa with error feedback,
  fp16) and, when the decoder needs it, ||C(u) - u||; :func:`topk_message` is the simulator's
  form of the same top-kappa step, (values, int32 indices) instead of a packed row.

May import: ``ops`` and this package's codecs (layers 0-2); never an engine.
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
                 residual: Optional[torch.Tensor] = None) -> tuple:
    """Top-kappa of one message: ``(values, int32 indices, ||C(u) - u||)``. With
    ``error_feedback`` the kept entries are those of u + e (``residual`` e, updated in place
    to u + e - C(u + e); real fp32 messages only). fp32 messages use the compiled kernels;
    complex (by modulus) and fp64 ones the pure-PyTorch reference."""
    if dense.is_complex() or dense.dtype != torch.float32:
        if error_feedback:
            raise ValueError("error feedback is implemented for real fp32 messages only: "
                             "compress complex (RS) or fp64 messages with error_feedback="
                             "False (--compression topk:R,ef=0)")
        vals, idx = topk_compress_ref(dense, kappa)
    elif error_feedback:
        vals, idx = ops.error_feedback_compress(dense, residual, kappa, index_dtype=torch.int32)
    else:
        vals, idx = ops.topk_compress(dense, kappa, index_dtype=torch.int32)
    err = ops.compression_error_norm(dense, vals, residual if error_feedback else None)
    return vals, idx.to(torch.int32), err


class MessageEncoder:
    """Forms and encodes one worker's coded messages of d entries (module doc).

    ``compression``: None (dense) or :class:`TopK`; error feedback (``TopK(ef=True)``) keeps
    the residual u - C(u) in :attr:`residual` for real messages; ``complex_messages`` for
    Reed-Solomon codes; ``wire_dtype`` float16 for fp16 payloads."""

    def __init__(self, d: int, compression: Optional[TopK], *, complex_messages: bool,
                 device=None, wire_dtype: Optional[torch.dtype] = None):
        memory = (ResidualMemory(d, device) if isinstance(compression, TopK) and
                  compression.error_feedback and not complex_messages else None)
        self.codec = make_codec(d, compression, complex_messages=complex_messages,
                                memory=memory, wire_dtype=wire_dtype)
        self.complex = bool(complex_messages)
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

    def reset(self) -> None:
        """Forget the error-feedback residual (a run restarted from another version)."""
        if self.residual is not None:
            self.residual.zero_()
