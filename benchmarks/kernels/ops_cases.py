"""Benchmark cases of pgc_hvd.ops shared by test_bench_ops.py and ops_report.py.

Each case holds the op under test (``ours``), the baseline it is compared with in the same run
(``ref``: ``torch.topk(x.abs(), k)`` for top-k, the pure-PyTorch reference or a torch
composition otherwise) and the least number of bytes the op must move (``floor_bytes``), which
together with a plain ``copy_`` of the same machine gives the bandwidth floor.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict

import torch

from pgc_hvd import ops
from pgc_hvd.ops import reference

D_LARGE = 11_689_512  # ResNet-18's parameter count
D_SMALL = 1_000_000
SIZES = (D_LARGE, D_SMALL)
FRACS = (0.01, 0.05)
SLOTS = (2, 4, 8)


@dataclass
class Case:
    op: str
    d: int
    param: str  # "k=1%" / "c=4"
    ours: Callable[[], object]
    ref: Callable[[], object]
    ref_name: str
    floor_bytes: int
    notes: Dict[str, str] = field(default_factory=dict)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_it(fn: Callable[[], object], device: str, reps: int, warmup: int = 1,
            stat: str = "min") -> float:
    """Wall time of fn in seconds (device work included): the best ("min", default: the
    machines are shared, so the fastest run is the one least disturbed) or the median of reps."""
    for _ in range(warmup):
        fn()
    sync(device)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return min(ts) if stat == "min" else statistics.median(ts)


def time_interleaved(fns, reps, device: str, stat: str = "min"):
    """Times several callables round-robin (fns: name -> (fn, reps_for_it)), so that a shared
    machine's load affects them alike; returns name -> seconds (min or median)."""
    for fn, _ in fns.values():
        fn()
    sync(device)
    ts = {name: [] for name in fns}
    for r in range(reps):
        for name, (fn, n) in fns.items():
            if r >= n:
                continue
            t0 = time.perf_counter()
            fn()
            sync(device)
            ts[name].append(time.perf_counter() - t0)
    pick = min if stat == "min" else statistics.median
    return {name: pick(v) for name, v in ts.items()}


def copy_bandwidth(device: str, d: int = D_LARGE, reps: int = 7, stat: str = "min") -> float:
    """Bytes per second moved by ``y.copy_(x)`` for fp32 x of d elements (read + write)."""
    x = torch.randn(d, device=device)
    y = torch.empty_like(x)
    t = time_it(lambda: y.copy_(x), device, reps, stat=stat)
    return 2 * 4 * d / t


def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _data(dist: str, d: int, device: str, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    if dist == "gaussian":
        return torch.randn(d, device=device)
    return torch.distributions.StudentT(torch.tensor(3.0, device=device)).sample((d,))


def l2_recall(x: torch.Tensor, k: int) -> float:
    """L2 mass of the threshold method's selection over that of the exact top-k."""
    v_thr, _ = ops.topk_compress(x, k, "threshold")
    v_ex, _ = ops.topk_compress(x, k, "exact")
    return float(v_thr.double().pow(2).sum() / v_ex.double().pow(2).sum())


# CUDA radix-select variants timed next to the default (device walk with compaction), as the
# top-k ops' walk / compact arguments (whose defaults pgc_hvd.ops reads once from
# PGC_HVD_CUDA_TOPK_WALK / PGC_HVD_CUDA_TOPK_COMPACT):
VARIANTS: Dict[str, Dict[str, object]] = {
    "host walk": {"walk": "host", "compact": True},
    "no compaction": {"walk": "device", "compact": False},
}


def topk_case(device: str, d: int, frac: float, method: str, dist: str = "gaussian",
              variant: str = "") -> Case:
    """variant (a key of VARIANTS) times that CUDA radix-select variant instead."""
    x = _data(dist, d, device)
    k = int(frac * d)
    setting = VARIANTS[variant] if variant else {}
    ours = lambda: ops.topk_compress(x, k, method, **setting)  # noqa: E731
    case = Case(
        op=f"topk {method}" + ("" if dist == "gaussian" else f" ({dist})")
        + (f" [{variant}]" if variant else ""),
        d=d,
        param=f"k={frac:.0%}",
        ours=ours,
        ref=lambda: torch.topk(x.abs(), k),
        ref_name="torch.topk(x.abs(), k)",
        floor_bytes=4 * d,
    )
    if method == "threshold":
        case.notes["L2 mass vs exact"] = f"{l2_recall(x, k):.4f} ({dist})"
    return case


def _ef_torch(x: torch.Tensor, r: torch.Tensor, k: int):
    a = x + r
    idx = torch.topk(a.abs(), k, sorted=False).indices
    r.copy_(a)
    vals = a[idx]
    r[idx] = 0
    return vals, idx


def ef_case(device: str, d: int, frac: float, method: str, variant: str = "") -> Case:
    x = torch.randn(d, device=device)
    r_ours = torch.zeros(d, device=device)
    r_ref = torch.zeros(d, device=device)
    k = int(frac * d)
    setting = VARIANTS[variant] if variant else {}
    ours = lambda: ops.error_feedback_compress(x, r_ours, k, method, **setting)  # noqa: E731
    return Case(
        op=f"error feedback {method}" + (f" [{variant}]" if variant else ""),
        d=d,
        param=f"k={frac:.0%}",
        ours=ours,
        ref=lambda: _ef_torch(x, r_ref, k),
        ref_name="x+r, torch.topk, scatter",
        floor_bytes=12 * d,  # read x, read and write the residual
    )


def coded_case(device: str, d: int, c: int) -> Case:
    slots = [torch.randn(d, device=device) for _ in range(c)]
    coeffs = [1.0] * c
    out_ours = torch.empty(d, device=device)
    out_ref = torch.empty(d, device=device)
    return Case(
        op="coded accumulate fp32",
        d=d,
        param=f"c={c}",
        ours=lambda: ops.coded_accumulate(out_ours, slots, coeffs),
        ref=lambda: reference.coded_accumulate_ref(out_ref, slots, coeffs),
        ref_name="chained add_",
        floor_bytes=4 * d * (c + 1),  # c slot reads + 1 write
    )


def decode_case(device: str, d: int, frac: float, n_msgs: int = 4) -> Case:
    k = int(frac * d)
    msgs = [ops.topk_compress(torch.randn(d, device=device), k) for _ in range(n_msgs)]
    weights = [1.0] * n_msgs
    out_ours = torch.zeros(d, device=device)
    out_ref = torch.zeros(d, device=device)
    return Case(
        op=f"decode {n_msgs} sparse msgs",
        d=d,
        param=f"k={frac:.0%}",
        ours=lambda: ops.decode_accumulate(out_ours, msgs, weights),
        ref=lambda: reference.decode_accumulate_ref(out_ref, msgs, weights),
        ref_name="index_add_ per message",
        floor_bytes=n_msgs * k * (4 + 8 + 4 + 4),  # values, indices, read + write of out[i]
    )


def all_cases(device: str, quick: bool = False):
    """Yields the cases lazily (each allocates its buffers when reached)."""
    sizes = (D_LARGE,) if quick else SIZES
    for d in sizes:
        for frac in FRACS:
            for method in ("exact", "threshold"):
                yield lambda d=d, frac=frac, method=method: topk_case(device, d, frac, method)
    yield lambda: topk_case(device, D_LARGE, 0.01, "threshold", dist="student_t3")
    if device == "cuda":  # the CUDA radix-select variants, timed in the same run
        for d in sizes:
            for method in ("exact", "threshold"):
                yield lambda d=d, method=method: topk_case(device, d, 0.01, method,
                                                           variant="host walk")
            yield lambda d=d: topk_case(device, d, 0.01, "exact", variant="no compaction")
        yield lambda: ef_case(device, D_LARGE, 0.01, "exact", variant="host walk")
    for d in sizes:
        for method in ("exact", "threshold"):
            yield lambda d=d, method=method: ef_case(device, d, 0.01, method)
    for d in sizes:
        for c in SLOTS:
            yield lambda d=d, c=c: coded_case(device, d, c)
    for d in sizes:
        yield lambda d=d: decode_case(device, d, 0.01)
