"""The simulator's collective model against the Horovod runtime: time per step, same delays.

    python benchmarks/data_plane/measure_collectives.py --np 2,3,4 --out runs/comm_fit.json
    python benchmarks/runtime/sim_vs_runtime.py --comm runs/comm_fit.json [--np 2,3,4] [--d 1000000]
        [--schemes dgd,pgc-cr] [--compute 0.2] [--delay exp:mean=0.2,seed=1] [--steps 20]
        [--plane auto] [--control allgather|log] [--log-fit PATH] [--runtime-commit HEAD]
        [--json out.json]

For each n it launches ``horovodrun --gloo -np N -H localhost:N``; every rank trains a model of
``--d`` parameters (one ``nn.Linear``) with ``pgc_hvd.DistributedOptimizer`` under each scheme
(s = 1; DGD s = 0), an emulated compute of ``--compute`` seconds per partition (a sleep, as a
GPU's forward/backward leaves the CPU free) plus the real forward/backward, and the injected
delays ``--delay`` (sampled per (rank, step), so the simulator sees the same trace). The
runtime's time per step is (time of the last update - time of update ``warmup - 1``) /
(steps - warmup) on rank 0; every partition's wall time is measured on every rank, and their
mean is the simulator's ``partition_time`` (an input, not a prediction).

The simulator (:class:`pgc_hvd.sim.timing.TimingSimulator`, the engine without gradients) then
runs the same scheme, n, d, steps, delays and straggler policy under the collective model
fitted from ``--comm`` (``fitted:PATH``), with the data plane of the runtime that ran: ``auto``
reads it from the runtime (``allgather`` for a runtime whose optimistic steps are one allgather, ``allreduce`` for
one with the allreduce data plane), or name
one. ``--control`` is the runtime's control path, and the simulator's: ``allgather`` (polled
rounds, the default) or ``log`` (the ordered control log; the simulator prices it with the
costs of ``--log-fit``, measured by ``benchmarks/control/measure_log_control.py``, default
``docs/figures/log_control_fit.json``). It prints both figures, their ratio, and bytes, control
rounds and control operations per step (rank 0's records) from both sides. Target: within 15 %, for both control paths.

``--runtime-commit C`` runs the runtime of commit C (``git archive`` into a temporary folder,
with this checkout's compiled extension) instead of the working tree's, e.g. while the working
tree's runtime is being rewritten.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _use_runtime_root() -> None:
    """Import pgc_hvd from $PGC_RUNTIME_ROOT (a git archive) instead of the editable install."""
    root = os.environ.get("PGC_RUNTIME_ROOT")
    if not root:
        return
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()
                        and "editable" not in type(f).__module__.lower()]
    sys.path.insert(0, root)


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    _use_runtime_root()
    import horovod.torch as hvd
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import pgc_hvd
    from pgc_hvd.runtime import PartitionLoader

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    k = max(2, int(round(args.d ** 0.5)))
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n * 64, k, generator=g)
    y = torch.randint(0, k, (n * 64,), generator=g)
    loader = PartitionLoader(X, y, n, batch_size=16, seed=0)
    steps, warm = args.steps, args.warmup
    out = {"n": n, "d": k * k + k, "compute": args.compute, "delay": args.delay, "steps": steps,
           "warmup": warm, "pgc_hvd": str(Path(pgc_hvd.__file__).parent), "runs": {}}
    for scheme in args.schemes.split(","):
        torch.manual_seed(1)
        m = nn.Linear(k, k)
        decided, recs, parts = {}, {}, []

        def on_record(r):
            decided[r.step] = time.time()
            recs[r.step] = r

        kw = {}
        if args.optimistic != "auto":
            kw["optimistic"] = args.optimistic == "on"
        if args.control != "allgather":   # (a runtime before control= existed takes none)
            kw["control"] = args.control
        opt = pgc_hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters(), scheme=scheme,
            delay=args.delay,
            name=f"svr-{scheme}", straggler_policy=args.policy, on_record=on_record, **kw)
        hvd.allreduce(torch.zeros(1), name=f"svr.barrier.{scheme}")
        while opt.version < steps:
            for xb, yb in opt.batches(loader):
                t0 = time.perf_counter()
                time.sleep(args.compute)
                F.cross_entropy(m(xb), yb).backward()
                parts.append(time.perf_counter() - t0)
            opt.step()
        agent = opt.agent
        if hasattr(agent, "codec"):   # a runtime with pgc_hvd.compress codecs
            plane = "allreduce"
        else:                         # before it: optimistic payloads, or two-phase allgather
            plane = "allgather" if getattr(agent, "optimistic", False) else "allgather-2phase"
        opt.close()
        mine = torch.tensor([[sum(parts) / max(1, len(parts)), len(parts)]], dtype=torch.float64)
        allp = hvd.allgather(mine, name=f"svr.parts.{scheme}")
        if rank == 0:
            tps = (decided[steps - 1] - decided[warm - 1]) / (steps - warm)
            info = [recs[t] for t in range(warm, steps)]
            ex = lambda r, key: (r.extra or {}).get(key)  # noqa: E731
            out["runs"][scheme] = {
                "time_per_step": tps, "plane": str(plane),
                "partition_time": float((allp[:, 0] * allp[:, 1]).sum() / allp[:, 1].sum()),
                "bytes_per_step": (sum(r.bytes or 0 for r in info) / len(info)),
                "control_rounds_per_step": (
                    (ex(info[-1], "control_rounds") - ex(recs[warm - 1], "control_rounds"))
                    / len(info) if ex(info[-1], "control_rounds") is not None else None),
                "control_ops_per_step": (
                    sum(ex(r, "control_ops") for r in info) / len(info)
                    if all(ex(r, "control_ops") is not None for r in info) else None),
            }
            print(f"[svr np={n}] {scheme}: {tps * 1e3:.1f} ms/step (plane {plane})",
                  file=sys.stderr, flush=True)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- simulator side
def simulate(res: dict, scheme: str, comm_path: str, plane: str, policy: str,
             control: str = "allgather", log_fit: str | None = None) -> dict:
    from pgc_hvd.schemes import default_stragglers, get_scheme
    from pgc_hvd.sim.comm import load_fit
    from pgc_hvd.sim.engine import SimConfig
    from pgc_hvd.sim.log_costs import load_log_fit
    from pgc_hvd.sim.timing import TimingSimulator, time_per_step

    run = res["runs"][scheme]
    n = res["n"]
    kw = {} if control == "allgather" else {"control": control, "log": load_log_fit(log_fit)}
    cm = load_fit(comm_path, plane=plane, **kw)
    cfg = SimConfig(steps=res["steps"], delay=res["delay"], partition_time=run["partition_time"],
                    comm=cm, straggler_policy=policy, diagnostics=False, eval_every=0)
    sim = TimingSimulator(get_scheme(scheme, n, default_stragglers(scheme, n)), res["d"], cfg)
    recs = sim.run()
    w = res["warmup"]
    meas = recs[w:]
    return {"time_per_step": time_per_step(recs, w), "plane": plane,
            "bytes_per_step": sum(r.bytes for r in meas) / len(meas),
            "control_rounds_per_step": sum(r.extra["control_rounds"] for r in meas) / len(meas),
            # the polled path issues one control allgather per round
            "control_ops_per_step": sum(r.extra.get("control_ops", r.extra["control_rounds"])
                                        for r in meas) / len(meas)}


def archive_runtime(commit: str) -> str:
    """``git archive COMMIT pgc_hvd`` into a fresh temporary folder, with the compiled
    extension of this checkout's install; returns the folder."""
    tmp = tempfile.mkdtemp(prefix="pgc_svr_")
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "pgc_hvd"],
                         check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
    import pgc_hvd._C as ext
    for so in glob.glob(str(Path(ext.__file__).parent / "_C*.so")):
        shutil.copy(so, Path(tmp) / "pgc_hvd")
    return tmp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--comm", help="fitted comm model JSON (benchmarks/data_plane/measure_collectives.py)")
    p.add_argument("--np", default="2,3,4")
    p.add_argument("--d", type=int, default=1_000_000, help="model parameters (one nn.Linear)")
    p.add_argument("--schemes", default="dgd,pgc-cr")
    p.add_argument("--compute", type=float, default=0.2, help="emulated seconds per partition")
    p.add_argument("--delay", default="exp:mean=0.2,seed=1")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--policy", default="continue", choices=["continue", "cancel"])
    p.add_argument("--optimistic", default="auto", choices=["auto", "on", "off"],
                   help="the runtime's optimistic argument (auto: its default)")
    p.add_argument("--plane", default="auto",
                   help="the simulator's data plane: auto (the runtime's), allgather, "
                        "allgather-2phase, allreduce")
    p.add_argument("--control", default="allgather", choices=["allgather", "log"],
                   help="the runtime's control path, and the simulator's")
    p.add_argument("--log-fit", default=str(ROOT / "docs" / "figures" / "log_control_fit.json"),
                   help="control=log: costs measured by benchmarks/control/measure_log_control.py")
    p.add_argument("--runtime-commit", default=None,
                   help="run the runtime of this commit (git archive) instead of the working tree")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not args.comm:
        p.error("--comm PATH is required (measure it: python benchmarks/data_plane/measure_collectives.py "
                "--np 2,3,4 --out runs/comm_fit.json)")
    if args.warmup < 1 or args.steps <= args.warmup:
        p.error("need 1 <= --warmup < --steps")
    from pgc_hvd.sim.comm import load_fit
    load_fit(args.comm)  # fail before launching anything
    if args.control == "log":
        from pgc_hvd.sim.log_costs import load_log_fit
        load_log_fit(args.log_fit)
    env_root = None
    if args.runtime_commit:
        env_root = archive_runtime(args.runtime_commit)
        os.environ["PGC_RUNTIME_ROOT"] = env_root
    t0 = time.time()
    rows = []
    try:
        for np_ in [int(x) for x in args.np.split(",")]:
            print(f"== np={np_}", flush=True)
            # imported here, not at the top: a worker must import pgc_hvd only after
            # _use_runtime_root() chose which one
            from pgc_hvd.apps.local_ranks import run_ranks
            res = run_ranks(np_, __file__, [
                "--d", args.d, "--schemes", args.schemes, "--compute", args.compute,
                "--delay", args.delay, "--steps", args.steps, "--warmup", args.warmup,
                "--policy", args.policy, "--optimistic", args.optimistic,
                "--control", args.control],
                args.timeout, on_line=lambda l: print("  " + l.split("<stderr>:")[-1], flush=True)
                if "[svr " in l else None)
            for scheme, run in res["runs"].items():
                plane = run["plane"] if args.plane == "auto" else args.plane
                sim = simulate(res, scheme, args.comm, plane, args.policy, args.control,
                               args.log_fit)
                rows.append({"n": np_, "scheme": scheme, "d": res["d"], "runtime": run,
                             "sim": sim, "ratio": sim["time_per_step"] / run["time_per_step"]})
    finally:
        if env_root:
            shutil.rmtree(env_root, ignore_errors=True)
    print(f"\nsimulator vs runtime ({args.comm}; d = {rows[0]['d']:,}, compute {args.compute} s "
          f"per partition + measured forward/backward, delays {args.delay}, policy "
          f"{args.policy}, control {args.control}, steps {args.steps}, warm-up {args.warmup}; "
          f"{time.time() - t0:.0f} s"
          f"{', runtime of ' + args.runtime_commit if args.runtime_commit else ''})")
    print(f"{'n':>3} {'scheme':>8} {'plane':>16} {'runtime ms':>10} {'sim ms':>8} {'sim/rt':>7}"
          f" {'rt MB/step':>10} {'sim MB/step':>11} {'rt rounds':>9} {'sim rounds':>10}"
          f" {'rt ops':>6} {'sim ops':>7}")
    for r in rows:
        rt, sm = r["runtime"], r["sim"]
        rr = rt["control_rounds_per_step"]
        ro, so = rt.get("control_ops_per_step"), sm.get("control_ops_per_step")
        print(f"{r['n']:>3} {r['scheme']:>8} {sm['plane']:>16} {rt['time_per_step'] * 1e3:10.1f} "
              f"{sm['time_per_step'] * 1e3:8.1f} {r['ratio']:7.3f} "
              f"{rt['bytes_per_step'] / 1e6:10.2f} {sm['bytes_per_step'] / 1e6:11.2f} "
              f"{'-' if rr is None else f'{rr:.1f}':>9} {sm['control_rounds_per_step']:10.1f}"
              f" {'-' if ro is None else f'{ro:.1f}':>6} {'-' if so is None else f'{so:.1f}':>7}")
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"largest |sim/runtime - 1| = {worst:.3f} (target <= 0.15)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
