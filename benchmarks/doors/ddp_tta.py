"""Time to a validation accuracy: pgc_hvd's DDP door against torch's DDP, under torchrun.

    .venv/bin/python benchmarks/doors/ddp_tta.py [--np 4] [--seeds 0,1,2]
        [--patterns none,exp,slow,pareto] [--doors ddp,pgc-cr] [--compute 0.05]
        [--target 0.9] [--max-steps 400] [--workload digits|lenet28] [--json out.json]

One torchrun launch per (door, pattern, seed), every rank running the DDP tutorial's loop
(``launch/ddp_tutorial.py``'s shape: a ``DataLoader`` with ``DistributedSampler`` or
``pgc_hvd.CodedSampler``, ``loss.backward()``, ``optimizer.step()``), batch 32, on one of:

* ``digits``: scikit-learn's digits (1440 training images, 357 for validation), a small CNN
  (d = 12,730), SGD lr 0.05 momentum 0.9;
* ``lenet28``: the issue's held-out shape, LeNet-5 (d = 61,706) on 28x28 images: the digits
  scaled to 20x20 on a 28x28 canvas, 9,600 training images drawn from the 1440 at random
  offsets, the 357 centred for validation (:func:`digits28`), SGD lr 0.03 momentum 0.9.

Each training forward costs ``--compute`` seconds of emulated accelerator compute plus the
straggler pattern's delay for (rank, step), slept inside the model (:func:`emulated`: the CPU
stays free, as under a GPU; a rank of the door that catches up runs no model and so spends
none of it, as in ``pgc_hvd.apps.tta``), the same seeded schedule for every door;
``--patterns`` names patterns of :data:`pgc_hvd.delays.PATTERNS`
(:func:`pgc_hvd.delays.pattern_spec` with the run's seed), e.g.:

* ``none``: no delay;
* ``exp``: Exp(mean = compute) on every rank and step;
* ``slow`` (``slow-rank``): rank seed % np 4x slow (3 compute more every step; the figures of
  2026-12-06 were measured with the last rank slow at every seed);
* ``pareto`` (``heavy-tail``): heavy-tailed per-batch cost, Pareto (Lomax) shape 2.5 with mean =
  compute;
* ``two-class``, ``transient`` (over ``--max-steps``), ``lognormal``.

Every ``--eval-every`` steps the clock stops, every rank evaluates the validation set (its
shard; ``dist.all_reduce`` of the counts) and the clock resumes: evaluation is not timed, and
the interval counts as its slowest rank's time (an ``all_reduce`` of the ranks' times, MAX: a
rank ahead waits for the others in the evaluation's collective; before 2026-12-07 the
benchmark counted rank 0's time and slept the compute in the loop, where a catching-up rank
spends it too, so with one slow rank the door measured DDP's time when the slow rank was rank
0 and hid the slow rank's lag in the evaluation's wait otherwise). A run stops at the first
evaluation at or above ``--target`` (or at ``--max-steps``). That pause drains every rank's
step in flight every ``--eval-every`` steps, which a run that validates once an epoch does not
pay, and which costs a scheme that leaves ranks out a late rank's whole step at each pause
(``benchmarks/doors/step_timeline.py`` under exponential delays: the door's period at s = 2 is
0.67x DDP's, its s/step here 0.76x). ``--eval snapshots`` measures without it: every rank runs
``--max-steps`` steps without a pause, rank 0 keeps the parameters every ``--eval-every``
steps, every rank notes when each update reached it, and afterwards rank 0 evaluates the
copies; the target's time is when its update first existed on any rank (the parameters are the
same on every rank), from the common start (:func:`snapshots_run`). Door ``pgc-cr`` (or any scheme
name, ``pgc-cr@1`` for s = 1, ``pgc-cr@auto`` for ``stragglers="auto"``, ``+overlap`` /
``+serial`` for overlap=True / False) is ``pgc_hvd.DistributedDataParallel``; ``ddp+buckets``
is torch's DDP with 0.05 MB buckets: the same batches and update as ``ddp``, summed in
another order, so its ratio to ``ddp`` is what float rounding alone does to the time to
target (the door at s = 0 is DDP's update too, with its batches: ``CodedSampler`` deals them
as ``DistributedSampler``);
``lightning:ddp`` and ``lightning:pgc-cr`` run the same model as a LightningModule under
``Trainer(strategy="ddp")`` and ``PGCStrategy(scheme="pgc-cr")`` (a callback evaluates with
the clock stopped, timed as above). Prints per (pattern, door)
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
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from pgc_hvd.delays import parse_delay

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    train, val = workload_data(args.workload)
    if args.workload == "lenet28":
        from step_cost import lenet
        model, sgd = lenet(), dict(lr=0.03, momentum=0.9)
    else:
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))
        sgd = dict(lr=0.05, momentum=0.9)
    model = emu = emulated(model, args.compute, parse_delay(args.delay), rank)
    if args.door.startswith("lightning:"):
        return lightning_main(args, model, train, val, sgd, rank, n)
    model, opt, sampler = make_door(args.door, model, train, sgd, args.seed)
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

    if args.eval == "snapshots":
        step, trained, hit, acc = snapshots_run(args, model, emu, opt, loader, sampler, val,
                                                rank, n)
    else:
        step, trained, hit, acc = synced_run(args, model, emu, opt, loader, sampler, evaluate)
    auto = getattr(opt, "auto_stragglers", None)    # stragglers="auto": where it ran, why
    auto = auto.summary() if auto is not None else None
    if hasattr(opt, "close"):
        opt.close()
    if rank == 0:
        print_result({
            "door": args.door, "delay": args.delay, "seed": args.seed, "n": n,
            "eval": args.eval, "steps": step, "seconds": trained, "s_per_step": trained / step,
            "steps_to_target": hit[0] if hit else None,
            "seconds_to_target": hit[1] if hit else None, "final_acc": acc,
            **({"auto": auto} if auto else {})})
    dist.barrier()
    # gloo's teardown can abort a rank after its RESULT ("terminate called without an active
    # exception": with ddp+buckets, and with plain DDP after destroy_process_group, 2026-12-07),
    # which failed a whole launch of many seeds; the result is out and every rank is past the
    # barrier, so the process ends without tearing down
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def make_door(door: str, model, train, sgd: dict, seed: int) -> tuple:
    """``(model, optimizer, sampler)`` of a plain-loop door (module doc) around ``model``:
    ``ddp`` / ``ddp+buckets`` torch's DDP with ``DistributedSampler``, else the DDP door
    ``SCHEME[@s][+overlap|+serial]`` with ``CodedSampler``; SGD with ``sgd``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data.distributed import DistributedSampler

    import pgc_hvd

    if door in ("ddp", "ddp+buckets"):
        # ddp+buckets: the same run but for the sums' rounding (five buckets at LeNet-5's
        # size: another order of the ring's additions), the floor of what a ratio can resolve
        model = DDP(model, bucket_cap_mb=0.05 if door == "ddp+buckets" else 25)
        return (model, torch.optim.SGD(model.parameters(), **sgd),
                DistributedSampler(train, seed=seed))
    door, _, how = door.partition("+")     # pgc-cr+overlap / pgc-cr+serial
    scheme, _, s = door.partition("@")
    model = pgc_hvd.DistributedDataParallel(model, scheme=scheme, stragglers=stragglers(s),
                                            timeout=120,
                                            overlap={"overlap": True, "serial": False}.get(how))
    return (model, model.distributed_optimizer(torch.optim.SGD(model.parameters(), **sgd)),
            pgc_hvd.CodedSampler(train, batch_size=32, seed=seed))


def train_steps(model, emu, opt, loader, sampler):
    """The DDP tutorial's loop, epoch after epoch (``sampler.set_epoch``): one training step
    per item, yielding the steps done so far; ``emu.step`` set before each batch."""
    import torch.nn.functional as F

    step, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            emu.step = step
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            step += 1
            yield step
        epoch += 1


def snapshots_run(args, model, emu, opt, loader, sampler, val, rank: int, n: int):
    """``--eval snapshots``: ``--max-steps`` steps without a pause; every ``--eval-every``
    steps rank 0 keeps a copy of the parameters, and every rank notes when each update reached
    it; afterwards rank 0 evaluates the copies (the whole validation set) and the target's
    time is the first rank's arrival of the first update at or above it, from the start.
    Nothing synchronises the ranks between steps, as in a run that validates once an epoch
    (``synced_run``'s pauses drain every rank's step in flight every ``--eval-every`` steps)."""
    import torch
    import torch.distributed as dist
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    net = emu.net
    copies, arrived = [], []
    dist.barrier()
    start = time.time()
    for step in train_steps(model, emu, opt, loader, sampler):
        arrived.append(time.time() - start)
        if rank == 0 and step % args.eval_every == 0:
            copies.append((step, parameters_to_vector(net.parameters()).detach().clone()))
        if step >= args.max_steps:
            break
    every = [None] * n
    dist.all_gather_object(every, arrived)
    first = [min(col) for col in zip(*every)]       # when update k + 1 first existed
    hit, acc = None, 0.0
    if rank == 0:
        final = parameters_to_vector(net.parameters()).detach().clone()
        net.eval()
        X, y = val.tensors
        with torch.no_grad():
            for k, vec in copies:
                vector_to_parameters(vec, net.parameters())
                acc = float((net(X).argmax(1) == y).float().mean())
                if acc >= args.target:
                    hit = (k, first[k - 1])
                    break
            # the model as trained again: the door's close compares it across ranks
            vector_to_parameters(final, net.parameters())
        net.train()
    return step, first[-1], hit, acc


def synced_run(args, model, emu, opt, loader, sampler, evaluate):
    """``--eval synced``: every ``--eval-every`` steps the clock stops and every rank evaluates
    (module doc); stops at the target."""
    trained, hit, acc = 0.0, None, 0.0
    t0 = time.monotonic()
    for step in train_steps(model, emu, opt, loader, sampler):
        if step % args.eval_every == 0 or step >= args.max_steps:
            trained += slowest(time.monotonic() - t0)
            acc = evaluate()
            if acc >= args.target:
                hit = (step, trained)
                break
            if step >= args.max_steps:
                break
            t0 = time.monotonic()
    return step, trained, hit, acc


def slowest(took: float) -> float:
    """An evaluation interval's training time: its slowest rank's ``took`` (a rank ahead
    waits for the others in the evaluation's collective, which is not timed; every rank
    calls it at the same step)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([took], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def emulated(net, compute: float, delays, rank: int):
    """``net`` behind the accelerator's compute of a training batch: its forward in training
    mode sleeps ``compute`` plus the pattern's delay for (rank, ``.step``) first (the CPU stays
    free, as under a GPU). It is the model's own time, so a rank of the door that catches up
    (its step decided without it: the door's forward gives zeros without running the model)
    spends none of it, as its GPU would run no kernel (``pgc_hvd.apps.tta``'s convention); the
    loop sets ``.step`` before each batch."""
    import torch

    class Emulated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.step = net, 0

        def forward(self, x):
            if self.training:
                time.sleep(compute + float(delays.sample(rank, self.step)))
            return self.net(x)

    return Emulated()


def workload_data(workload: str) -> tuple:
    """(train, val) of ``--workload``: scikit-learn's digits in a fixed order, the first 1440
    for training and the 357 others for validation, as 8x8 images (``digits``) or
    :func:`digits28`'s 28x28 ones (``lenet28``)."""
    import torch
    from sklearn.datasets import load_digits
    from torch.utils.data import TensorDataset
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(1234)
    order = torch.randperm(len(y), generator=g)
    X, y = X[order], y[order]
    if workload == "lenet28":
        return digits28(X[:1440], y[:1440], 9600, g), digits28(X[1440:], y[1440:], None, g)
    return TensorDataset(X[:1440], y[:1440]), TensorDataset(X[1440:], y[1440:])


def digits28(X, y, count, g):
    """The digits as 28x28 images (``--workload lenet28``): each 8x8 image scaled to 20x20 and
    placed on a 28x28 canvas; ``count`` images drawn with replacement at random offsets 0-8
    (the training set), or each image once at the centre (``count`` None: the validation
    set)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import TensorDataset
    big = F.interpolate(X, size=(20, 20), mode="bilinear", align_corners=False)
    if count is None:
        idx, dx, dy = torch.arange(len(y)), torch.full((len(y),), 4), torch.full((len(y),), 4)
    else:
        idx = torch.randint(0, len(y), (count,), generator=g)
        dx, dy = (torch.randint(0, 9, (count,), generator=g) for _ in range(2))
    out = torch.zeros(len(idx), 1, 28, 28)
    for i, (j, a, b) in enumerate(zip(idx.tolist(), dx.tolist(), dy.tolist())):
        out[i, :, b:b + 20, a:a + 20] = big[j]
    return TensorDataset(out, y[idx])


def lightning_main(args, net, train, val, sgd, rank: int, n: int) -> None:
    """The same run as a LightningModule under ``Trainer(strategy="ddp")`` or ``PGCStrategy``
    (``net`` from :func:`emulated`): a callback numbers the batches' steps and evaluates
    every ``eval_every`` steps with the clock stopped (the interval timed as its slowest
    rank's; every rank the whole validation set: the parameters are the same, so every rank
    stops at the same step)."""
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
            net.step = trainer.global_step

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = clock["step"] = trainer.global_step
            if step % args.eval_every and step < args.max_steps:
                return
            clock["trained"] += slowest(time.monotonic() - clock["t0"])
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
        strategy = pgc_hvd.lightning.PGCStrategy(scheme=scheme, stragglers=stragglers(s),
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


def stragglers(s: str):
    """A door's ``@s``: an int, ``auto``, or the default (empty)."""
    return None if not s else s if s == "auto" else int(s)


def launch(args, door: str, pattern: str, seed: int) -> dict:
    spec = pattern_spec(pattern, args.np, args.compute, args.max_steps, seed)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.np), __file__, "--rank-main", "--door", door, "--delay", spec,
           "--seed", str(seed), "--compute", str(args.compute), "--target", str(args.target),
           "--eval-every", str(args.eval_every), "--eval", args.eval,
           "--max-steps", str(args.max_steps),
           "--workload", args.workload]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
    out = read_result(proc.stdout)
    if proc.returncode or out is None:
        raise SystemExit(f"{door} {pattern} seed {seed} failed:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    out["pattern"], out["workload"] = pattern, args.workload
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
    p.add_argument("--eval", choices=("synced", "snapshots"), default="synced")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--workload", choices=("digits", "lenet28"), default="digits")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.rank_main:
        rank_main(args)
        return 0
    if args.eval == "snapshots" and any(d.startswith("lightning:") for d in args.doors.split(",")):
        p.error("--eval snapshots runs the plain loop's doors; the Lightning doors evaluate "
                "in a callback (--eval synced)")
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
    print(f"\n{args.workload}, {args.np} ranks, compute {args.compute} s a batch, "
          f"target {args.target}, "
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
