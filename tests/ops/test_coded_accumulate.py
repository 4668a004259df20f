"""Coded accumulation over ring slots: kernel vs reference, dtypes, accumulate, checks."""

from __future__ import annotations

import pytest
import torch

from pgc_hvd.ops import add_slot, coded_accumulate
from pgc_hvd.ops.reference import coded_accumulate_ref

from ops_helpers import DEVICES, DTYPES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [1, 2, 4, 8, 17])
@pytest.mark.parametrize("d", [1, 1023, 100_003])
def test_matches_reference(device, dtype, c, d):
    g = torch.Generator().manual_seed(c * 1000 + d)
    slots = [torch.randn(d, generator=g).to(device, dtype) for _ in range(c)]
    coeffs = torch.randn(c, generator=g).tolist()
    for accumulate in (False, True):
        out = torch.randn(d, generator=g).to(device)
        ref = coded_accumulate_ref(out.cpu().clone(), [s.cpu() for s in slots], coeffs, accumulate)
        coded_accumulate(out, slots, coeffs, accumulate)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_add_slot_and_empty(device):
    out = torch.ones(10, device=device)
    add_slot(out, torch.full((10,), 2.0, device=device, dtype=torch.bfloat16), 0.5)
    assert torch.equal(out.cpu(), torch.full((10,), 2.0))
    coded_accumulate(out, [], [])
    assert torch.count_nonzero(out) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_checks(device):
    out = torch.zeros(10, device=device)
    s = torch.ones(10, device=device)
    with pytest.raises(ValueError, match="coefficients"):
        coded_accumulate(out, [s], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        coded_accumulate(out, [s], [float("inf")])
    with pytest.raises(ValueError, match="finite in float32"):
        coded_accumulate(out, [s], [1e300])  # finite as a double, Inf in the fp32 kernel
    with pytest.raises(ValueError, match="shares memory with out"):
        coded_accumulate(out, [out], [1.0])
    with pytest.raises(ValueError, match="shares memory with out"):
        coded_accumulate(out, [out.view(-1)], [1.0])  # a view is the same memory
    big = torch.zeros(20, device=device)
    with pytest.raises(ValueError, match="shares memory with out"):
        coded_accumulate(big[:10], [big[5:15]], [1.0])  # partial overlap
    with pytest.raises(TypeError, match="share one dtype"):
        coded_accumulate(out, [s, s.half()], [1.0, 1.0])
    with pytest.raises(TypeError):
        coded_accumulate(out.half(), [s], [1.0])
    with pytest.raises(ValueError, match="elements"):
        coded_accumulate(out, [torch.ones(11, device=device)], [1.0])
