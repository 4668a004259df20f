"""Decode-time benchmarks of the gradient codes at n = 100 (BCGC paper's Table II setting).

Run: .venv/bin/python -m pytest benchmarks/kernels/test_bench_codes.py --benchmark-columns=mean,median,max
Binary codes' streaming first-complete-class decoder should take well under 1 ms at n = 100.
"""

import numpy as np
import pytest

from pgc_hvd.codes import get_code

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("name,s", [("bcgc", 20), ("gfrc", 20), ("bcgc", 24), ("fr", 24)])
def test_bench_binary_class_decode_n100(benchmark, name, s):
    code = get_code(name, 100, s)
    orders = [[int(i) for i in np.random.default_rng(k).permutation(100)] for k in range(64)]
    state = {"k": 0}

    def decode_one():
        order = orders[state["k"] % len(orders)]
        state["k"] += 1
        dec = code.decoder("class")
        for i in order:
            if dec.offer(i) is not None:
                break
        return dec.vector()

    a = benchmark(decode_one)
    assert np.array_equal(a @ code.B, np.ones(100))


@pytest.mark.parametrize("name,s", [("gmds", 20), ("cr", 20)])
def test_bench_linear_decode_n100_uncached(benchmark, name, s):
    code = get_code(name, 100, s)
    rng = np.random.default_rng(0)

    def decode_fresh():
        responders = sorted(int(i) for i in rng.permutation(100)[: 100 - s])
        return code.decode_result(responders)

    res = benchmark(decode_fresh)
    assert res.residual < 1e-6
