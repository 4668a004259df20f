"""Print one markdown table timing pgc_hvd.ops against baselines measured in the same run.

    .venv/bin/python benchmarks/ops_report.py                 # CPU, plus CUDA when a GPU is seen
    .venv/bin/python benchmarks/ops_report.py --device cuda --out report.md

Columns: our median time; the baseline's (torch.topk(x.abs(), k) for top-k, the pure-PyTorch
reference or a torch composition otherwise); speed-up = baseline / ours; the bytes the op must
move at least (floor_bytes) over our time as GB/s; "x floor" = our time over the time a plain
copy_ of this machine needs to move floor_bytes (1.0 = bandwidth bound). Default run: about
1-2 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops_cases import all_cases, copy_bandwidth, time_it  # noqa: E402


def device_label(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def rows_for(device: str, reps: int, ref_reps: int, quick: bool):
    bw = copy_bandwidth(device)
    ref_cache = {}
    for make in all_cases(device, quick):
        case = make()
        t = time_it(case.ours, device, reps)
        key = (case.ref_name, case.d, case.param, case.op.split(" (")[0].split()[0])
        if key not in ref_cache:
            ref_cache[key] = time_it(case.ref, device, ref_reps)
        t_ref = ref_cache[key]
        floor_t = case.floor_bytes / bw
        notes = "; ".join(f"{k} {v}" for k, v in case.notes.items())
        yield (f"{device}", case.op, f"{case.d:,}", case.param, f"{t * 1e3:.2f}", case.ref_name,
               f"{t_ref * 1e3:.2f}", f"{t_ref / t:.1f}x", f"{case.floor_bytes / t / 1e9:.1f}",
               f"{t / floor_t:.2f}", notes)
        del case
        gc.collect()
    yield (device, "copy_ (fp32, read+write)", f"{11_689_512:,}", "", "", "", "", "",
           f"{bw / 1e9:.1f}", "1.00", "bandwidth reference")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                   help="all (default): CPU, and CUDA when a GPU is visible")
    p.add_argument("--reps", type=int, default=None, help="timed runs of each op (median)")
    p.add_argument("--ref-reps", type=int, default=None, help="timed runs of each baseline")
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
    for device in devices:
        if device == "cuda" and not cuda_compiled():
            print("pgc_hvd._C was built without CUDA kernels", file=sys.stderr)
            return 2
        reps = args.reps or (5 if device == "cpu" else 20)
        ref_reps = args.ref_reps or (3 if device == "cpu" else 10)
        labels.append(f"{device}: {device_label(device)}")
        for row in rows_for(device, reps, ref_reps, args.quick):
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], file=sys.stderr, flush=True)  # progress
    table = "\n".join(lines)
    footer = (f"\n\n{'; '.join(labels)}; torch {torch.__version__}; "
              f"median of timed runs; total {time.time() - t0:.0f} s\n")
    print(table + footer)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + footer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
