"""Where a pgc_hvd step's time goes, per phase, on each rank.

    python benchmarks/runtime/step_profile.py [--np 4] [--model resnet18] [--schemes dgd,pgc-cr]
                                      [--compute 0.3] [--steps 12] [--poll 0.002]
                                      [--controls allgather,store,log]

For each scheme, one ``horovodrun --gloo`` job trains torchvision's ``--model`` (batch 2 of
32x32 images, plus ``--compute`` seconds of emulated compute per partition) and times, per step
and rank (medians after 3 warm-up steps):

* ``compute``: the user's loop body (sleep, forward, backward; the gradient hooks copy each
  p.grad into its ring slot);
* ``send``: forming the coded message in its payload row (coded accumulation over the ring),
  the finite check, compression if any, handing it to the agent;
* ``wait``: from the message's hand-off until the step's update is ready (control rounds --
  every rank's row by a tiny allgather until the scheme fires -- then the data phase);
* ``data``: the agent's data phase (the rank's weighted contribution, the allreduce or
  allgather, the decode);
* ``apply``: the user's optimizer rule on the decoded update;
* ``rounds``: control rounds per step (``control="log"``: evaluations of the decision body);
* ``ops``: control messages this rank issued per step (the records' ``control_ops``: control
  allgathers, or store operations for ``control="store"`` / ``"log"``), mean after warm-up;
* ``step``: the whole loop iteration (compute + send + wait + apply).

``--controls`` runs each scheme once per control channel.
"""

from __future__ import annotations

import argparse
import sys
import time

from pgc_hvd.apps.local_ranks import print_result, run_ranks
from runtime_bench import build_loader, build_model


def worker(args) -> None:
    import horovod.torch as hvd
    import numpy as np
    import torch
    import torch.nn.functional as F

    import pgc_hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    loader = build_loader(args.model, n)
    scheme = args.scheme
    m = build_model(args.model)
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters(), scheme=scheme,
        timeout=300, poll_interval=args.poll, control=args.control,
        name=f"prof-{scheme}-{args.control}")
    T = {k: [] for k in ("compute", "send", "wait", "data", "apply", "rounds", "ops", "step")}
    # what the runtime reports of each step, on every rank: the step's wait for its decision
    # (Step.wait_seconds), and the decided update's info (the agent's data phase, the control
    # rounds and messages so far)
    sync = []
    while opt.version < args.steps:
        t0 = time.perf_counter()
        for xb, yb in opt.batches(loader):
            time.sleep(args.compute)
            F.cross_entropy(m(xb), yb).backward()
        t1 = time.perf_counter()
        T["compute"].append(t1 - t0)
        opt.synchronize()          # send (form, check, encode, hand off) + wait
        t2 = time.perf_counter()
        sync.append(t2 - t1)
        step = opt.current_step
        info = step.last.info
        T["wait"].append(step.wait_seconds)
        T["data"].append(info["data_seconds"])
        T["rounds"].append(info["control_rounds"])
        T["ops"].append(info.get("control_ops") or 0)
        with opt.skip_synchronize():
            opt.step()             # apply: the user's rule on the decoded update
        T["apply"].append(time.perf_counter() - t2)
        T["step"].append(time.perf_counter() - t0)
    # send = synchronize() minus the wait for the decision (a catch-up step waits only)
    T["send"] = [max(0.0, s - w) for s, w in zip(sync, T["wait"])]
    opt.close()
    med = {k: float(np.median(v[3:])) * 1e3 for k, v in T.items()
           if k not in ("rounds", "ops") and v[3:]}
    med["rounds"] = float(np.diff(T["rounds"])[3:].mean())
    med["ops"] = float(np.mean(T["ops"][3:]))
    allv = hvd.allgather(torch.tensor([[med[k] for k in sorted(med)]], dtype=torch.float64),
                         name="prof.gather")
    if rank == 0:
        print_result({"scheme": scheme, "control": args.control, "n": n,
                      "keys": sorted(med),
                      "ranks": allv.tolist()})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--schemes", default="dgd,pgc-cr")
    p.add_argument("--compute", type=float, default=0.3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--poll", type=float, default=0.002)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--controls", default="allgather",
                   help="comma-separated control channels: allgather, store, log")
    p.add_argument("--control", default="allgather", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scheme", default="dgd", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    print(f"Step profile, np={args.np}, {args.model}, compute {args.compute * 1e3:.0f} ms, poll "
          f"{args.poll * 1e3:.0f} ms: medians per rank, ms (rounds: control rounds per step)")
    order = ["compute", "send", "wait", "data", "apply", "step", "rounds", "ops"]
    for sch in args.schemes.split(","):
        for ctl in args.controls.split(","):
            r = run_ranks(args.np, __file__, ["--scheme", sch, "--model", args.model,
                                              "--compute", args.compute, "--steps", args.steps,
                                              "--poll", args.poll, "--control", ctl],
                          args.timeout)
            keys = r["keys"]
            print(f"\n{sch} control={ctl}:  " + "  ".join(f"{k:>8}" for k in ["rank"] + order))
            for rk, row in enumerate(r["ranks"]):
                v = dict(zip(keys, row))
                print("      " + "  ".join([f"{rk:>8}"] + [f"{v[k]:8.1f}" for k in order]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
