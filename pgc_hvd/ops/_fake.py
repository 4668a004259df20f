"""Fake (meta) kernels of the ops in ``torch.ops.pgc_hvd``: the shapes, dtypes and devices of
their outputs without computing them, which FakeTensor and torch.compile trace with.

Imported once by :func:`pgc_hvd.ops._ext.library`, after ``pgc_hvd._C`` has defined the ops
(schemas in ``csrc/library.cpp``). The ops that write into ``out`` return nothing; top-k and
error feedback return ``(values, indices)`` of length k (values in x's dtype, or float32 for
error feedback; indices int64 or int32). The checks that need no data (k in [0, d], flat
buffers) are also made here, so a traced program fails at trace time with the kernels' message;
the rest (dtypes, aliasing, Inf/NaN) is the kernels' at run time.
"""

from __future__ import annotations

import torch

# the ops must be defined (importing pgc_hvd._C registers them) before their fake kernels are;
# pgc_hvd.ops._ext.library() imports this module after loading _C with its error message
from pgc_hvd import _C  # noqa: F401,E402


def _index_dtype(index64: bool) -> torch.dtype:
    return torch.int64 if index64 else torch.int32


def _check_flat_k(x: torch.Tensor, k: int) -> None:
    torch._check(x.dim() == 1, lambda: f"x must be a flat 1-D buffer, got shape {tuple(x.shape)}")
    torch._check(0 <= k, lambda: f"k must lie in [0, d], got {k}")
    torch._check(k <= x.numel(), lambda: f"k must lie in [0, d] = [0, {x.numel()}], got {k}")


@torch.library.register_fake("pgc_hvd::coded_accumulate")
def _coded_accumulate(out, slots, coeffs, accumulate=False):
    torch._check(len(slots) == len(coeffs),
                 lambda: f"got {len(slots)} slots but {len(coeffs)} coefficients")
    return None


@torch.library.register_fake("pgc_hvd::topk_compress")
def _topk_compress(x, k, method="exact", index64=True, walk="device", compact=True):
    _check_flat_k(x, k)
    return x.new_empty(k), x.new_empty(k, dtype=_index_dtype(index64))


@torch.library.register_fake("pgc_hvd::error_feedback_compress")
def _error_feedback_compress(x, residual, k, method="exact", index64=True, walk="device",
                             compact=True):
    _check_flat_k(x, k)
    return residual.new_empty(k), residual.new_empty(k, dtype=_index_dtype(index64))


@torch.library.register_fake("pgc_hvd::decode_accumulate")
def _decode_accumulate(out, dense, dense_weights, sparse_values, sparse_indices, sparse_weights,
                       accumulate=True, check_finite=True):
    torch._check(len(dense) == len(dense_weights) and len(sparse_values) == len(sparse_indices)
                 == len(sparse_weights), lambda: "pass one weight per message")
    return None
