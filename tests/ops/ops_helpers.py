"""Shared helpers of the ops tests: the device parameter and the threshold sample positions."""

from __future__ import annotations

import pytest
import torch

# Every test parametrised over DEVICES runs on CPU, and on CUDA when a GPU is present
# (the gpu marker skips it otherwise; see tests/conftest.py).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

_M64 = (1 << 64) - 1


def _mix(j: int) -> int:
    """splitmix64 finaliser, as pgc::radix::mix in csrc/radix.h."""
    j = (j + 0x9E3779B97F4A7C15) & _M64
    j = ((j ^ (j >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    j = ((j ^ (j >> 27)) * 0x94D049BB133111EB) & _M64
    return j ^ (j >> 31)


def sample_positions(d: int) -> torch.Tensor:
    """Positions the threshold method samples (csrc/radix.h): one per stride-long window."""
    s = min(d, 65536)
    stride = d // s
    return torch.tensor([j * stride + (((_mix(j) >> 32) * stride) >> 32) for j in range(s)],
                        dtype=torch.int64)


def densify(values: torch.Tensor, indices: torch.Tensor, d: int) -> torch.Tensor:
    """D(values, indices) as an fp32 d-vector."""
    out = torch.zeros(d, dtype=torch.float32, device=values.device)
    out[indices.long()] = values.float()
    return out
