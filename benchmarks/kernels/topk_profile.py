"""Where the time of one CUDA top-k goes, for both drivers of radix select.

    python benchmarks/kernels/topk_profile.py                 # on a GPU; about 10 s
    python benchmarks/kernels/topk_profile.py --device cpu    # smoke run of the script on a CPU

For d = 11,689,512 and 1,000,000 (k = 1%), exact and threshold, the default (device-side walk
with compaction) and the variants of ops_cases.VARIANTS (the host-driven walk, walk="host";
exact without compaction, compact=False), prints:

* wall time per call (best of --reps, synchronised), and ``torch.topk(x.abs(), k)`` alongside;
* the GPU's kernel, memset and memcpy time per call, summed (torch.profiler, CUPTI), and its
  share of the wall time: a low share means launch overhead and host round trips dominate;
* every kernel with its calls and microseconds per top-k, largest first.

The first table of docs/benchmarks.md says what to optimise; this one says where.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ops_cases import D_LARGE, D_SMALL, VARIANTS, time_it

from pgc_hvd import ops


def device_rows(prof, reps: int):
    """(name, calls per top-k, us per top-k) of every device-side event, largest first."""
    rows = []
    for e in prof.key_averages():
        if not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        rows.append((e.key, e.count / reps, us / reps))
    return sorted(rows, key=lambda r: -r[2])


def short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def profile_case(device: str, d: int, method: str, variant: str, reps: int) -> None:
    """variant: "" (the default) or a key of ops_cases.VARIANTS."""
    torch.manual_seed(0)
    x = torch.randn(d, device=device)
    k = d // 100
    setting = VARIANTS[variant] if variant else {}
    fn = lambda: ops.topk_compress(x, k, method, **setting)  # noqa: E731
    wall = time_it(fn, device, reps)
    ref = time_it(lambda: torch.topk(x.abs(), k), device, max(3, reps // 2))
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(reps):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = device_rows(prof, reps)
    gpu_us = sum(r[2] for r in rows)
    print(f"\n### {method}, {variant or 'default'}, d = {d:,}, k = 1%\n")
    print(f"wall {wall * 1e6:.1f} us per top-k (torch.topk {ref * 1e6:.1f} us: "
          f"{ref / wall:.2f}x); device events {gpu_us:.1f} us per top-k "
          f"({gpu_us / (wall * 1e6):.0%} of the wall time)\n")
    if rows:
        print("| device event | calls per top-k | us per top-k |")
        print("|---|---|---|")
        for name, calls, us in rows:
            print(f"| `{short(name)}` | {calls:g} | {us:.1f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"## top-k profile on {name}; torch {torch.__version__}")
    for d in (D_LARGE, D_SMALL):
        for method in ("exact", "threshold"):
            variants = [""]
            if args.device == "cuda":
                variants += ["host walk"] + (["no compaction"] if method == "exact" else [])
            for variant in variants:
                profile_case(args.device, d, method, variant, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
