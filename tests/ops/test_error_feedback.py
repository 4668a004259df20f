"""Error-feedback compression: conservation (sent + residual == x + old residual, bit for bit),
agreement with the reference, and input checks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.ops import error_feedback_compress
from pgc_hvd.ops.reference import error_feedback_compress_ref

from ops_helpers import DEVICES, DTYPES, densify

METHODS = ["exact", "threshold"]


def check_against_ref(x, residual, k, method, index_dtype=torch.int64):
    d = x.numel()
    old = residual.clone()
    ref_res = residual.cpu().clone()
    values, indices = error_feedback_compress(x, residual, k, method, index_dtype=index_dtype)
    ref_v, ref_i = error_feedback_compress_ref(x.cpu(), ref_res, k, index_dtype=index_dtype)
    assert values.dtype == torch.float32 and indices.dtype == index_dtype
    assert torch.equal(indices.cpu(), ref_i)
    assert torch.equal(values.cpu(), ref_v)
    assert torch.equal(residual.cpu(), ref_res)
    # conservation: nothing lost, exactly
    total = x.float() + old
    assert torch.equal(densify(values, indices, d) + residual, total)
    assert torch.all(residual[indices.long()] == 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_conservation_and_reference(device, method, dtype):
    g = torch.Generator().manual_seed(0)
    d = 200_003
    residual = (torch.randn(d, generator=g) * 0.1).to(device)
    for step in range(3):  # the residual carries over between steps
        x = torch.randn(d, generator=g).to(device, dtype)
        check_against_ref(x, residual, d // 100, method)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_edge_k(device, method):
    d = 1031
    x = torch.randn(d, device=device)
    for k in (0, 1, d):
        residual = torch.randn(d, device=device)
        check_against_ref(x, residual, k, method, torch.int32)
    # k = 0 sends nothing: everything stays in the residual
    residual = torch.ones(d, device=device)
    v, i = error_feedback_compress(x, residual, 0, method)
    assert v.numel() == 0 and torch.equal(residual, x + 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_ties_and_cancellation(device, method):
    d = 5000
    x = torch.ones(d, device=device)
    residual = -torch.ones(d, device=device)  # x + residual == 0 everywhere: all tied
    residual[4000] = 2.0
    v, i = error_feedback_compress(x, residual, 10, method)
    assert i.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 4000]
    assert v.tolist() == [0.0] * 9 + [3.0]
    assert torch.count_nonzero(residual) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_non_finite(device, method):
    d = 100_000
    x = torch.randn(d, device=device)
    x[77] = float("nan")
    residual = torch.zeros(d, device=device)
    with pytest.raises(ValueError, match="Inf or NaN"):
        error_feedback_compress(x, residual, 100, method)
    # documented: the residual then holds x + residual (nothing sent, nothing lost)
    assert torch.equal(residual.isnan(), x.isnan())
    x = torch.full((d,), 3e38, device=device)
    residual = torch.full((d,), 3e38, device=device)  # the sum overflows to Inf
    with pytest.raises(ValueError, match="Inf or NaN"):
        error_feedback_compress(x, residual, 100, method)


@pytest.mark.parametrize("device", DEVICES)
def test_input_checks(device):
    x = torch.randn(100, device=device)
    r = torch.zeros(100, device=device)
    with pytest.raises(TypeError, match="residual must be float32"):
        error_feedback_compress(x, r.half(), 3)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        error_feedback_compress(x.double(), r, 3)
    with pytest.raises(ValueError, match="elements but residual has"):
        error_feedback_compress(x, torch.zeros(99, device=device), 3)
    with pytest.raises(ValueError, match="contiguous"):
        error_feedback_compress(x, torch.zeros(200, device=device)[::2], 3)
    with pytest.raises(ValueError, match=r"k must lie in \[0, d\]"):
        error_feedback_compress(x, r, 101)
    with pytest.raises(ValueError, match="shares memory with x"):
        error_feedback_compress(r, r, 3)
    both = torch.zeros(150, device=device)
    with pytest.raises(ValueError, match="shares memory with x"):
        error_feedback_compress(both[:100], both[50:], 3)  # partial overlap
    with pytest.raises(ValueError, match="method"):
        error_feedback_compress(x, r, 3, "sort")
    assert torch.count_nonzero(r) == 0  # failed checks leave the residual alone


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(st.floats(-65536.0, 65536.0, allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=200),
    kfrac=st.floats(0, 1),
    method=st.sampled_from(METHODS),
)
def test_hypothesis_conservation(data, kfrac, method):
    x = torch.tensor(data, dtype=torch.float32)
    residual = torch.flip(x, [0]) * 0.5
    check_against_ref(x, residual, int(kfrac * x.numel()), method)


@given(d=st.integers(1, 3000), frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_compression_error_norm_is_the_norm_of_what_compression_drops(d, frac, seed):
    """||C(u) - u|| (the minimum-error decoder's input) without and with error feedback, against
    the decompressed message."""
    from pgc_hvd.ops import compression_error_norm, topk_compress
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g) * torch.rand(d, generator=g) ** 4
    k = max(1, round(frac * d))
    values, idx = topk_compress(x, k)
    want = float((densify(values, idx, d) - x).double().norm())
    assert compression_error_norm(x, values) == pytest.approx(want, rel=1e-5, abs=1e-6)
    residual = torch.randn(d, generator=g) * 0.1
    u = x + residual
    values, idx = error_feedback_compress(x, residual, k)
    want = float((densify(values, idx, d) - u).double().norm())
    assert compression_error_norm(x, values, residual) == pytest.approx(want, rel=1e-5, abs=1e-6)
