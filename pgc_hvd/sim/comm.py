"""Communication model of the simulator: a message of ``bytes`` costs T = alpha + bytes / b
seconds (BCGC paper, Sec. VII: alpha = 5e-4 s, b = 30 MB/s), dense or sparse alike.

``message_bytes(payload)`` counts the bytes of a real message: a dense tensor's storage, or a
sparse top-kappa pair (values, indices) as values + indices storage (int32 indices in the
simulator), plus 8 bytes for the compression-error scalar of the minimum-error decoder when
sent. Links are independent (every worker has its own link to the decoder) unless the decoder's
ingress is serial (``serial_ingress=True``), then messages queue at the decoder one at a time.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class CommModel:
    alpha: float = 5e-4
    bandwidth: float = 30e6  # bytes per second (30 MB/s)
    serial_ingress: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"CommModel: alpha = {self.alpha!r}; the per-message latency must be "
                             "finite seconds >= 0")
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"CommModel: bandwidth = {self.bandwidth!r}; give finite bytes per "
                             "second > 0")

    def cost(self, nbytes: int) -> float:
        return self.alpha + float(nbytes) / self.bandwidth


def message_bytes(payload) -> int:
    if payload is None:
        return 0
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (tuple, list)):
        return sum(message_bytes(p) for p in payload)
    raise TypeError(f"cannot size a message of type {type(payload).__name__}")
