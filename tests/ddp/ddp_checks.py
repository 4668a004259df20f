"""Multi-rank checks of the DDP door under torchrun (``pgc_hvd.DistributedDataParallel`` with
``pgc_hvd.CodedSampler``); each prints ``CHECK <name> ok rank=<r>`` (tests/ddp/test_ddp_door.py):

* ``refusals``: SyncBatchNorm at the wrap, a training forward before the optimizer is wrapped,
  a DataLoader whose batch_size differs from the sampler's, a complex-coefficient scheme --
  each refused on every rank with the fix, and the run goes on;
* ``habits``: what DDP scripts do beyond step(): ``model.module``, ``state_dict()`` keys,
  ``no_sync()``, a GradScaler with bf16 autocast, ``torch.compile(model)``, a checkpoint saved
  by rank 0 and resumed into a new model and optimizer on every rank, metrics averaged with
  ``dist.all_reduce``; ends with a cross-rank digest of the parameters;
* ``same_as_ddp`` (with ``refusals``): at s = 0 (dgd) the door with its sampler trains torch's
  DDP model with ``DistributedSampler``, batch for batch (the sampler deals each epoch as
  DistributedSampler does), SGD momentum over two epochs: the same parameters to float
  rounding;
* ``dead`` / ``dead-first``: the last rank exits (at version 3, or before its first forward);
  every other rank raises AgentError naming it (``CLEAR-ERROR``) within the timeout.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import pgc_hvd
from checks import ok, params_digest, same_on_every_rank
from pgc_hvd.runtime.errors import AgentError


def data(n=512):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 8, generator=g)
    y = (X[:, 0] + X[:, 1] > 0).long()
    return TensorDataset(X, y)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def refused(fn, *needles):
    try:
        fn()
    except (ValueError, RuntimeError) as err:
        msg = str(err)
        missing = [w for w in needles if w not in msg]
        assert not missing, (missing, msg)
        return msg
    raise AssertionError(f"not refused: {fn}")


def check_refusals(rank):
    bn = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.SyncBatchNorm(4))
    refused(lambda: pgc_hvd.DistributedDataParallel(bn), "SyncBatchNorm", "GroupNorm")
    ok("syncbatchnorm_refused", rank)

    model = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", timeout=30)
    x = torch.randn(16, 8)
    refused(lambda: model(x), "distributed_optimizer")
    with torch.no_grad():
        model(x)                  # evaluation passes need no optimizer
    ok("forward_before_optimizer_refused", rank)

    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    sampler = pgc_hvd.CodedSampler(data(), batch_size=16)
    loader = DataLoader(data(), batch_size=32, sampler=sampler)
    refused(lambda: model(next(iter(loader))[0]), "batch_size=16", "sampler's batch_size")
    ok("batch_size_mismatch_refused", rank)

    loader = DataLoader(data(), batch_size=16, sampler=sampler)
    batches = iter(loader)
    xb, yb = next(batches)
    with model.no_sync():        # DDP's accumulation habit: refused at the second backward
        F.cross_entropy(model(xb), yb).backward()
    xb, yb = next(batches)
    refused(lambda: F.cross_entropy(model(xb), yb).backward(), "second backward",
            "k times larger")
    opt.step()                   # the step of the batch(es) computed
    ok("accumulation_refused", rank)

    for xb, yb in loader:        # the run goes on after the refusals
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    opt.close()
    same_on_every_rank(params_digest(model), "parameters")
    ok("trains_after_refusals", rank)

    rs = pgc_hvd.DistributedDataParallel(net(), scheme="rs", name="rs", timeout=30)
    refused(lambda: rs.distributed_optimizer(torch.optim.SGD(rs.parameters(), lr=0.1)),
            "complex", "batches(loader)")
    ok("complex_scheme_refused", rank)


def check_habits(rank, out_dir):
    ds = data()
    model = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", timeout=30)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert isinstance(model.module, torch.nn.Sequential)
    assert all(k.startswith("module.") for k in model.state_dict())
    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    sampler = pgc_hvd.CodedSampler(ds, batch_size=16)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2,
                        persistent_workers=True)
    scaler = torch.amp.GradScaler("cpu")
    compiled = torch.compile(model)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(compiled(xb), yb)
            with model.no_sync():          # DDP's context: harmless (no reducer runs)
                scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
        total = torch.tensor([loss.item(), 1.0])
        dist.all_reduce(total)             # metric averaging on the default group
    steps = opt.version
    assert steps == 2 * len(loader), (steps, len(loader))
    assert abs(opt.param_groups[0]["lr"] - 0.05 * 0.5 ** (steps // 5)) < 1e-12
    ok("amp_compile_no_sync_scheduler", rank)

    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()},
                   os.path.join(out_dir, "ckpt.pt"))
    dist.barrier()
    before = same_on_every_rank(params_digest(model), "parameters before the resume")
    opt.close()

    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=False)
    model2 = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", timeout=30)
    model2.load_state_dict(ckpt["model"])
    opt2 = model2.distributed_optimizer(torch.optim.SGD(model2.parameters(), lr=0.05,
                                                        momentum=0.9))
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.version == steps and params_digest(model2) == before
    sampler2 = pgc_hvd.CodedSampler(ds, batch_size=16).bind(model2)
    for xb, yb in DataLoader(ds, batch_size=16, sampler=sampler2):
        opt2.zero_grad()
        F.cross_entropy(model2(xb), yb).backward()
        opt2.step()
    assert opt2.version == steps + len(loader)
    opt2.close()
    final = same_on_every_rank(params_digest(model2), "parameters after the resume")
    print(f"PARAMS {final}", flush=True)
    ok("checkpoint_resume", rank)


def check_sequential(rank):
    """Two models trained one after the other in one process, each with an unbound sampler:
    the first, closed and dropped, no longer feeds samplers. The second has DDP's
    ``bucket_cap_mb`` small enough for several buckets: its messages stream (the overlap, from
    the second step on, on every rank that computes) and the parameters end identical."""
    ds = data()
    for i in range(2):
        caps = {"bucket_cap_mb": 0.0005, "overlap": True} if i else {}   # ~130 floats a bucket
        model = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", name=f"seq{i}",
                                                timeout=30, **caps)
        opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for xb, yb in DataLoader(ds, batch_size=16, sampler=pgc_hvd.CodedSampler(ds, 16)):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        streamed = opt.current_step.streamed_steps
        opt.close()
        assert (streamed > opt.version // 2) if i else streamed == 0, (i, streamed, opt.version)
        same_on_every_rank(params_digest(model), f"parameters of model {i}")
        del model, opt
    ok("sequential_models", rank)
    check_no_cycles(rank, ds)
    # stragglers="auto" through the door: the last rank slowed, s goes 0 -> 1 on every rank at
    # an early boundary (step 2 or 3: the runtime's early_gain) or at the first regular one (4),
    # the re-plan keeps feeding the sampler (it asks the optimizer every step)
    model = pgc_hvd.DistributedDataParallel(
        net(), scheme="pgc-cr", name="seq-auto", timeout=30, stragglers="auto",
        auto={"s_start": 0, "s_max": 1, "first": 4, "every": 4, "cooldown": 4, "window": 6})
    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    world = dist.get_world_size()
    for xb, yb in DataLoader(ds, batch_size=16, sampler=pgc_hvd.CodedSampler(ds, 16)):
        if rank == world - 1:
            time.sleep(0.05)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    switches = [(d["step"], d["old_s"], d["new_s"]) for d in opt.auto_stragglers.switches]
    opt.close()
    assert switches and switches[0][1:] == (0, 1) and 2 <= switches[0][0] <= 4, switches
    same_on_every_rank(params_digest(model), "parameters after an auto switch")
    ok("auto_switch_through_the_door", rank)


def check_same_as_ddp(rank):
    """DDP (``DistributedSampler``, seed 0) and the door at dgd (``CodedSampler``, seed 0) from
    the same initial model, SGD momentum 0.9, two epochs with ``set_epoch``: the parameters
    agree to float rounding (the sums' order differs), on every rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.utils import parameters_to_vector
    from torch.utils.data import DistributedSampler
    ds = data(500)          # not a multiple of n: DistributedSampler pads, the deal too
    out = []
    for door in ("ddp", "dgd"):
        if door == "ddp":
            model, sampler = DDP(net()), DistributedSampler(ds, seed=0, drop_last=False)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        else:
            model = pgc_hvd.DistributedDataParallel(net(), scheme="dgd", name="parity",
                                                    timeout=30)
            sampler = pgc_hvd.CodedSampler(ds, batch_size=16, seed=0)
            opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                              momentum=0.9))
        loader = DataLoader(ds, batch_size=16, sampler=sampler, drop_last=True)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
        if door != "ddp":
            assert opt.version == 2 * len(loader), (opt.version, len(loader))
            opt.close()
        out.append(parameters_to_vector(model.module.parameters()).detach())
    init = parameters_to_vector(net().parameters()).detach()
    gap, moved = float((out[0] - out[1]).abs().max()), float((out[0] - init).abs().max())
    assert gap < 1e-5 and moved > 1e-2, (gap, moved)
    same_on_every_rank(params_digest(model), "parameters of the door at s = 0")
    ok("same_as_ddp", rank)


def check_no_cycles(rank, ds):
    """A step of the door (pgc-cr, the last rank slowed) leaves no reference cycle behind:
    torch's ``tree_flatten`` made two a step, and the garbage collector ran every ~20 steps of
    LeNet; the parameters end identical."""
    import gc
    import types
    world = dist.get_world_size()
    model = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", name="cycles", timeout=30)
    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    garbage: list = []
    for i, (xb, yb) in enumerate(DataLoader(ds, batch_size=16,
                                            sampler=pgc_hvd.CodedSampler(ds, 16))):
        if i == 8:
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
        if rank == world - 1:
            time.sleep(0.01)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if i == 20:
            gc.collect()
            garbage = [f"{o.__module__}.{o.__qualname__}" for o in gc.garbage
                       if isinstance(o, types.FunctionType)]
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    opt.close()
    assert not garbage, garbage
    same_on_every_rank(params_digest(model), "parameters (no cycles)")
    ok("no_reference_cycles_per_step", rank)


def check_dead(rank, first: bool):
    world = dist.get_world_size()
    dead = world - 1
    ds = data()
    model = pgc_hvd.DistributedDataParallel(net(), scheme="pgc-cr", timeout=8)
    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    loader = DataLoader(ds, batch_size=16, sampler=pgc_hvd.CodedSampler(ds, batch_size=16))
    t0 = time.time()
    try:
        for epoch in range(20):
            for xb, yb in loader:
                if rank == dead and opt.version == (0 if first else 3):
                    print(f"INFO rank {rank} dies now", flush=True)
                    os._exit(0)
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                time.sleep(0.01)
    except AgentError as err:
        print(f"CLEAR-ERROR rank={rank} after {time.time() - t0:.1f}s: {err}", flush=True)
        os._exit(0)
    print(f"NO-ERROR rank={rank}", flush=True)
    os._exit(1)


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "refusals":
        check_refusals(rank)
        check_sequential(rank)
        check_same_as_ddp(rank)
    elif mode == "habits":
        check_habits(rank, sys.argv[2])
    elif mode == "sequential":
        check_sequential(rank)
    elif mode in ("dead", "dead-first"):
        check_dead(rank, first=mode == "dead-first")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ALL OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
