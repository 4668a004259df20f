"""Decode-accumulate: dense and sparse (scatter-add) messages with decode weights, repeated
indices, dtypes, and checks that leave the output untouched on error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.ops import decode_accumulate, topk_compress
from pgc_hvd.ops.reference import decode_accumulate_ref

from ops_helpers import DEVICES, DTYPES


def close(a, b):
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)


def run_both(out, messages, weights, **kw):
    ref = decode_accumulate_ref(out.cpu().clone(),
                                [m.cpu() if isinstance(m, torch.Tensor) else (m[0].cpu(), m[1].cpu())
                                 for m in messages], weights, **kw)
    got = decode_accumulate(out, messages, weights, **kw)
    assert got is out
    close(out, ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense(device, dtype):
    g = torch.Generator().manual_seed(0)
    d = 100_003
    msgs = [torch.randn(d, generator=g).to(device, dtype) for _ in range(3)]
    out = torch.randn(d, generator=g).to(device)
    run_both(out, msgs, [0.5, -1.0, 2.0])
    run_both(out, msgs, [1.0, 1.0, 1.0], accumulate=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_sparse_topk_messages_overlap(device, dtype, index_dtype):
    """Top-k messages of correlated gradients share many indices: they must all accumulate."""
    g = torch.Generator().manual_seed(1)
    d = 200_003
    base = torch.randn(d, generator=g)
    msgs = []
    for j in range(4):
        grad = (base + 0.3 * torch.randn(d, generator=g)).to(device, dtype)
        msgs.append(topk_compress(grad, d // 50, index_dtype=index_dtype))
    shared = set(msgs[0][1].tolist()) & set(msgs[1][1].tolist())
    assert len(shared) > 1000  # the case under test: duplicates across messages
    out = torch.zeros(d, device=device)
    run_both(out, msgs, [1.0, 0.5, -2.0, 1.0])


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_repeated_and_unordered_indices(device):
    out = torch.zeros(10, device=device)
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=device)
    idx = torch.tensor([7, 2, 7, 7, 0], device=device)
    decode_accumulate(out, [(vals, idx), (vals, idx.flip(0))], [1.0, 10.0])
    expect = [0.0] * 10
    for w, ix in ((1.0, idx.tolist()), (10.0, idx.flip(0).tolist())):
        for v, i in zip(vals.tolist(), ix):
            expect[i] += w * v
    expect = torch.tensor(expect)
    close(out, expect)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dense_and_sparse(device):
    g = torch.Generator().manual_seed(2)
    d = 70_001
    dense = [torch.randn(d, generator=g).to(device) for _ in range(2)]
    sparse = [topk_compress(torch.randn(d, generator=g).to(device), 700) for _ in range(2)]
    out = torch.randn(d, generator=g).to(device)
    run_both(out, [dense[0], sparse[0], dense[1], sparse[1]], [1.0, 0.25, -1.0, 3.0])
    run_both(out, [sparse[0], dense[0].half()], [1.0, 1.0], accumulate=False)
    run_both(out, [sparse[0]], [1.0], accumulate=False)  # no dense message: out zeroed first
    run_both(out, [], [])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_sparse_message(device):
    out = torch.ones(5, device=device)
    empty = (torch.empty(0, device=device), torch.empty(0, dtype=torch.int64, device=device))
    decode_accumulate(out, [empty], [2.0])
    assert torch.equal(out.cpu(), torch.ones(5))


@pytest.mark.parametrize("device", DEVICES)
def test_checks_leave_out_untouched(device):
    d = 1000
    out = torch.ones(d, device=device)
    good = torch.randn(d, device=device)
    vals = torch.ones(3, device=device)
    with pytest.raises(ValueError, match=r"outside \[0, d\)"):
        decode_accumulate(out, [good, (vals, torch.tensor([0, 5, d], device=device))], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"outside \[0, d\)"):
        decode_accumulate(out, [(vals, torch.tensor([-1, 5, 6], device=device))], [1.0])
    nan_vals = torch.tensor([1.0, float("nan"), 2.0], device=device)
    idx = torch.tensor([1, 2, 3], device=device)
    with pytest.raises(ValueError, match="Inf or NaN"):
        decode_accumulate(out, [good, (nan_vals, idx)], [1.0, 1.0])
    bad_dense = good.clone()
    bad_dense[10] = float("inf")
    with pytest.raises(ValueError, match="Inf or NaN"):
        decode_accumulate(out, [bad_dense], [1.0], accumulate=False)
    with pytest.raises(ValueError, match="weight"):
        decode_accumulate(out, [good], [float("nan")])
    with pytest.raises(ValueError, match="finite in float32"):
        decode_accumulate(out, [(vals, torch.tensor([1, 2, 3], device=device))], [1e300])
    with pytest.raises(ValueError, match="shares memory with out"):
        decode_accumulate(out, [out.view(-1)], [1.0])
    with pytest.raises(ValueError, match="weights"):
        decode_accumulate(out, [good, good], [1.0])
    with pytest.raises(ValueError, match="elements but out has"):
        decode_accumulate(out, [torch.ones(d + 1, device=device)], [1.0])
    with pytest.raises(ValueError, match="values but"):
        decode_accumulate(out, [(vals, torch.tensor([1, 2], device=device))], [1.0])
    with pytest.raises(TypeError, match="int64 or int32"):
        decode_accumulate(out, [(vals, idx.float())], [1.0])
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        decode_accumulate(out, [(vals.double(), idx)], [1.0])
    with pytest.raises(TypeError, match="float32"):
        decode_accumulate(out.double(), [good], [1.0])
    with pytest.raises(ValueError, match="contiguous"):
        decode_accumulate(out, [torch.ones(2 * d, device=device)[::2]], [1.0])
    with pytest.raises(TypeError, match="values, indices"):
        decode_accumulate(out, [(vals,)], [1.0])
    assert torch.equal(out.cpu(), torch.ones(d))
    # check_finite=False lets non-finite values propagate (IEEE arithmetic)
    decode_accumulate(out, [(nan_vals, idx)], [1.0], check_finite=False)
    assert out[2].isnan() and out[1] == 2.0


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 300),
    nmsg=st.integers(0, 5),
    seed=st.integers(0, 2**31 - 1),
    accumulate=st.booleans(),
)
def test_hypothesis_random_messages(d, nmsg, seed, accumulate):
    g = torch.Generator().manual_seed(seed)
    msgs, weights = [], []
    for j in range(nmsg):
        if torch.rand(1, generator=g) < 0.3:
            msgs.append(torch.randn(d, generator=g))
        else:
            nnz = int(torch.randint(0, 2 * d + 1, (1,), generator=g))
            msgs.append((torch.randn(nnz, generator=g), torch.randint(0, d, (nnz,), generator=g)))
        weights.append(float(torch.randn(1, generator=g)))
    run_both(torch.randn(d, generator=g), msgs, weights, accumulate=accumulate)
