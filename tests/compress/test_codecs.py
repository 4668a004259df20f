"""pgc_hvd.compress: the one top-kappa spelling and kappa rule, codecs against a direct sum, and
the transport rule (which collective carries a step's messages)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.compress import (ComplexCodec, DenseCodec, ResidualMemory, SparseCodec,
                              SparseComplexCodec, TopK, allreduce_bytes, choose_collective,
                              make_codec, optimistic_default, parse_compression)
from pgc_hvd.compress.codecs import optimistic_threshold


def test_one_spelling_round_trips():
    assert parse_compression(None) is None and parse_compression("none") is None
    assert parse_compression("topk:0.01") == TopK(0.01)
    assert parse_compression("topk:0.05,ef=0,method=threshold") == TopK(
        0.05, error_feedback=False, method="threshold")
    assert parse_compression("topk:k=7,ef=1") == TopK(k=7)
    for c in (TopK(0.01), TopK(0.3, error_feedback=False, method="threshold"), TopK(k=3)):
        assert parse_compression(c.spec()) == c


@pytest.mark.parametrize("spec, needle", [
    ("gzip:0.1", "top-kappa spec"), ("topk", "top-kappa spec"), ("topk:abc", "not a ratio"),
    ("topk:0", "(0, 1]"), ("topk:nan", "(0, 1]"), ("topk:0.1,ef=yes", "ef=0"),
    ("topk:0.1,method=sort", "method"), ("topk:0.1,speed=1", "unknown option"),
    ("topk:0.1,ef", "KEY=VALUE"), ("topk:k=0", "k = 0"),
])
def test_bad_specs_name_the_part_and_the_spelling(spec, needle):
    with pytest.raises(ValueError) as err:
        parse_compression(spec)
    assert needle in str(err.value) and "topk:RATIO" in str(err.value)


@given(st.integers(1, 10**8), st.floats(1e-6, 1.0))
def test_kappa_rule_is_floor_clamped(d, ratio):
    k = TopK(ratio).kappa(d)
    assert k == max(1, min(d, math.floor(ratio * d)))


def weighted(rows, weights, codec, d):
    """Re sum w D(p), in float64, from the rows' definitions."""
    acc = torch.zeros(d, dtype=torch.complex128)
    for p, w in zip(rows, weights):
        if isinstance(codec, DenseCodec):
            x = p.double().to(torch.complex128)
        elif isinstance(codec, ComplexCodec):
            x = torch.view_as_complex(p.double().view(d, 2).contiguous())
        elif isinstance(codec, SparseCodec):
            k = codec.kappa
            x = torch.zeros(d, dtype=torch.complex128)
            x[p[k:].contiguous().view(torch.int32).long()] = p[:k].double().to(torch.complex128)
        else:
            k = codec.kappa
            x = torch.zeros(d, dtype=torch.complex128)
            x[p[2 * k:].contiguous().view(torch.int32).long()] = torch.complex(
                p[:k].double(), p[k:2 * k].double())
        acc += complex(w) * x
    return acc.real


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(0, 4), st.sampled_from(["dense", "complex", "sparse",
                                                                 "sparse-complex"]),
       st.floats(0.01, 1.0), st.integers(0, 2**31 - 1))
def test_add_weighted_is_the_weighted_sum_of_the_decoded_rows(d, m, kind, ratio, seed):
    g = torch.Generator().manual_seed(seed)
    cplx = kind in ("complex", "sparse-complex")
    topk = None if kind in ("dense", "complex") else TopK(ratio, error_feedback=False)
    codec = make_codec(d, topk, complex_messages=cplx)
    rows, weights = [], []
    for _ in range(m):
        msg = torch.randn(d, generator=g)
        if cplx:
            msg = torch.complex(msg, torch.randn(d, generator=g))
        row = torch.empty(codec.width)
        assert math.isnan(codec.encode(msg, row))
        rows.append(row)
        w = float(torch.randn((), generator=g))
        weights.append(complex(w, float(torch.randn((), generator=g))) if cplx else w)
    out = torch.full((d,), 7.0)
    codec.add_weighted(out, rows, weights)
    assert torch.allclose(out.double(), weighted(rows, weights, codec, d), atol=1e-5, rtol=1e-5)
    before = out.clone()
    codec.add_weighted(out, rows, weights, accumulate=True)   # (+)=
    assert torch.allclose(out, 2 * before, atol=1e-5, rtol=1e-5)


def test_dense_encode_into_itself_copies_nothing_and_sparse_keeps_the_top_entries():
    x = torch.tensor([0.5, -3.0, 2.0, 0.1])
    c = DenseCodec(4)
    c.encode(x, x)
    assert torch.equal(x, torch.tensor([0.5, -3.0, 2.0, 0.1]))
    s = SparseCodec(4, TopK(k=2), memory=ResidualMemory(4))
    row = torch.empty(s.width)
    err = s.encode(x, row, error_norm=True)
    v, i = s.split(row)
    assert i.tolist() == [1, 2] and v.tolist() == [-3.0, 2.0]
    assert s.memory.residual.tolist() == pytest.approx([0.5, 0.0, 0.0, 0.1])
    assert err == pytest.approx(math.hypot(0.5, 0.1))


def test_complex_topk_refuses_error_feedback_with_the_fix():
    with pytest.raises(ValueError, match="ef=0"):
        make_codec(10, TopK(0.5), complex_messages=True)
    assert isinstance(make_codec(10, TopK(0.5, error_feedback=False), complex_messages=True),
                      SparseComplexCodec)


def test_transport_rule_moves_the_fewest_bytes():
    n, d = 4, 1000
    assert allreduce_bytes(n, d) == 2 * 3 / 4 * 4 * d and allreduce_bytes(1, d) == 0
    assert choose_collective(sparse=False, n=n, d=d, width=d, needed=0) == "cached"
    assert choose_collective(sparse=False, n=n, d=d, width=d, needed=3) == "allreduce"
    # sparse: 2 kappa words per row; 3 rows of kappa = 200 -> 4.8 KB > 6 KB? no: 4800 <= 6000
    assert choose_collective(sparse=True, n=n, d=d, width=400, needed=3) == "allgather"
    assert choose_collective(sparse=True, n=n, d=d, width=600, needed=3) == "allreduce"


def test_optimistic_threshold_is_overridable_and_checked(monkeypatch):
    monkeypatch.delenv("PGC_HVD_OPTIMISTIC_BYTES", raising=False)
    t = optimistic_threshold()
    assert optimistic_default(t, True) and not optimistic_default(t + 1, True)
    assert optimistic_default(t // 4, True, n=4) and not optimistic_default(t // 4 + 1, True, 4)
    assert not optimistic_default(10, False)          # device payloads never ride along
    monkeypatch.setenv("PGC_HVD_OPTIMISTIC_BYTES", "0")
    assert not optimistic_default(4, True)
    monkeypatch.setenv("PGC_HVD_OPTIMISTIC_BYTES", "lots")
    with pytest.raises(ValueError, match="PGC_HVD_OPTIMISTIC_BYTES"):
        optimistic_threshold()
