"""Where a step's time goes, call by call: step_cost.py's loop with the step path's functions
timed (inclusive wall time per call, ``time.perf_counter_ns`` around each; a function missing
from the tree under test is skipped, so two trees compare in one command).

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node N \
        benchmarks/doors/step_calls.py [--ranks 0,1 | --chain DIR] STEP_COST_ARGS...

Prints, for each rank in ``--ranks`` (default 0 and 1: the control log's decider and a
follower), each timed function's calls per step and mean / median microseconds per call, the
heaviest first. The wrappers cost about a microsecond a call; the figures are for comparing
trees and functions, not for the absolute step time (step_cost.py's).

``--chain DIR`` (first argument) prints instead where the control log's round spends the time
from the step's (n - s)-th ready rank to the update, step by step across the ranks (each rank
writes its ``CLOCK_MONOTONIC`` times, the same clock in every process of the machine, to
``DIR/chain_<rank>.json``; rank 0 reads them all at the end): the (n - s)-th ``send`` to rank
0's ``publish``, the publish (its broadcast), the followers' receipt of the outcome, the data
phase (``fire``: the data sum and the update formed) and the training threads' wake-up, as
medians over the steps after the tenth; for the door pgc-cr (s = 1, the control log).
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


#: --chain: the calls whose begin and end times are kept, and the key each is filed under
CHAINED = {(step_m.Step, "send"): lambda self, a: self.version,
           (step_m.Step, "exchange"): lambda self, a: self.version,
           (log_m.LogChannel, "publish"): lambda self, a: a[0],
           (log_m.LogChannel, "decision"): lambda self, a: a[0],
           (agent_m.CommAgent, "fire"): lambda self, a: None}
EVENTS: list = []


def chained(owner, name: str, key) -> None:
    f = vars(owner)[name]

    @functools.wraps(f)
    def wrapper(self, *args, **kwargs):
        t = time.monotonic()
        try:
            return f(self, *args, **kwargs)
        finally:
            EVENTS.append((name, key(self, args), t, time.monotonic()))
    setattr(owner, name, wrapper)


def chain_report(folder: Path, s: int = 1, skip: int = 10) -> None:
    """Each rank's events to ``folder``; rank 0 then reads every rank's and prints the chain's
    medians (module doc)."""
    import json
    import statistics
    rank, n = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    (folder / f"chain_{rank}.tmp").write_text(json.dumps(EVENTS))
    (folder / f"chain_{rank}.tmp").rename(folder / f"chain_{rank}.json")
    if rank != 0:
        return
    files = [folder / f"chain_{r}.json" for r in range(n)]
    end = time.monotonic() + 30
    while not all(f.exists() for f in files) and time.monotonic() < end:
        time.sleep(0.1)
    sent, woke, pub, got = (collections.defaultdict(dict) for _ in range(4))
    fires: dict = collections.defaultdict(list)
    for r, f in enumerate(files):
        for name, key, t0, t1 in json.loads(f.read_text()):
            if name == "send":
                sent[key][r] = t1
            elif name == "exchange":
                woke[key][r] = t1
            elif name == "publish":
                pub[key] = (t0, t1)
            elif name == "decision":
                got[key][r] = t1
            else:
                fires[r].append(t1 - t0)
    parts: dict = collections.defaultdict(list)
    for t in sorted(sent):
        if t < skip or t not in pub or len(sent[t]) < n or len(woke[t]) < n:
            continue
        ready = sorted(sent[t].values())
        k = ready[n - s - 1]           # the (n - s)-th ready: the step can be decided
        parts["(n - s)-th ready -> rank 0 publishes"].append(pub[t][0] - k)
        parts["rank 0's publish (its broadcast)"].append(pub[t][1] - pub[t][0])
        if len(got[t]) == n - 1:
            parts["publish -> the first follower has it"].append(min(got[t].values()) - pub[t][0])
            parts["publish -> the last follower has it"].append(max(got[t].values()) - pub[t][0])
        parts["(n - s)-th ready -> the last rank ready"].append(ready[-1] - k)
        parts["(n - s)-th ready -> a training thread has the update (median rank)"].append(
            statistics.median(woke[t][r] - k for r in range(n)))
    for r in range(n):
        parts[f"rank {r}'s data phase (fire)"] = fires[r][skip:]
    print(f"the control round's chain, medians over {len(parts[next(iter(parts))])} steps, "
          f"ms (s = {s})\n| part | median | mean |\n|---|---|---|")
    for label, v in parts.items():
        if v:
            print(f"| {label} | {1e3 * statistics.median(v):.2f} | "
                  f"{1e3 * statistics.mean(v):.2f} |", flush=True)


def main() -> None:
    argv = sys.argv[1:]
    ranks = (0, 1)
    if argv[:1] == ["--chain"]:
        folder, argv = Path(argv[1]), argv[2:]
        folder.mkdir(parents=True, exist_ok=True)
        for (owner, name), key in CHAINED.items():
            chained(owner, name, key)
        atexit.register(chain_report, folder)
    else:
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
