"""Print one markdown table timing pgc_hvd.ops against baselines measured in the same run.

    .venv/bin/python benchmarks/kernels/ops_report.py                 # CPU, plus CUDA when a GPU is seen
    .venv/bin/python benchmarks/kernels/ops_report.py --device cuda --out report.md

Columns: our time (best of the timed runs, or --stat median); the baseline's (torch.topk(x.abs(), k) for top-k, the pure-PyTorch
reference or a torch composition otherwise); speed-up = baseline / ours; the bytes the op must
move at least (floor_bytes) over our time as GB/s; "x floor" = our time over the time a plain
copy_ of d fp32 elements (timed round-robin with the op, so under the same load) needs to move
floor_bytes, counting a copy as 8d bytes (read + write); 1.00 = at the bandwidth floor. Default run: about
1-2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time

import torch

from ops_cases import all_cases, time_interleaved


def device_label(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def rows_for(device: str, reps: int, ref_reps: int, quick: bool, stat: str):
    """One row per case. Ours, the baseline and a copy_ of d fp32 elements are timed
    round-robin, so the bandwidth floor comes from copies made under the same load."""
    bufs = {}
    ref_cache = {}
    bws = []
    for make in all_cases(device, quick):
        case = make()
        if case.d not in bufs:
            x = torch.randn(case.d, device=device)
            bufs[case.d] = (x, torch.empty_like(x))
        x, y = bufs[case.d]
        key = (case.ref_name, case.d, case.param, case.op.split(" (")[0].split()[0])
        fns = {"ours": (case.ours, reps), "copy": (lambda: y.copy_(x), reps)}
        if key not in ref_cache:
            fns["ref"] = (case.ref, ref_reps)
        t = time_interleaved(fns, max(reps, ref_reps), device, stat)
        ref_cache.setdefault(key, t.get("ref"))
        t_ours, t_ref = t["ours"], ref_cache[key]
        bw = 8 * case.d / t["copy"]  # copy_ reads and writes 4d bytes
        bws.append(bw)
        floor_t = case.floor_bytes / bw
        notes = "; ".join(f"{k} {v}" for k, v in case.notes.items())
        yield (f"{device}", case.op, f"{case.d:,}", case.param, f"{t_ours * 1e3:.2f}",
               case.ref_name, f"{t_ref * 1e3:.2f}", f"{t_ref / t_ours:.1f}x",
               f"{case.floor_bytes / t_ours / 1e9:.1f}", f"{t_ours / floor_t:.2f}",
               notes + ("; " if notes else "") + f"copy_ {bw / 1e9:.1f} GB/s")
        del case
        gc.collect()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                   help="all (default): CPU, and CUDA when a GPU is visible")
    p.add_argument("--reps", type=int, default=None, help="timed runs of each op (median)")
    p.add_argument("--ref-reps", type=int, default=None, help="timed runs of each baseline")
    p.add_argument("--stat", choices=["min", "median"], default="min",
                   help="best (default; the machine may be shared) or median of the timed runs")
    p.add_argument("--quick", action="store_true", help="only d = 11,689,512")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)

    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            print("no CUDA device visible to torch", file=sys.stderr)
            return 2
        devices.remove("cuda")
    from pgc_hvd.ops._ext import cuda_compiled

    header = ("device", "op", "d", "k / c", "ours ms", "baseline", "baseline ms", "speed-up",
              "GB/s", "x floor", "notes")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    t0 = time.time()
    labels = []
    reps_used = []
    for device in devices:
        if device == "cuda" and not cuda_compiled():
            print("pgc_hvd._C was built without CUDA kernels", file=sys.stderr)
            return 2
        reps = args.reps or (25 if device == "cpu" else 30)
        ref_reps = args.ref_reps or (5 if device == "cpu" else 10)
        labels.append(f"{device}: {device_label(device)}")
        reps_used.append(f"{device} {reps} (baselines {ref_reps})")
        for row in rows_for(device, reps, ref_reps, args.quick, args.stat):
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], file=sys.stderr, flush=True)  # progress
    table = "\n".join(lines)
    footer = (f"\n\n{'; '.join(labels)}; torch {torch.__version__}; "
              f"{args.stat} of {', '.join(reps_used)} timed runs per op; total {time.time() - t0:.0f} s\n")
    print(table + footer)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + footer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
