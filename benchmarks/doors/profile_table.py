"""Where the DDP door's training thread spends a step, per function, from cProfile files of
``step_cost.py`` on one rank (no peer to wait for), side by side (e.g. two trees):

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 1 -m cProfile -o dgd.prof \
        benchmarks/doors/step_cost.py --doors dgd --steps 300
    python benchmarks/doors/profile_table.py before=main_dgd.prof after=dgd.prof [--steps 310]

Prints, for each function of the step's path on the training thread (the facade, the step,
the capture, the handoff to the agent and the wait for it, the user's SGD), its cumulative
microseconds per step (cProfile's cumtime over ``--steps``, warm-up included: 300 + 10), and
the process's total per step. cProfile adds about a microsecond a call and sees the training
thread only (the agent thread's work shows as the wait in ``wait_for``); compare columns of
the same kind of run, not with the wall times of ``step_cost.py --profile``.
"""

from __future__ import annotations

import argparse
import pstats

#: (label, file suffix, function name): the step's path on the training thread, in call order
ROWS = [
    ("forward (the door's)", "runtime/ddp.py", "forward"),
    ("  begin_loop_step", "runtime/optimizer.py", "begin_loop_step"),
    ("step() (the facade)", "runtime/optimizer.py", "step"),
    ("  synchronize", "runtime/optimizer.py", "synchronize"),
    ("    Step.exchange", "runtime/step.py", "exchange"),
    ("      Step.send", "runtime/step.py", "send"),
    ("        GradientCapture.end", "runtime/capture.py", "end"),
    ("        CommAgent.submit (handoff)", "runtime/agent.py", "submit"),
    ("      CommAgent.wait_for (the agent's work)", "runtime/agent.py", "wait_for"),
    ("    Step.load", "runtime/step.py", "load"),
    ("  Step.apply", "runtime/step.py", "apply"),
    ("    SGD.step (the user's rule)", "torch/optim/sgd.py", "step"),
    ("    Step.applied", "runtime/step.py", "applied"),
    ("      hyper_digest", "runtime/step.py", "hyper_digest"),
]


def per_step(stats: pstats.Stats, suffix: str, name: str, steps: int):
    """Cumulative microseconds per step of the function (the outermost of the functions of
    that name in that file: ``CommAgent.submit`` calls ``Handoff.submit``)."""
    got = [ct for (path, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()
           if func == name and path.endswith(suffix)]
    return 1e6 * max(got) / steps if got else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="label=path.prof")
    p.add_argument("--steps", type=int, default=310, help="steps in each run (warm-up too)")
    args = p.parse_args()
    runs = [(f.split("=", 1)[0], pstats.Stats(f.split("=", 1)[1])) for f in args.files]
    print("| function (training thread) | " + " | ".join(f"{lab} us/step" for lab, _ in runs)
          + " |")
    print("|---|" + "---|" * len(runs))
    for label, suffix, name in ROWS:
        vals = [per_step(st, suffix, name, args.steps) for _, st in runs]
        print(f"| {label} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in vals)
              + " |")


if __name__ == "__main__":
    main()
