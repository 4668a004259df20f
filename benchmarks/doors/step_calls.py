"""Where a step's time goes, call by call: step_cost.py's loop with the step path's functions
timed (inclusive wall time per call, ``time.perf_counter_ns`` around each; a function missing
from the tree under test is skipped, so two trees compare in one command).

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node N \
        benchmarks/doors/step_calls.py [--ranks 0,1] STEP_COST_ARGS...

Prints, for each rank in ``--ranks`` (default 0 and 1: the control log's decider and a
follower), each timed function's calls per step and mean / median microseconds per call, the
heaviest first. The wrappers cost about a microsecond a call; the figures are for comparing
trees and functions, not for the absolute step time (step_cost.py's).
"""

from __future__ import annotations

import atexit
import collections
import functools
import os
import runpy
import sys
import time
from pathlib import Path

import torch

import pgc_hvd.runtime.agent as agent_m
import pgc_hvd.runtime.capture as capture_m
import pgc_hvd.runtime.control_log as log_m
import pgc_hvd.runtime.optimizer as opt_m
import pgc_hvd.runtime.rows as rows_m
import pgc_hvd.runtime.step as step_m
import pgc_hvd.runtime.sum_rows as sum_m
import pgc_hvd.runtime.communicator as comm_m
import pgc_hvd.schemes.protocol as protocol_m

TIMED = {
    opt_m.PGCOptimizer: "step synchronize zero_grad _pgc_apply_grads",
    step_m.Step: "begin_loop send exchange load apply applied",
    capture_m.GradientCapture: "end new_step",
    agent_m.CommAgent: "submit wait_for fire",
    agent_m.Handoff: "pack",
    sum_m.SumRows: "_sum",
    rows_m.Decider: "decide",
    protocol_m.Round: "offer decide",
    comm_m.Collectives: "allreduce_sum_ broadcast_",
    log_m.LogChannel: "append flush _push _forget_mine next_rows publish decision",
    torch.optim.SGD: "step",
    step_m: "all_finite",          # module functions, as the module calls them
    sum_m: "split_rows join_rows",
}
CALLS: dict = collections.defaultdict(list)


def timed(owner, name: str) -> None:
    f = vars(owner).get(name)
    if f is None:
        return
    label = f"{owner.__name__.rpartition('.')[2]}.{name}"

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        t = time.perf_counter_ns()
        try:
            return f(*args, **kwargs)
        finally:
            CALLS[label].append(time.perf_counter_ns() - t)
    setattr(owner, name, wrapper)


def report(ranks) -> None:
    rank = int(os.environ.get("RANK", "0"))
    if rank not in ranks:
        return
    steps = max(len(CALLS.get("PGCOptimizer.step", ())), 1)
    rows = sorted(CALLS.items(), key=lambda kv: -sum(kv[1]))
    lines = [f"rank {rank}: {steps} steps of the door (every door of the launch timed)",
             "| function | calls a step | mean us | median us |", "|---|---|---|---|"]
    for label, v in rows:
        v = sorted(v)
        lines.append(f"| {label} | {len(v) / steps:.1f} | {sum(v) / len(v) / 1e3:.1f} | "
                     f"{v[len(v) // 2] / 1e3:.1f} |")
    print("\n".join(lines), flush=True)


def main() -> None:
    argv = sys.argv[1:]
    ranks = (0, 1)
    if argv[:1] == ["--ranks"]:
        ranks, argv = tuple(int(r) for r in argv[1].split(",")), argv[2:]
    for owner, names in TIMED.items():
        for name in names.split():
            timed(owner, name)
    atexit.register(report, ranks)
    sys.argv = ["step_cost.py"] + argv
    runpy.run_path(str(Path(__file__).with_name("step_cost.py")), run_name="__main__")


if __name__ == "__main__":
    main()
