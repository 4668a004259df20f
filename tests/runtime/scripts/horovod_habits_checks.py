"""Runs on every rank under horovodrun: Horovod users' habits with pgc_hvd (one rank
slowed).

    python horovod_habits_checks.py MODE [ARGS], one of:

    schedulers   # -np 3: StepLR stepped once per step() call, built
                 #   before and after the wrap, an lr set from the loop
                 #   counter; a loop of N step() calls ends at version N
    clipping     # -np 3: synchronize(); clip_grad_norm_;
                 #   skip_synchronize(): step() clips the decoded update
                 #   identically; plain clipping after backward acts on
                 #   the partition's gradient; after a multi-partition
                 #   loop it is refused
    amp          # -np 3: bf16 autocast + GradScaler (CPU); a rank whose
                 #   scale overflows is left out like a straggler
    surface      # -np 2: hvd.Compression.none, op=hvd.Average / hvd.Sum,
                 #   gradient_predivide_factor, backward_passes_per_step;
                 #   Adasum and extra backward passes refused
    broadcast    # -np 3: hvd.broadcast_optimizer_state before and after
                 #   the wrap (Adam), then the ImageNet example's resume:
                 #   rank 0 loads opt.state_dict(), broadcasts, training
                 #   goes on from the saved version
    own_loader   # -np 2: a backward outside batches() (the user's own
                 #   DataLoader) trains under dgd, is refused under pgc-cr
    metrics      # -np 3: opt.metrics: the decided step's mean loss and
                 #   a user metric, the same on every rank
    zero_grad    # -np 2: zero_grad() between the last backward and
                 #   step() raises as Horovod's does (dgd with the
                 #   user's loader, gc-cr in batches()); the gradient is
                 #   kept and step() still applies it
    cancel       # -np 3: straggler_policy="cancel": the slow rank
                 #   abandons steps that fire without it (its delay cut
                 #   short), every loop ends at the same version with
                 #   identical parameters
    diverge      # -np 3: an lr set from a rank-local value: close()
                 #   names the parameters and the hyper-parameters

Checks print "CHECK <name> ok rank=<r>"; expected errors print "CLEAR-ERROR rank=<r>: ...".
Every check that trains ends with a cross-rank hash of the parameters (same_on_all_ranks).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

import pgc_hvd

hvd = pgc_hvd.engine()     # horovod.torch under horovodrun, pgc_hvd.torch under torchrun
from pgc_hvd.runtime import AgentError

sys.path.insert(0, os.path.dirname(__file__))
from consistency_fault_checks import clear, data, model, same_on_all_ranks, same_version_on_all_ranks  # noqa: E402
from checks import ok  # noqa: E402

torch.set_num_threads(1)
SLOW = 2


def slow_rank(seconds=0.04):
    """Rank SLOW (mod n) sleeps ``seconds`` before each message (a straggler)."""
    return pgc_hvd.delays.SlowWorker(SLOW % hvd.size(), seconds)


def wrap(m, opt=None, name="h", scheme="pgc-cr", **kw):
    opt = opt or torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    kw.setdefault("delay", slow_rank())
    kw.setdefault("timeout", 60)
    return pgc_hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                        scheme=scheme, name=name, **kw)


def train_steps(m, opt, loader, steps, body=None):
    for i in range(steps):
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
            if body is not None:
                body(i)
        opt.step()


def check_schedulers():
    n = hvd.size()
    loader = data(n)
    # built on the plain optimizer BEFORE the wrap (it shares the param groups), stepped once
    # per step() call: every rank applies update i with the same lr
    m = model()
    base = torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9)
    before = torch.optim.lr_scheduler.StepLR(base, step_size=4, gamma=0.5)
    opt = wrap(m, base, name="sch1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch: "lr_scheduler.step() before optimizer.step()"
        for i in range(14):
            for xb, yb in opt.batches(loader):
                F.cross_entropy(m(xb), yb).backward()
            opt.step()
            before.step()
    assert opt.version == 14, opt.version
    opt.close()
    same_version_on_all_ranks(opt, "sch1")
    assert abs(opt.param_groups[0]["lr"] - 0.2 * 0.5 ** 3) < 1e-12, opt.param_groups[0]["lr"]
    same_on_all_ranks(m, "sch1")
    ok("scheduler_before_wrap")

    # built on the wrapper after the wrap (the usual order), plus an lr from the loop counter
    m = model()
    opt = wrap(m, name="sch2")
    after = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 7], gamma=0.3)
    lrs = []
    for i in range(12):
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        after.step()
    opt.close()
    assert opt.version == 12
    want = [0.1 * 0.3 ** sum(i >= k for k in (3, 7)) for i in range(12)]
    assert all(abs(a - b) < 1e-12 for a, b in zip(lrs, want)), (lrs, want)
    same_on_all_ranks(m, "sch2")
    ok("scheduler_per_step_call")

    # the lr set by hand from the iteration counter (Horovod's ImageNet example's
    # adjust_learning_rate), a straggler included: the hyper-parameter digest agrees at close
    m = model()
    opt = wrap(m, name="sch3", delay=slow_rank(seconds=0.08))
    for i in range(12):
        for g in opt.param_groups:
            g["lr"] = 0.05 * (1 + i % 3)
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    caught = hvd.allgather(torch.tensor([opt.catch_up_steps]), name="sch3.caught").tolist()
    assert caught[SLOW % n] > 0, f"the slow rank never caught up: {caught}"
    opt.close()
    same_on_all_ranks(m, "sch3")
    ok("lr_from_loop_counter")


def check_clipping():
    n = hvd.size()
    loader = data(n)
    max_norm = 0.05
    # Horovod's pattern: the decoded update is clipped, identically on every rank
    m = model()
    opt = wrap(m, name="clip1")
    norms = []
    for i in range(10):
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.synchronize()
        before = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        after = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters()))
        norms.append((float(before), float(after)))
        with opt.skip_synchronize():
            opt.step()
    opt.close()
    assert all(a <= max_norm * (1 + 1e-5) for _, a in norms), norms
    assert any(b > max_norm for b, _ in norms), f"nothing was clipped: {norms}"
    got = hvd.allgather(torch.tensor([[b for b, _ in norms]], dtype=torch.float64),
                        name="clip1.norms")
    assert bool((got == got[0]).all()), "the decoded update differs across ranks"
    same_on_all_ranks(m, "clip1")
    ok("clip_decoded_update")

    # plain clipping right after backward: acts on the partition's gradient
    m = model()
    opt = wrap(m, name="clip2")
    seen = []

    def clip(i):
        total = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        seen.append(float(total))

    train_steps(m, opt, loader, 8, body=clip)
    opt.close()
    assert seen and max(seen) > 0, "clip_grad_norm_ saw no gradient"
    same_on_all_ranks(m, "clip2")
    ok("clip_partition_gradient")

    # after a loop that evaluates two partitions (gc-cr), clipping p.grad would clip one:
    # refused with the fix
    m = model()
    opt = wrap(m, name="clip3", scheme="gc-cr", delay=None)
    try:
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        opt.step()
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except (RuntimeError, AgentError) as err:
        clear(err)
        assert "synchronize" in str(err) or "failed" in str(err), err
    ok("clip_after_multi_partition_loop_refused")


def check_amp():
    n = hvd.size()
    loader = data(n)
    # bf16 autocast on the CPU with a GradScaler: rank 1's scale starts far too high, so its
    # first messages overflow (non-finite: left out like a straggler's) until it backs off
    m = model()
    opt = wrap(m, name="amp1", delay=None)
    init = 2.0 ** 127 if hvd.rank() == 1 else 2.0 ** 8
    scaler = torch.amp.GradScaler("cpu", init_scale=init, backoff_factor=2.0 ** -40)
    for i in range(16):
        for xb, yb in opt.batches(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(m(xb) * 1e3, yb)
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    opt.close()
    bad = [w for w, _ in opt.nonfinite_log]
    assert 1 in bad, f"rank 1's overflowing messages were not seen: {opt.nonfinite_log}"
    assert scaler.get_scale() < init or hvd.rank() != 1
    assert all(torch.isfinite(p).all() for p in m.parameters())
    same_on_all_ranks(m, "amp1")
    ok("amp_overflow_is_a_straggler")

    # the scaled gradients are unscaled before they enter the ring: with the scale a power of
    # two (exact), the run equals the same run without AMP scaling, bit for bit
    def run(scaled, name):
        torch.manual_seed(0)
        m = model()
        opt = wrap(m, name=name, delay=None, replay_arrivals=sched)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=10 ** 6,
                                      enabled=scaled)
        for i in range(8):
            for xb, yb in opt.batches(loader):
                scaler.scale(F.cross_entropy(m(xb), yb)).backward()
            scaler.step(opt)
            scaler.update()
        opt.close()
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    sched = [(w, k) for k in range(8) for w in range(n)]
    a, b = run(True, "amp2"), run(False, "amp3")
    assert torch.equal(a, b), f"AMP scaling changed the model: {float((a - b).abs().max())}"
    ok("amp_scale_exact")


def check_surface():
    n = hvd.size()
    loader = data(n)
    # hvd.Compression.none, op=hvd.Average, gradient_predivide_factor: the same updates
    first = {}

    def keep(name):
        def on_update(step, flat):
            first.setdefault(name, flat.clone())
        return on_update

    sched = [(w, k) for k in range(3) for w in range(n)]
    for name, kw in (("plain", {}),
                     ("horovod", dict(compression=hvd.Compression.none, op=hvd.Average,
                                      gradient_predivide_factor=2.0, num_groups=2,
                                      sparse_as_dense=True))):
        m = model()
        opt = wrap(m, name=f"surf.{name}", delay=None, replay_arrivals=sched,
                   on_update=keep(name), **kw)
        train_steps(m, opt, loader, 3)
        opt.close()
        same_on_all_ranks(m, f"surf.{name}")
    assert torch.equal(first["plain"], first["horovod"])
    ok("horovod_keywords_accepted")

    # hvd.Compression.fp16: dense messages travel as fp16 (half the bytes), updates still agree
    got = {}
    for name, comp in (("fp32", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        m = model()
        recs = []
        opt = wrap(m, name=f"surf.{name}", compression=comp, optimistic=False,
                   on_record=recs.append)
        train_steps(m, opt, loader, 6)
        opt.close()
        same_on_all_ranks(m, f"surf.{name}")
        got[name] = recs
    if hvd.rank() == 0:
        b32 = sum(r.bytes for r in got["fp32"]) / len(got["fp32"])
        b16 = sum(r.bytes for r in got["fp16"]) / len(got["fp16"])
        print(f"FP16 bytes per step {b16:.0f} vs fp32 {b32:.0f}", flush=True)
        assert b16 < b32, (b16, b32)   # the halving at real sizes: benchmarks/data_plane/fp16_bytes.py
    ok("fp16_compression")

    # op=hvd.Sum applies n times the average
    m1, m2 = model(), model()
    o1 = wrap(m1, torch.optim.SGD(m1.parameters(), lr=0.1), name="surf.avg", delay=None,
              replay_arrivals=sched)
    o2 = wrap(m2, torch.optim.SGD(m2.parameters(), lr=0.1 / n), name="surf.sum", delay=None,
              replay_arrivals=sched, op=hvd.Sum)
    train_steps(m1, o1, loader, 1)
    train_steps(m2, o2, loader, 1)
    o1.close()
    o2.close()
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6), float((p1 - p2).abs().max())
    same_on_all_ranks(m2, "surf.sum")
    ok("op_sum")

    # backward_passes_per_step=2: two backward passes per partition accumulate
    m = model()
    opt = wrap(m, name="surf.bpps", backward_passes_per_step=2)
    for i in range(5):
        for xb, yb in opt.batches(loader):
            half = len(xb) // 2
            F.cross_entropy(m(xb[:half]), yb[:half]).backward()
            F.cross_entropy(m(xb[half:]), yb[half:]).backward()
        opt.step()
    opt.close()
    same_on_all_ranks(m, "surf.bpps")
    ok("backward_passes_per_step")

    m = model()
    for bad in (dict(op=hvd.Adasum), dict(backward_passes_per_step=0),
                dict(op=hvd.Sum, gradient_predivide_factor=2.0)):
        try:
            wrap(m, name="surf.bad", **bad)
            print(f"NO-ERROR rank={hvd.rank()}", flush=True)
        except ValueError as err:
            clear(err)
    ok("refused_keywords")

    m = model()
    opt = wrap(m, name="surf.extra", delay=None)
    try:
        for xb, yb in opt.batches(loader):
            for _ in range(2):
                F.cross_entropy(m(xb), yb).backward()
        opt.step()
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except (RuntimeError, AgentError) as err:
        clear(err)
        assert "backward_passes_per_step" in str(err) or "failed" in str(err), err
    ok("extra_backward_refused")


def adam(m):
    return torch.optim.Adam(m.parameters(), lr=0.01)


def sgd_wd(m):
    """Momentum and weight decay: Horovod's state-creating zero-gradient step would move the
    parameters on the ranks that had no state (all but rank 0 on a resume)."""
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)


def check_broadcast():
    n = hvd.size()
    loader = data(n)
    # before the wrap (plain optimizer) and after it (Horovod's examples' order)
    for where in ("before", "after"):
        m = model()
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        base = adam(m)
        if where == "before":
            hvd.broadcast_optimizer_state(base, root_rank=0)
        opt = wrap(m, base, name=f"bc.{where}")
        if where == "after":
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.version == 0
        train_steps(m, opt, loader, 6)
        opt.close()
        same_on_all_ranks(m, f"bc.{where}")
        ok(f"broadcast_optimizer_state_{where}_wrap")

    # the ImageNet example's resume: rank 0 saves model + opt.state_dict() at step 7; a new run
    # loads it on rank 0 only, broadcasts parameters and optimizer state, and goes on from 7
    path = os.path.join(tempfile.gettempdir(), f"pgc_habits_{os.getppid()}.pt")
    m = model()
    opt = wrap(m, sgd_wd(m), name="bc.save")
    train_steps(m, opt, loader, 7)
    if hvd.rank() == 0:
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, path)
    saved = [p.detach().clone() for p in m.parameters()]
    train_steps(m, opt, loader, 3)
    opt.close()
    hvd.allreduce(torch.zeros(1), name="bc.saved")   # the file is written

    m2 = model()
    torch.manual_seed(100 + hvd.rank())
    for p in m2.parameters():          # ranks start from different random parameters
        p.data.normal_()
    opt2 = wrap(m2, sgd_wd(m2), name="bc.resume")
    if hvd.rank() == 0:
        ck = torch.load(path)   # torch's default, weights_only=True: the state is plain types
        m2.load_state_dict(ck["model"])
        opt2.load_state_dict(ck["optimizer"])
        assert opt2.version == 7
    hvd.broadcast_parameters(m2.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt2, root_rank=0)
    for p, q in zip(m2.parameters(), saved):
        assert torch.equal(p.detach(), q)
    assert opt2.version == 7, opt2.version     # rank 0's version, on every rank, at once
    train_steps(m2, opt2, loader, 5)
    assert opt2.version == 12, opt2.version
    opt2.close()
    same_on_all_ranks(m2, "bc.resume")
    ok("resume_rank0_loads_then_broadcasts")

    # rank 0 loads, nobody broadcasts: refused at the first step, on every rank
    m3 = model()
    opt3 = wrap(m3, sgd_wd(m3), name="bc.nobcast")
    if hvd.rank() == 0:
        opt3.load_state_dict(torch.load(path)["optimizer"])
    try:
        train_steps(m3, opt3, loader, 1)
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except ValueError as err:
        clear(err)
    # a state of another scheme is refused with a clear error
    m4 = model()
    opt4 = wrap(m4, sgd_wd(m4), name="bc.other", scheme="bcgc")
    try:
        opt4.load_state_dict(torch.load(path)["optimizer"])
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except Exception as err:
        clear(err)
    ok("resume_refusals")


def check_own_loader():
    n = hvd.size()
    g = torch.Generator().manual_seed(7)
    X = torch.randn(200, 6, generator=g)
    y = (X[:, 0] > 0).long()
    ds = torch.utils.data.TensorDataset(X, y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=n,
                                                              rank=hvd.rank(), seed=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=10, sampler=sampler)
    # dgd: the user's own DataLoader is this rank's shard, as with hvd.DistributedOptimizer
    m = model()
    opt = wrap(m, name="own.dgd", scheme="dgd", delay=None)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in dl:
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
    assert opt.version == 2 * len(dl)
    opt.close()
    same_on_all_ranks(m, "own.dgd")
    ok("own_loader_dgd")
    # pgc-cr: the partitions rotate; the user's loader does not know them: refused
    m = model()
    opt = wrap(m, name="own.pgc", delay=None)
    try:
        for xb, yb in dl:
            F.cross_entropy(m(xb), yb).backward()
            opt.step()
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except (RuntimeError, AgentError) as err:
        clear(err)
    ok("own_loader_pgc_refused")


def check_metrics():
    """The decided step's mean loss and a user metric, read on every rank without a collective,
    equal the mean over the messages the decision used of what their ranks sent."""
    n, steps = hvd.size(), 10
    loader = data(n)
    m = model()
    opt = wrap(m, name="met", metrics=["acc"])
    sent = torch.full((steps, 2), float("nan"), dtype=torch.float64)
    seen = []
    for i in range(steps):
        loss = acc = None
        for xb, yb in opt.batches(loader):
            out = m(xb)
            batch_loss = F.cross_entropy(out, yb)
            batch_loss.backward()
            loss = float(batch_loss)
            acc = float((out.argmax(1) == yb).float().mean())
        if opt.computes or loss is not None:
            sent[i] = torch.tensor([loss, acc], dtype=torch.float64)
            opt.step(loss=loss, metrics={"acc": acc})
        else:
            opt.step()
        got = opt.metrics
        assert got["step"] == i, got
        seen.append((got["loss"], got["acc"], tuple(got["ranks"])))
    opt.close()
    rows = hvd.allgather(torch.tensor([[v for l, a, _ in seen for v in (l, a)]],
                                      dtype=torch.float64), name="met.seen")
    assert bool((rows == rows[0]).all()), "ranks read different metrics"
    sent_all = hvd.allgather(sent.reshape(1, -1), name="met.sent").reshape(n, steps, 2)
    for i, (l, a, ranks) in enumerate(seen):
        want = sent_all[list(ranks), i].mean(0)
        assert abs(want[0] - l) < 1e-9 and abs(want[1] - a) < 1e-9, (i, ranks, want, l, a)
    same_on_all_ranks(m, "met")
    ok("metrics_from_control_rows")


def check_diverge():
    n = hvd.size()
    loader = data(n)
    # rank 1's loop makes 3 step() calls fewer: close() names the versions and catches it up
    m = model()
    opt = wrap(m, name="short")
    train_steps(m, opt, loader, 9 if hvd.rank() == 1 else 12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.close()
    text = " ".join(str(w.message) for w in caught)
    assert "ended at different versions" in text and "1: 9" in text, text
    assert opt.version == 12 and opt.loop_end_versions[1] == 9, opt.loop_end_versions
    same_on_all_ranks(m, "short")
    ok("different_step_counts_named")

    m = model()
    opt = wrap(m, name="div")
    for i in range(8):
        if i == 4:   # a rank-local lr: a different model on each rank
            for g in opt.param_groups:
                g["lr"] = 0.05 * (1 + hvd.rank())
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    try:
        opt.close()
        print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    except AgentError as err:
        clear(err)
        assert "hyper-parameters" in str(err), err
    ok("rank_local_lr_named")


def check_zero_grad():
    """Horovod raises on ``zero_grad()`` between ``backward()`` and ``step()``; so does this
    optimizer (dgd would otherwise apply a zero update, gc-cr drop the last partition's
    gradient from the message). The gradient is kept: the next step() applies it."""
    n = hvd.size()
    g = torch.Generator().manual_seed(7)
    X = torch.randn(40, 6, generator=g)
    y = (X[:, 0] > 0).long()
    for scheme in ("dgd", "gc-cr"):
        m = model()
        before = [p.detach().clone() for p in m.parameters()]
        opt = wrap(m, name=f"zg.{scheme}", scheme=scheme, delay=None)
        loader = data(n)
        for i in range(3):
            opt.zero_grad()             # before the forward pass: fine
            if scheme == "dgd":
                xb, yb = X[10 * hvd.rank():10 * hvd.rank() + 10], y[10 * hvd.rank():][:10]
                F.cross_entropy(m(xb), yb).backward()
            else:
                for xb, yb in opt.batches(loader):
                    F.cross_entropy(m(xb), yb).backward()
            # after the last backward, before step(): refused where this rank computed (a rank
            # that catches up ran no backward, so p.grad holds nothing of the step)
            computed = opt.computes
            try:
                opt.zero_grad()
                if computed:
                    print(f"NO-ERROR rank={hvd.rank()}", flush=True)
            except AssertionError as err:
                assert computed and "zero_grad() was called after loss.backward()" in str(err), \
                    err
                if i == 0:
                    clear(err)
            opt.step()
        opt.close()
        assert opt.version == 3
        moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(m.parameters(), before))
        assert moved > 0, f"{scheme}: the parameters never moved (a zero update was applied)"
        same_on_all_ranks(m, f"zg.{scheme}")
    ok("zero_grad_before_step_refused")


def check_cancel():
    """``straggler_policy="cancel"`` (the runtime's path; the simulator has its own test): rank
    SLOW sleeps 2 s per message, far longer than the others' steps, so its steps fire without
    it; it abandons them (the injected delay is cut short when the step is decided), sends
    nothing for them, keeps its ring slots and moves on to the newest model. Every rank applies
    every update; the parameters agree."""
    steps = 8
    m = model()
    opt = wrap(m, name="cancel", straggler_policy="cancel", delay=slow_rank(2.0))
    loader = data(hvd.size())
    t0 = time.monotonic()
    train_steps(m, opt, loader, steps)
    took = time.monotonic() - t0
    opt.close()
    assert opt.version == steps, opt.version
    if hvd.rank() == SLOW % hvd.size():
        # without cancelling, every step this rank computes would sleep 2 s
        assert took < 2.0 * steps / 2, f"the slow rank took {took:.2f}s: its delays were not cut"
    same_on_all_ranks(m, "cancel")
    ok("cancel_policy_runtime")


def main():
    hvd.init()
    {"schedulers": check_schedulers, "clipping": check_clipping, "amp": check_amp,
     "surface": check_surface, "broadcast": check_broadcast, "own_loader": check_own_loader,
     "diverge": check_diverge, "metrics": check_metrics, "zero_grad": check_zero_grad,
     "cancel": check_cancel}[sys.argv[1]]()


if __name__ == "__main__":
    main()
