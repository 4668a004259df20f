"""Binary class codes (FRC, GFRC, BCGC, uncoded): structure and exact recovery."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.codes import NotDecodable, bcgc_loads, get_code

from code_test_helpers import responder_sets

BINARY = ["fr", "gfrc", "bcgc"]


@st.composite
def binary_case(draw):
    name = draw(st.sampled_from(BINARY))
    n = draw(st.integers(2, 40))
    if name == "fr":
        s = draw(st.sampled_from([d - 1 for d in range(1, n + 1) if n % d == 0]))
    else:
        s = draw(st.integers(0, n - 1))
    return name, n, s


def _check_structure(code):
    n, s, B = code.n, code.s, code.B
    assert B.shape == (n, n)
    assert set(np.unique(B)) <= {0.0, 1.0}
    # supports are exactly the non-zeros of B, without repetition
    for i, S in enumerate(code.supports):
        assert len(set(S)) == len(S)
        assert sorted(S) == list(np.flatnonzero(B[i]))
    # s+1 classes partitioning the workers, each covering [n] exactly once
    assert len(code.classes) == s + 1
    assert sorted(i for K in code.classes for i in K) == list(range(n))
    for K in code.classes:
        assert np.array_equal(B[K].sum(axis=0), np.ones(n))
    # column weights s+1 and total load n(s+1)
    assert np.array_equal(B.sum(axis=0), np.full(n, s + 1))
    assert B.sum() == n * (s + 1)


@settings(max_examples=80, deadline=None)
@given(binary_case(), st.integers(0, 2**32 - 1))
def test_binary_structure_and_exact_recovery(case, seed):
    name, n, s = case
    code = get_code(name, n, s)
    _check_structure(code)
    rng = np.random.default_rng(seed)
    for order in responder_sets(n, s, rng, limit=60):
        a = code.decode(order)
        assert set(np.unique(a)) <= {0.0, 1.0}
        assert not a[np.setdiff1d(np.arange(n), order)].any()
        assert np.array_equal(a @ code.B, np.ones(n))  # exact, no rounding


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.data())
def test_bcgc_loads_eq16(n, data):
    s = data.draw(st.integers(0, n - 1))
    code = get_code("bcgc", n, s)
    L = code.loads
    assert L == bcgc_loads(n, s)
    if n % (s + 1) == 0:
        assert L == [s + 1] * n
        # circulant: every row is the cyclic shift of row 0
        for i in range(n):
            assert np.array_equal(code.B[i], np.roll(code.B[0], i))
    else:
        r = n % (s + 1)
        assert L[: n - s - 1] == [s + 1] * (n - s - 1)          # n-s-1 balanced workers
        assert L[n - s - 1 : n - r] == [s + 1 + r] * (s + 1 - r)
        assert L[n - r :] == [r] * r
    for i, S in enumerate(code.supports):                        # cyclic intervals from i
        assert S == [(i + t) % n for t in range(L[i])]


@pytest.mark.parametrize("n", range(2, 11))
def test_bcgc_binary_recovering_sets_are_exactly_the_classes(n):
    subsets = np.array(list(itertools.product([0, 1], repeat=n)), dtype=float)
    for s in range(n):
        code = get_code("bcgc", n, s)
        recovering = np.all(subsets @ code.B == 1.0, axis=1)
        found = {tuple(np.flatnonzero(row)) for row in subsets[recovering]}
        assert found == {tuple(K) for K in code.classes}


@st.composite
def n_at_least_two_classes(draw):
    s = draw(st.integers(0, 12))
    n = draw(st.integers(2 * (s + 1), 40))
    return n, s


def _refines(P, Q):
    """True when every block of P lies inside a block of Q."""
    return all(any(set(p) <= set(q) for q in Q) for p in P)


@settings(max_examples=60, deadline=None)
@given(n_at_least_two_classes())
def test_bcgc_partitions_distinct_and_none_refines_another(case):
    n, s = case
    parts = get_code("bcgc", n, s).class_partitions()
    as_sets = [frozenset(frozenset(b) for b in P) for P in parts]
    assert len(set(as_sets)) == s + 1
    for j, k in itertools.permutations(range(s + 1), 2):
        assert not _refines(parts[j], parts[k])


def test_frc_and_gfrc_induce_one_and_two_partitions():
    # BCGC paper Prop. V.10: FRC one partition, GFRC at most two
    for n, s in [(12, 2), (12, 3), (10, 4), (8, 2), (11, 2), (40, 6)]:
        g = get_code("gfrc", n, s)
        parts = {frozenset(frozenset(g.supports[i]) for i in K) for K in g.classes}
        assert len(parts) == (1 if n % (s + 1) == 0 else 2)
        if n % (s + 1) == 0:
            f = get_code("fr", n, s)
            assert np.array_equal(f.B, g.B)


def test_bcgc_worked_example_n6_s2():
    # BCGC paper Example III.8: B = Circ(1,1,1,0,0,0), K_0={0,3}, K_1={1,4}, K_2={2,5}
    code = get_code("bcgc", 6, 2)
    expected = np.array([np.roll([1, 1, 1, 0, 0, 0], i) for i in range(6)], dtype=float)
    assert np.array_equal(code.B, expected)
    assert code.classes == [[0, 3], [1, 4], [2, 5]]
    # Remark III.9: half of K_0 plus half of K_1 is a real decoding vector
    a = 0.5 * (code.B[0] + code.B[3]) + 0.5 * (code.B[1] + code.B[4])
    assert np.allclose(a, 1)


def test_bcgc_worked_example_n11_s2():
    # BCGC paper Sec. IV-A example: l=3, r=2, loads 3 (workers 0..7), 5 (worker 8), 2 (workers 9, 10)
    rows = [
        "11100000000", "01110000000", "00111000000", "00011100000", "00001110000",
        "00000111000", "00000011100", "00000001110", "11000000111", "00000000011",
        "10000000001",
    ]
    expected = np.array([[int(ch) for ch in r] for r in rows], dtype=float)
    code = get_code("bcgc", 11, 2)
    assert np.array_equal(code.B, expected)
    assert code.classes == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert np.linalg.matrix_rank(code.B) == 11 - 2


def test_gfrc_example_n8_s2():
    # BCGC paper Example IV.12: L'_0=L'_3=L'_1=L'_4=3, L'_6=L'_7=2, L'_2=L'_5=4
    L = get_code("gfrc", 8, 2).loads
    assert [L[i] for i in (0, 3, 1, 4, 6, 7, 2, 5)] == [3, 3, 3, 3, 2, 2, 4, 4]
    # Example V.11: chunks 0 and 1 share a block in both GFRC partitions; BCGC's P_1 separates them
    g = get_code("gfrc", 8, 2)
    assert all(any({0, 1} <= set(g.supports[i]) for i in K) for K in g.classes)
    b = get_code("bcgc", 8, 2)
    assert sorted(map(sorted, b.class_partitions()[1])) == [[0, 7], [1, 2, 3], [4, 5, 6]]


def test_frc_pgc_figure2_placement():
    # PGC paper Fig. 2a: n=4, c=2: W0, W1 store D0, D1; W2, W3 store D2, D3
    code = get_code("fr", 4, 1)
    assert code.supports == [[0, 1], [0, 1], [2, 3], [2, 3]]
    # one worker per group suffices, even from different classes (BCGC Remark III.9)
    assert np.array_equal(code.decode([0, 3]), [1, 0, 0, 1])
    with pytest.raises(NotDecodable):
        code.decode([0, 1])


def test_fr_rejects_nondivisible_with_a_fix():
    with pytest.raises(ValueError) as err:
        get_code("fr", 10, 3)
    msg = str(err.value)
    assert "(s+1) | n" in msg and "gfrc" in msg and "n=12" in msg and "{0, 1, 4, 9}" in msg


def test_uncoded_is_identity_and_needs_everyone():
    code = get_code("uncoded", 5, 0)
    assert np.array_equal(code.B, np.eye(5))
    assert np.array_equal(code.decode([4, 2, 0, 1, 3]), np.ones(5))
    with pytest.raises(NotDecodable):
        code.decode([0, 1, 2, 3])
    with pytest.raises(ValueError, match="s must be 0"):
        get_code("uncoded", 5, 1)


@pytest.mark.parametrize("name", BINARY)
def test_one_straggler_per_class(name):
    n, s = 12, 2
    code = get_code(name, n, s)
    # s+1 stragglers, one per class, in different FRC groups: K_j loses its j-th worker
    stragglers = {K[j] for j, K in enumerate(code.classes)}
    responders = [i for i in range(n) if i not in stragglers]
    assert code.decode_result(responders, mode="class").group is None
    if name == "bcgc":
        with pytest.raises(NotDecodable):
            code.decode(responders)
    else:
        # FRC/GFRC "cover" decoding combines classes: one worker per block still decodes
        a = code.decode(responders)
        assert np.array_equal(a @ code.B, np.ones(n))


def test_streaming_class_decoder_stops_at_first_complete_class():
    """O(1) per arrival: the decoder answers as soon as a class completes, not after n arrivals
    (the decode time itself is measured in benchmarks/kernels/test_bench_codes.py, never asserted)."""
    for name, s in (("bcgc", 20), ("gfrc", 20), ("bcgc", 24), ("fr", 24)):
        code = get_code(name, 100, s)
        rng = np.random.default_rng(0)
        for _ in range(20):
            order = [int(i) for i in rng.permutation(100)]
            dec = code.decoder("class")
            seen = []
            for i in order:
                seen.append(i)
                if dec.offer(i) is not None:
                    break
            a = dec.vector()
            used = set(np.flatnonzero(a))
            assert used <= set(seen)
            # the last arrival completed the class: without it no class is complete
            assert seen[-1] in used
            assert np.array_equal(a @ code.B, np.ones(100))


def test_report_main_prints_every_code(capsys):
    from pgc_hvd.apps.codes_report import main

    assert main(["--n", "12", "--stragglers", "2,3", "--patterns", "5"]) == 0
    out = capsys.readouterr().out
    for name in ("bcgc", "gfrc", "fr", "gmds", "cr", "rs", "cyclic-mds"):
        assert name in out
    assert "n/a" not in out.split("\n", 3)[2]  # n=12, s=2: fr exists


def test_decode_input_is_checked():
    from pgc_hvd.codes import get_code
    code = get_code("bcgc", 6, 2)
    with pytest.raises(TypeError, match="worker indices"):
        code.decode([0.7, 1.9, 2.2, 3.5])  # not silently workers 0, 1, 2, 3
    for tol in (1.0, 2.0, float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match="tol"):
            code.decode([0], tol=tol)
    dec = code.decoder()
    for bad in (-1, 6):
        with pytest.raises(ValueError, match="not a worker index"):
            dec.offer(bad)


@pytest.mark.parametrize("argv, message", [
    (["--codes", "bcgd"], "unknown code 'bcgd'"),
    (["--codes", "rs:strid=1"], "does not take option"),
    (["--s", ""], "names no straggler budget"),
    (["--patterns", "0"], "--patterns must be >= 1"),
    (["--n", "-3"], "--n is the number of workers and must be >= 1"),
    (["--n", "0"], "--n is the number of workers and must be >= 1"),
    (["--stragglers", "2,-1"], "--stragglers budgets must be >= 0"),
])
def test_report_usage_errors(usage_error, argv, message):
    from pgc_hvd.apps.codes_report import main
    assert message in usage_error(main, ["--n", "12"] + argv)
