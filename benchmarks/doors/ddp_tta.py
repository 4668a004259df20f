"""Time to a validation accuracy: pgc_hvd's DDP door against torch's DDP, under torchrun.

    .venv/bin/python benchmarks/doors/ddp_tta.py [--np 4] [--seeds 0,1,2]
        [--patterns none,exp,slow,pareto] [--doors ddp,pgc-cr] [--compute 0.05]
        [--target 0.9] [--max-steps 400] [--json out.json]

One torchrun launch per (door, pattern, seed), every rank running the DDP tutorial's loop
(``launch/ddp_tutorial.py``'s shape: a ``DataLoader`` with ``DistributedSampler`` or
``pgc_hvd.CodedSampler``, ``loss.backward()``, ``optimizer.step()``) on scikit-learn's digits
(1440 training images, 357 for validation, a small CNN), SGD lr 0.05 momentum 0.9, batch 32.
Each batch costs ``--compute`` seconds of emulated accelerator compute (a sleep: the CPU is
free, as under a GPU) plus the straggler pattern's delay for (rank, step), the same seeded
schedule for both doors; ``--patterns`` names patterns of :data:`pgc_hvd.delays.PATTERNS`
(:func:`pgc_hvd.delays.pattern_spec` with the run's seed), e.g.:

* ``none``: no delay;
* ``exp``: Exp(mean = compute) on every rank and step;
* ``slow`` (``slow-rank``): rank seed % np 4x slow (3 compute more every step; the figures of
  2026-12-06 were measured with the last rank slow at every seed);
* ``pareto`` (``heavy-tail``): heavy-tailed per-batch cost, Pareto (Lomax) shape 2.5 with mean =
  compute;
* ``two-class``, ``transient`` (over ``--max-steps``), ``lognormal``.

Every ``--eval-every`` steps rank 0's clock stops, every rank evaluates the validation set (its
shard; ``dist.all_reduce`` of the counts) and the clock resumes: evaluation is not timed. A run
stops at the first evaluation at or above ``--target`` (or at ``--max-steps``). Door
``pgc-cr`` (or any scheme name, ``pgc-cr@1`` for s = 1, ``+overlap`` / ``+serial`` for overlap=True / False)
is ``pgc_hvd.DistributedDataParallel``;
``lightning:ddp`` and ``lightning:pgc-cr`` run the same model as a LightningModule under
``Trainer(strategy="ddp")`` and ``PGCStrategy(scheme="pgc-cr")`` (a callback sleeps the compute
and delay before each batch and evaluates with the clock stopped). Prints per (pattern, door)
the median over seeds of s/step, steps and seconds to the target, and the ratio to the seconds
of the same pattern and seed under DDP (Lightning's doors: under ``strategy="ddp"``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, read_result
from pgc_hvd.delays import pattern_spec

ROOT = Path(__file__).resolve().parents[2]


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import pgc_hvd
    from pgc_hvd.delays import parse_delay

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(1234)
    order = torch.randperm(len(y), generator=g)
    X, y = X[order], y[order]
    train, val = TensorDataset(X[:1440], y[:1440]), TensorDataset(X[1440:], y[1440:])
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))
    sgd = dict(lr=0.05, momentum=0.9)
    delays = parse_delay(args.delay)
    if args.door.startswith("lightning:"):
        return lightning_main(args, model, train, val, sgd, delays, rank, n)
    if args.door == "ddp":
        sampler = DistributedSampler(train, seed=args.seed)
        model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), **sgd)
    else:
        door, _, how = args.door.partition("+")     # pgc-cr+overlap / pgc-cr+serial
        scheme, _, s = door.partition("@")
        sampler = pgc_hvd.CodedSampler(train, batch_size=32, seed=args.seed)
        model = pgc_hvd.DistributedDataParallel(model, scheme=scheme,
                                                stragglers=int(s) if s else None, timeout=120,
                                                overlap={"overlap": True, "serial": False}.get(how))
        opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), **sgd))
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val, batch_size=128, sampler=DistributedSampler(val, shuffle=False))

    def evaluate() -> float:
        model.eval()
        tot = torch.zeros(2)
        with torch.no_grad():
            for xb, yb in val_loader:
                tot += torch.tensor([(model(xb).argmax(1) == yb).sum().item(), len(yb)])
        dist.all_reduce(tot)
        model.train()
        return float(tot[0] / tot[1])

    step, trained, hit, acc = 0, 0.0, None, 0.0
    epoch = 0
    t0 = time.monotonic()
    while hit is None and step < args.max_steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            time.sleep(args.compute + float(delays.sample(rank, step)))
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            step += 1
            if step % args.eval_every == 0 or step >= args.max_steps:
                trained += time.monotonic() - t0
                acc = evaluate()
                if acc >= args.target and hit is None:
                    hit = (step, trained)
                t0 = time.monotonic()
                if hit is not None or step >= args.max_steps:
                    break
        epoch += 1
    if hasattr(opt, "close"):
        opt.close()
    if rank == 0:
        print_result({
            "door": args.door, "delay": args.delay, "seed": args.seed, "n": n,
            "steps": step, "seconds": trained, "s_per_step": trained / step,
            "steps_to_target": hit[0] if hit else None,
            "seconds_to_target": hit[1] if hit else None, "final_acc": acc})
    dist.barrier()


def lightning_main(args, net, train, val, sgd, delays, rank: int, n: int) -> None:
    """The same run as a LightningModule under ``Trainer(strategy="ddp")`` or ``PGCStrategy``:
    a callback sleeps the compute and delay before each batch, another evaluates every
    ``eval_every`` steps with the clock stopped (every rank the whole validation set: the
    parameters are the same, so every rank stops at the same step)."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import pgc_hvd.lightning

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), **sgd)

    Xv, yv = val.tensors
    clock = {"trained": 0.0, "t0": None, "hit": None, "acc": 0.0, "step": 0}

    class Run(L.Callback):
        def on_train_start(self, trainer, module):
            clock["t0"] = time.monotonic()

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            time.sleep(args.compute + float(delays.sample(rank, trainer.global_step)))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = clock["step"] = trainer.global_step
            if step % args.eval_every and step < args.max_steps:
                return
            clock["trained"] += time.monotonic() - clock["t0"]
            module.eval()
            with torch.no_grad():
                clock["acc"] = float((module(Xv).argmax(1) == yv).float().mean())
            module.train()
            if clock["acc"] >= args.target and clock["hit"] is None:
                clock["hit"] = (step, clock["trained"])
                trainer.should_stop = True
            clock["t0"] = time.monotonic()

    which = args.door.split(":", 1)[1]
    if which == "ddp":
        strategy = "ddp"
    else:
        scheme, _, s = which.partition("@")
        strategy = pgc_hvd.lightning.PGCStrategy(scheme=scheme, stragglers=int(s) if s else None,
                                                 timeout=120)
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=n, max_steps=args.max_steps,
                        callbacks=[Run()], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(Module(), DataLoader(train, batch_size=32, shuffle=True))
    hit, step = clock["hit"], clock["step"]
    if rank == 0:
        print("RESULT " + json.dumps({
            "door": args.door, "delay": args.delay, "seed": args.seed, "n": n, "steps": step,
            "seconds": clock["trained"], "s_per_step": clock["trained"] / max(step, 1),
            "steps_to_target": hit[0] if hit else None,
            "seconds_to_target": hit[1] if hit else None, "final_acc": clock["acc"]}),
            flush=True)


def launch(args, door: str, pattern: str, seed: int) -> dict:
    spec = pattern_spec(pattern, args.np, args.compute, args.max_steps, seed)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.np), __file__, "--rank-main", "--door", door, "--delay", spec,
           "--seed", str(seed), "--compute", str(args.compute), "--target", str(args.target),
           "--eval-every", str(args.eval_every), "--max-steps", str(args.max_steps)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
    out = read_result(proc.stdout)
    if proc.returncode or out is None:
        raise SystemExit(f"{door} {pattern} seed {seed} failed:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    out["pattern"] = pattern
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--door", default="ddp")
    p.add_argument("--delay", default="none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--patterns", default="none,exp,slow,pareto")
    p.add_argument("--doors", default="ddp,pgc-cr")
    p.add_argument("--compute", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rank_main:
        rank_main(args)
        return 0
    for pattern in args.patterns.split(","):        # refuse an unknown pattern at once
        try:
            pattern_spec(pattern, args.np, args.compute, args.max_steps)
        except ValueError as err:
            p.error(f"--patterns: {err}")
    t_all = time.monotonic()
    rows = []
    for pattern in args.patterns.split(","):
        for seed in [int(x) for x in args.seeds.split(",")]:
            for door in args.doors.split(","):
                r = launch(args, door, pattern, seed)
                rows.append(r)
                print(f"# {pattern} seed {seed} {door}: {r['s_per_step']:.3f} s/step, "
                      f"target at step {r['steps_to_target']} after {r['seconds_to_target']} s",
                      flush=True)
    print(f"\n{args.np} ranks, compute {args.compute} s a batch, target {args.target}, "
          f"seeds {args.seeds} ({time.monotonic() - t_all:.0f} s)\n")
    print("| pattern | door | s/step | steps to target | s to target | s to target / DDP, "
          "each seed |")
    print("|---|---|---|---|---|---|")
    for pattern in args.patterns.split(","):
        def base_of(door):     # Lightning's doors against strategy="ddp", the others DDP
            ref = "lightning:ddp" if door.startswith("lightning:") else "ddp"
            return {r["seed"]: r["seconds_to_target"] for r in rows
                    if r["pattern"] == pattern and r["door"] == ref}
        for door in args.doors.split(","):
            mine = [r for r in rows if r["pattern"] == pattern and r["door"] == door]
            med = lambda k: statistics.median(r[k] for r in mine if r[k] is not None) \
                if any(r[k] is not None for r in mine) else float("nan")
            base = base_of(door)
            ratios = [f"{r['seconds_to_target'] / base[r['seed']]:.2f}"
                      if r["seconds_to_target"] and base.get(r["seed"]) else "-" for r in mine]
            print(f"| {pattern} | {door} | {med('s_per_step'):.3f} | {med('steps_to_target'):.0f} "
                  f"| {med('seconds_to_target'):.1f} | {', '.join(ratios)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
