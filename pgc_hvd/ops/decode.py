"""Decode-accumulate: apply the weighted coded messages of one step to one buffer.

The decoder of a gradient code picks weights a_I for the messages m_I that arrived (a_I B_I = 1
for exact codes; for BCGC one class of workers with weights 1) and forms

    out (+)= sum_I a_I m_I,

where a dense message is a d-vector and a sparse one is a top-kappa message (values, indices)
standing for D(values, indices): entry indices[j] gets values[j]. Sparse messages are applied by
scatter-add, so an index present in several messages (or repeated within one) receives the sum
of all its weighted values. Accumulation is in fp32.
"""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch

from pgc_hvd.ops import _ext


Message = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def decode_accumulate(
    out: torch.Tensor,
    messages: Sequence[Message],
    weights: Sequence[float],
    *,
    accumulate: bool = True,
    check_finite: bool = True,
) -> torch.Tensor:
    """``out += sum_I weights[I] * messages[I]`` in place (``out =`` when not ``accumulate``).

    Args:
        out: flat contiguous float32 buffer of d elements.
        messages: each a dense flat buffer of d elements (fp32/fp16/bf16) or a pair
            ``(values, indices)`` of equal length (values fp32/fp16/bf16, indices int64/int32 in
            [0, d), any order, repeats allowed), all on out's device.
        weights: one finite float per message (the decoder's a_I).
        accumulate: add into ``out``; when False, ``out`` is overwritten.
        check_finite: when True (default) Inf/NaN in any message raise ValueError before
            ``out`` is written; when False they propagate into ``out`` (IEEE arithmetic) and the
            dense messages are not read an extra time.

    Dense messages are summed first (one coded-accumulation pass), then the sparse ones in the
    order given, so results match a sequential fp32 sum up to rounding order. Every check
    (shapes, dtypes, devices, index range, finite weights and values) precedes any write.
    Returns ``out``.
    """
    if len(messages) != len(weights):
        raise ValueError(f"got {len(messages)} messages but {len(weights)} weights")
    dense, dense_w, sv, si, sw = [], [], [], [], []
    for i, (m, w) in enumerate(zip(messages, weights)):
        w = float(w)
        if isinstance(m, torch.Tensor):
            dense.append(m)
            dense_w.append(w)
        elif isinstance(m, (tuple, list)) and len(m) == 2:
            sv.append(m[0])
            si.append(m[1])
            sw.append(w)
        else:
            raise TypeError(
                f"message {i} must be a tensor (dense) or a (values, indices) pair, got "
                f"{type(m).__name__}"
            )
    ops = _ext.LIBRARY or _ext.library()   # bound once: no module entered per call
    ops.decode_accumulate(out, dense, dense_w, sv, si, sw, bool(accumulate),
                          bool(check_finite))
    return out
