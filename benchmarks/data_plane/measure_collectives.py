"""Measure Horovod's collectives on this machine and fit the simulator's alpha-beta model.

    python benchmarks/data_plane/measure_collectives.py --np 2,3,4 --out comm.json [--reps 7]
    python -m pgc_hvd simulate ... --comm-model fitted:comm.json

For each n it launches ``horovodrun --gloo -np N -H localhost:N`` and times, on every rank, the
collectives the runtime's agent issues (``hvd.allreduce_async`` / ``hvd.allgather_async`` of
1-D float32 tensors, each with a new name, polled with the agent's own
:func:`pgc_hvd.runtime.communicator.wait_for_handle`) at sizes from 1 float to ``--max-floats``:

* ``allreduce``: every rank B bytes;
* ``allgather`` "all": every rank B bytes (the rank receiving most receives (n-1) B);
* ``allgather`` "one": rank 0 B bytes, the others none (a single message; received B).

One repetition's time is (last rank's completion) - (last rank's submission), on the shared
clock of this machine (the time a round of the protocol takes once every rank has joined);
the figure of a size is the **median over ``--reps`` repetitions** (the cores are shared with
whatever else runs: medians, not means). Then per n and per collective it fits, by
least squares on relative residuals (:func:`pgc_hvd.sim.comm.fit_alpha_beta`),

    allreduce:  T = 2 (n-1) alpha + 2 (n-1)/n B beta
    allgather:  T = (n-1) alpha + R beta    (R: bytes received by the rank receiving most)

and once over every n together (``"all"``, what the simulator uses at an n not measured). It
also times a local pass over memory (``y.add_(x, alpha)``, 12 bytes moved per float, every
rank at once) for ``pass_beta``. The JSON (format ``pgc_hvd.comm_fit/1``) holds the medians,
every repetition, the fits and their relative RMS residuals.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks


def sizes_upto(max_floats: int) -> list:
    out, k = [], 1
    while k <= max_floats:
        out.append(k)
        k *= 4
    if out[-1] != max_floats:
        out.append(max_floats)
    return out


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    import horovod.torch as hvd
    import torch

    from pgc_hvd.runtime.communicator import wait_for_handle

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    counter = [0]

    def timed(kind, tensor):
        counter[0] += 1
        name = f"mc.{kind}.{counter[0]}"
        t0 = time.time()
        if kind == "allreduce":
            h = hvd.allreduce_async(tensor, name=name, op=hvd.Sum)
        else:
            h = hvd.allgather_async(tensor, name=name)
        if not wait_for_handle(hvd, h, args.timeout):
            raise SystemExit(f"rank {rank}: {name} timed out")
        hvd.synchronize(h)
        return t0, time.time()

    def clocks(pairs):
        """(start, end) of every repetition on every rank -> per repetition max(end) - max(start)."""
        counter[0] += 1
        mine = torch.tensor(pairs, dtype=torch.float64).reshape(1, -1, 2)
        allp = hvd.allgather(mine, name=f"mc.clock.{counter[0]}")  # (n, reps, 2)
        return (allp[:, :, 1].max(dim=0).values - allp[:, :, 0].max(dim=0).values).tolist()

    for k in range(10):  # warm-up: the first collectives set up gloo's pairs and buffers
        timed("allreduce", torch.ones(16))
        timed("allgather", torch.ones(16))
    cases = []
    for size in sizes_upto(args.max_floats):
        nbytes = 4 * size
        cases += [("allreduce", "all", size, torch.ones(size), nbytes),
                  ("allgather", "all", size, torch.ones(size), (n - 1) * nbytes),
                  ("allgather", "one", size, torch.ones(size if rank == 0 else 0), nbytes)]
    # repetitions round-robin over the cases, so that a burst of load from other jobs on the
    # shared cores hits every size alike instead of all repetitions of one size
    pairs = {i: [] for i in range(len(cases))}
    for r in range(args.reps):
        for i, (kind, _, size, tensor, _) in enumerate(cases):
            if size > (1 << 20) and r >= max(3, args.reps // 2):
                continue  # fewer repetitions above 4 MB (they take the time)
            pairs[i].append(timed(kind, tensor))
    rows = []
    for i, (kind, pattern, size, tensor, received) in enumerate(cases):
        times = clocks(pairs[i])
        rows.append({"n": n, "kind": kind, "pattern": pattern, "floats": size,
                     "bytes": 4 * size, "model_bytes": received,
                     "median": statistics.median(times), "times": times})
        if rank == 0:
            print(f"[measure np={n}] {kind:9s} {pattern:3s} {4 * size:>10d} B: "
                  f"median {statistics.median(times) * 1e3:9.3f} ms over {len(times)}",
                  file=sys.stderr, flush=True)
    # local memory pass: every rank at once (the runtime's ranks share the cores too)
    d = 1 << 24  # 64 MB per vector: beyond the caches, as the runtime's d-float buffers
    x, y = torch.ones(d), torch.ones(d)
    hvd.allreduce(torch.zeros(1), name="mc.barrier.local")
    ts = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        y.add_(x, alpha=0.5)
        ts.append(time.perf_counter() - t0)
    local = hvd.allgather(torch.tensor([[statistics.median(ts)]], dtype=torch.float64),
                          name="mc.local").flatten().tolist()
    if rank == 0:
        print_result({"n": n, "rows": rows,
                      "local": {"floats": d, "bytes_moved": 12 * d,
                                "seconds_per_rank": local}})


# ----------------------------------------------------------------------------- driver
def fit_document(results: list, reps: int, note: str = "") -> dict:
    from pgc_hvd.sim.comm import FIT_FORMAT, fit_network

    fits, everything = {}, {"allreduce": [], "allgather": []}
    for res in results:
        per = {"allreduce": [], "allgather": []}
        for r in res["rows"]:
            sample = (r["n"], r["model_bytes"], r["median"])
            per[r["kind"]].append(sample)
            everything[r["kind"]].append(sample)
        fits[str(res["n"])] = fit_network(per)
    pass_s = [statistics.median(r["local"]["seconds_per_rank"]) / r["local"]["bytes_moved"]
              for r in results]
    return {"format": FIT_FORMAT,
            "command": "python benchmarks/data_plane/measure_collectives.py " + " ".join(sys.argv[1:]),
            "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "statistic": f"median over {reps} repetitions ({max(3, reps // 2)} above 4 MB), "
                         "taken round-robin over the sizes, of max(end) - max(start) over ranks",
            "note": note,
            "fits": fits, "all": fit_network(everything),
            "local": {"pass_beta": statistics.median(pass_s),
                      "what": "seconds per byte read or written, y.add_(x) on every rank at once"},
            "measurements": results}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,3,4", help="comma-separated rank counts")
    p.add_argument("--out", help="JSON to write (format pgc_hvd.comm_fit/1; required)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--max-floats", type=int, default=1 << 22, help="largest size, in float32")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--note", default="", help="free text kept in the JSON (load, machine state)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not args.out:
        p.error("--out is required: the JSON file to write")
    try:
        nps = [int(x) for x in args.np.split(",") if x.strip()]
    except ValueError:
        p.error(f"--np takes comma-separated ints, got {args.np!r}")
    if not nps or min(nps) < 2:
        p.error("--np: every rank count must be >= 2 (a collective of one rank moves nothing)")
    if args.reps < 1 or args.max_floats < 16:
        p.error("--reps must be >= 1 and --max-floats >= 16")
    t0 = time.time()
    results = []
    for np_ in nps:
        print(f"== np={np_}", flush=True)
        results.append(run_ranks(np_, __file__, ["--reps", args.reps, "--max-floats",
                                                 args.max_floats, "--timeout", args.timeout],
                                 args.timeout, on_line=lambda l: print(
                                     "  " + l.split("<stderr>:")[-1], flush=True)
                                 if "[measure " in l else None))
    doc = fit_document(results, args.reps, args.note)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nfitted alpha-beta ({doc['statistic']}; {time.time() - t0:.0f} s):")
    print(f"{'n':>4} {'collective':>10} {'alpha (us)':>11} {'beta (ns/B)':>12} "
          f"{'GB/s':>7} {'rel rms':>8}")
    for key, fit in list(doc["fits"].items()) + [("all", doc["all"])]:
        for kind in ("allreduce", "allgather"):
            f = fit[kind]
            bw = 1e-9 / f["beta"] if f["beta"] > 0 else float("inf")
            print(f"{key:>4} {kind:>10} {f['alpha'] * 1e6:11.1f} {f['beta'] * 1e9:12.4f} "
                  f"{bw:7.2f} {f['rel_rms']:8.2f}")
    print(f"local pass: {doc['local']['pass_beta'] * 1e9:.4f} ns per byte "
          f"({1e-9 / doc['local']['pass_beta']:.1f} GB/s)")
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
