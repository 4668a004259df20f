"""pytest-benchmark suite of pgc_hvd.ops (kernels in pgc_hvd._C).

Run: .venv/bin/python -m pytest benchmarks/kernels/test_bench_ops.py -q
     (add --benchmark-columns=median,min,max to trim the table)

Sizes d = 11,689,512 (ResNet-18) and 1,000,000; k = 1% and 5%; c = 2, 4, 8 slots. Every case
also times its baseline in the same run (torch.topk(x.abs(), k) for top-k, the pure-PyTorch
reference or a torch composition otherwise) and prints the speed-up and the achieved GB/s of
the op's least traffic against a plain copy_ on the same machine. CUDA cases run when a GPU is
visible and the extension has its CUDA kernels. ``benchmarks/kernels/ops_report.py`` prints the same
figures as one markdown table.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ops_cases import (FRACS, SIZES, SLOTS, coded_case, copy_bandwidth, decode_case, ef_case,
                       time_it, topk_case)

pytestmark = pytest.mark.bench


def _devices():
    devices = ["cpu"]
    if torch.cuda.is_available():
        from pgc_hvd.ops._ext import cuda_compiled

        if cuda_compiled():
            devices.append("cuda")
    return devices


DEVICES = _devices()


@functools.lru_cache(maxsize=None)
def _copy_bw(device: str) -> float:
    return copy_bandwidth(device)


def _run(benchmark, capsys, device, case):
    ref_reps = 3 if device == "cpu" else 10
    rounds = 5 if device == "cpu" else 20
    t_ref = time_it(case.ref, device, ref_reps)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def ours():
        case.ours()
        sync()

    benchmark.pedantic(ours, rounds=rounds, iterations=1, warmup_rounds=1)
    t = benchmark.stats.stats.min  # best run, as ops_report.py (the machines are shared)
    bw = _copy_bw(device)
    info = {
        "baseline": case.ref_name,
        "baseline_ms": round(t_ref * 1e3, 3),
        "speedup": round(t_ref / t, 2),
        "GB/s": round(case.floor_bytes / t / 1e9, 2),
        "copy_GB/s": round(bw / 1e9, 2),
        "x_floor": round(t / (case.floor_bytes / bw), 2),
        **case.notes,
    }
    benchmark.extra_info.update(info)
    with capsys.disabled():
        print(f"\n  [{device}] {case.op} d={case.d:,} {case.param}: {t * 1e3:.2f} ms | "
              f"{case.ref_name} {t_ref * 1e3:.2f} ms -> {t_ref / t:.1f}x | "
              f"{info['GB/s']} GB/s vs copy_ {info['copy_GB/s']} GB/s "
              f"(x floor {info['x_floor']})"
              + "".join(f" | {k} {v}" for k, v in case.notes.items()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["exact", "threshold"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("d", SIZES)
def test_bench_topk(benchmark, capsys, device, method, frac, d):
    _run(benchmark, capsys, device, topk_case(device, d, frac, method))


@pytest.mark.parametrize("device", DEVICES)
def test_bench_topk_threshold_heavy_tailed(benchmark, capsys, device):
    _run(benchmark, capsys, device, topk_case(device, SIZES[0], 0.01, "threshold", "student_t3"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["exact", "threshold"])
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("d", SIZES)
def test_bench_error_feedback(benchmark, capsys, device, method, frac, d):
    _run(benchmark, capsys, device, ef_case(device, d, frac, method))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c", SLOTS)
@pytest.mark.parametrize("d", SIZES)
def test_bench_coded_accumulate(benchmark, capsys, device, c, d):
    _run(benchmark, capsys, device, coded_case(device, d, c))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("frac", FRACS)
@pytest.mark.parametrize("d", SIZES)
def test_bench_decode_sparse(benchmark, capsys, device, frac, d):
    _run(benchmark, capsys, device, decode_case(device, d, frac))
