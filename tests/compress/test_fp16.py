"""fp16 messages (Fp16Codec, hvd.Compression.fp16): the payload row is the direct fp16 cast of
the message (scaled by a power of two only past the fp16 range), decoding is the fp32 weighted
sum of those fp16 values, the bytes are halved (Horovod's none/fp16 are mapped to a wire dtype by
the optimizer's configuration: tests/runtime/test_config.py)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.compress import (DenseCodec, Fp16Codec, Fp16SparseCodec, ResidualMemory, TopK,
                              allreduce_bytes, make_codec, optimistic_default)
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.rows import ctrl_len
from pgc_hvd.schemes import get_scheme


def fp16_codec(d):
    return make_codec(d, None, complex_messages=False, wire_dtype=torch.float16)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 257), st.integers(0, 4), st.integers(0, 2**31 - 1))
def test_round_trip_is_the_direct_fp16_computation(d, m, seed):
    g = torch.Generator().manual_seed(seed)
    codec = fp16_codec(d)
    assert isinstance(codec, Fp16Codec) and not isinstance(codec, DenseCodec)
    assert codec.width == 1 + (d + 1) // 2 and codec.wire_dtype == torch.float16
    rows, weights, want = [], [], torch.zeros(d, dtype=torch.float64)
    for _ in range(m):
        msg = torch.randn(d, generator=g) * 10.0
        row = torch.full((codec.width,), float("nan"))     # every word gets written
        err = codec.encode(msg, row, error_norm=True)
        assert float(row[0]) == 1.0
        assert torch.equal(codec.values(row), msg.half())              # bit for bit the cast
        assert err == pytest.approx(float((msg.half().double() - msg.double()).norm()),
                                    rel=1e-6, abs=1e-12)
        assert torch.isfinite(row).all()
        w = float(torch.randn((), generator=g))
        rows.append(row)
        weights.append(w)
        want += w * msg.half().double()
    out = torch.full((d,), 7.0)
    codec.add_weighted(out, rows, weights)
    assert torch.allclose(out.double(), want, atol=1e-5, rtol=1e-5)
    before = out.clone()
    codec.add_weighted(out, rows, weights, accumulate=True)
    assert torch.allclose(out, 2 * before, atol=1e-5, rtol=1e-5)


def test_past_the_fp16_range_a_power_of_two_scale_keeps_the_message_finite():
    codec = fp16_codec(5)
    msg = torch.tensor([1e6, -3.0, 65504.0, 1e-3, 2.5])
    row = torch.empty(codec.width)
    codec.encode(msg, row)
    scale = float(row[0])
    assert scale == 16.0                      # 1e6 / 65504 = 15.3 -> 2^4
    assert torch.equal(codec.values(row), (msg / scale).half())
    out = torch.empty(5)
    codec.add_weighted(out, [row], [1.0])
    assert torch.isfinite(out).all()
    assert torch.allclose(out, msg, rtol=2 ** -10, atol=scale * 2 ** -24)
    # at the top of the range the cast itself is exact and unscaled
    codec.encode(torch.full((5,), 65504.0), row)
    assert float(row[0]) == 1.0 and torch.equal(codec.values(row), torch.full((5,), 65504.0).half())
    with pytest.raises(ValueError, match="report_bad"):
        codec.encode(torch.tensor([1.0, math.inf, 0.0, 0.0, 0.0]), row)


def test_bytes_are_halved():
    d, n = 11_689_512, 4                                # ResNet-18
    f32, f16 = DenseCodec(d), fp16_codec(d)
    assert f32.payload_bytes == 4 * d and f16.payload_bytes == 2 * d + 4
    assert f32.wire_itemsize == 4 and f16.wire_itemsize == 2
    assert allreduce_bytes(n, d, f16.wire_itemsize) == allreduce_bytes(n, d) / 2
    # the optimistic default looks at payload bytes: fp16 rows ride along up to twice the d
    assert optimistic_default(fp16_codec(500_000).payload_bytes, True, 4)
    assert not optimistic_default(DenseCodec(500_000).payload_bytes, True, 4)


def sparse_dense(codec, row, d):
    """D(p) of an Fp16SparseCodec row, in float64, from the layout's definition."""
    k, h = codec.kappa, (codec.kappa + 1) // 2
    vals = row[1: 1 + h].view(torch.float16)[:k].double() * float(row[0])
    x = torch.zeros(d, dtype=torch.float64)
    x.index_add_(0, row[1 + h:].contiguous().view(torch.int32).long(), vals)
    return x


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 300), st.floats(0.01, 1.0), st.booleans(), st.integers(0, 2**31 - 1))
def test_sparse_fp16_is_topk_then_the_fp16_cast(d, ratio, ef, seed):
    from pgc_hvd.ops.reference import topk_compress_ref
    g = torch.Generator().manual_seed(seed)
    topk = TopK(ratio, error_feedback=ef)
    memory = ResidualMemory(d) if ef else None
    codec = make_codec(d, topk, complex_messages=False, memory=memory,
                       wire_dtype=torch.float16)
    k = codec.kappa
    assert codec.width == 1 + (k + 1) // 2 + k and codec.payload_bytes <= 6 * k + 8
    rows, weights, want = [], [], torch.zeros(d, dtype=torch.float64)
    for _ in range(3):
        msg = torch.randn(d, generator=g)
        old = None if memory is None else memory.residual.clone()
        a = msg if old is None else msg + old
        row = torch.full((codec.width,), float("nan"))
        err = codec.encode(msg, row, error_norm=True)
        assert torch.isfinite(row[: 1 + (k + 1) // 2]).all() and float(row[0]) == 1.0
        vals, idx = codec.split(row)
        rv, ri = topk_compress_ref(a, k, index_dtype=torch.int32)
        assert torch.equal(idx.sort().values, ri.sort().values)
        assert torch.equal(vals.float(), a[idx.long()].half().float())
        dec = sparse_dense(codec, row, d)
        if memory is not None:   # the fp16 rounding goes into the memory: nothing is lost
            assert torch.allclose(dec + memory.residual.double(), a.double(), atol=1e-6)
            assert err == pytest.approx(float(memory.residual.double().norm()), rel=1e-6)
        else:
            assert err == pytest.approx(float((dec - a.double()).norm()), rel=1e-5, abs=1e-9)
        w = float(torch.randn((), generator=g))
        rows.append(row)
        weights.append(w)
        want += w * dec
    out = torch.full((d,), 3.0)
    codec.add_weighted(out, rows, weights)
    assert torch.allclose(out.double(), want, atol=1e-5, rtol=1e-5)
    out16 = torch.empty(d, dtype=torch.float16)
    codec.add_weighted_narrow(out16, rows, weights)
    assert torch.equal(out16, out.half())


def test_fp16_refuses_topk_complex_and_other_dtypes_with_the_fix():
    assert isinstance(make_codec(10, TopK(0.5), complex_messages=False,
                                 wire_dtype=torch.float16), Fp16SparseCodec)
    with pytest.raises(ValueError, match="Reed-Solomon"):
        make_codec(10, TopK(0.5, error_feedback=False), complex_messages=True,
                   wire_dtype=torch.float16)
    with pytest.raises(ValueError, match="Reed-Solomon"):
        make_codec(10, None, complex_messages=True, wire_dtype=torch.float16)
    with pytest.raises(ValueError, match="torch.float16"):
        make_codec(10, None, complex_messages=False, wire_dtype=torch.bfloat16)
    assert isinstance(make_codec(10, None, complex_messages=False, wire_dtype=torch.float32),
                      DenseCodec)


def test_agent_decodes_cached_fp16_rows():
    """A world of one rank (LoopbackChannel): the payload rides with the control row and the
    update is the fp32 decode of the fp16 row, with the row's bytes accounted."""
    d = 9
    codec = fp16_codec(d)
    agent = CommAgent(None, get_scheme("dgd", 1, 0), 0, d, 1, codec=codec, device="cpu",
                      poll_interval=0.001, timeout=30, optimistic=True,
                      channel=LoopbackChannel(ctrl_len(1), codec.width))
    agent.start()
    try:
        for t in range(5):
            msg = torch.linspace(-3, 3, d) * (t + 1) + 1e-3
            packed, payload = agent.payload_buffer()
            codec.encode(msg, payload)
            agent.submit(Outgoing(t, t, payload, time.time(), packed=packed), 0.0)
            agent.wait_for(t)
            upd = agent.take(t)
            assert torch.equal(upd.flat, msg.half().float())        # weight 1/n = 1
            assert upd.info["collective"] == "cached" and upd.info["fp16_fallback"] is False
            assert upd.info["bytes"] == 0                           # n = 1 receives nothing
            agent.release_before(t + 1)
    finally:
        agent.finish()


def test_narrow_contribution_is_rounded_once_and_overflow_shows():
    from pgc_hvd.compress.encoder import fp16_finite
    d = 33
    codec = fp16_codec(d)
    g = torch.Generator().manual_seed(3)
    msgs = [torch.randn(d, generator=g) for _ in range(3)]
    rows = []
    for m in msgs:
        rows.append(torch.empty(codec.width))
        codec.encode(m, rows[-1])
    out16 = torch.empty(d, dtype=torch.float16)
    codec.add_weighted_narrow(out16, rows[:1], [0.3])
    assert torch.equal(out16, (msgs[0].half().double() * 0.3).float().half())
    codec.add_weighted_narrow(out16, rows, [0.3, -1.5, 2.0])
    want = sum(w * m.half().float() for w, m in zip([0.3, -1.5, 2.0], msgs)).half()
    assert torch.allclose(out16.float(), want.float(), rtol=2 ** -10, atol=2 ** -20)
    assert torch.equal(codec.add_weighted_narrow(out16, [], []), torch.zeros(d).half())
    assert fp16_finite(out16)
    codec.encode(torch.full((d,), 60000.0), rows[0])
    codec.add_weighted_narrow(out16, rows[:1], [2.0])          # 120000 > 65504
    assert not fp16_finite(out16)
    out16[:] = 1.0
    out16[4] = float("nan")
    assert not fp16_finite(out16)


def test_output_taking_entry_points_are_found_by_signature():
    """The fp16 sum's alltoall/allgather write into recycled buffers through Horovod's
    output-taking entry points when they have the expected parameters; otherwise (another
    Horovod, or none) the public calls are used."""
    from pgc_hvd.runtime.communicator import _output_entry_points
    assert _output_entry_points(None) is None
    assert _output_entry_points(math) is None
    hvd = pytest.importorskip("horovod.torch")
    eps = _output_entry_points(hvd)
    assert eps is not None and set(eps) == {"allgather", "alltoall", "process_set"}
