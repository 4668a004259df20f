"""Runs on every rank under horovodrun: consistency faults: non-finite parameters,
ranks that differ, a rank that stops early, settings that must agree, odd dtypes.

    python consistency_fault_checks.py MODE [ARGS], one of:

    nonfinite BAD   # -np 3: rank BAD multiplies a parameter by inf at step
                    #   10: every rank stops, naming rank BAD and step 10
    diverged        # -np 3: rank 2 nudges a parameter (finite) at step 5:
                    #   close() raises on every rank, naming rank 2
    clean           # -np 3: a rank that stops early ends at the others'
                    #   version and parameters after close(); fp16, bf16
                    #   and fp64 models train (and match fp32)
    config          # -np 3: every setting that must agree is compared at
                    #   construction (or at the first batches() for the
                    #   loader), the error names the field and ranks [1]
    skipped         # -np 3: a batches() body that skips backward stops
                    #   the run ("got no gradient") instead of a zero
                    #   gradient

Checks print "CHECK <name> ok rank=<r>"; expected errors print "CLEAR-ERROR rank=<r>: <error>";
a run that should have failed prints "NO-ERROR rank=<r>". Every check that trains ends with a
cross-rank hash of the parameters (same_on_all_ranks).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd

hvd = pgc_hvd.engine()     # horovod.torch under horovodrun, pgc_hvd.torch under torchrun
from pgc_hvd.runtime import AgentError, PartitionLoader
from checks import ok   # tests/checks.py

torch.set_num_threads(1)


def data(n, seed=3, batch_size=12, size=240):
    g = torch.Generator().manual_seed(7)
    X = torch.randn(size, 6, generator=g)
    y = ((X[:, 0] + 0.5 * X[:, 1]) > 0).long()
    return PartitionLoader(X, y, n, batch_size=batch_size, seed=seed)


def model(dtype=torch.float32):
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 2)).to(dtype)


def flat_params(m):
    return torch.cat([p.detach().reshape(-1).double() for p in m.parameters()])


def same_on_all_ranks(m, what):
    """The cross-rank parameter hash every check ends with (bits of the parameters' own dtype)."""
    raw = b"".join(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                   for p in m.parameters())
    h = int(hashlib.sha256(raw).hexdigest()[:12], 16)
    allh = hvd.allgather(torch.tensor([h], dtype=torch.int64), name=f"audit.hash.{what}")
    assert len(set(allh.tolist())) == 1, f"{what}: parameter hashes differ across ranks {allh}"


def same_version_on_all_ranks(opt, what):
    v = hvd.allgather(torch.tensor([opt.version], dtype=torch.int64), name=f"audit.ver.{what}")
    assert len(set(v.tolist())) == 1, f"{what}: versions differ across ranks {v.tolist()}"
    return int(v[0])


def clear(err):
    msg = " ".join(str(err).split())
    print(f"CLEAR-ERROR rank={hvd.rank()}: {type(err).__name__}: {msg}", flush=True)


def must_fail(run, errors=(AgentError,)):
    """Run ``run()``, which must raise one of ``errors``: print CLEAR-ERROR and exit 0 when it
    does, NO-ERROR and exit 1 when it returns (os._exit: the other ranks may be gone)."""
    try:
        run()
    except errors as err:
        clear(err)
        os._exit(0)
    print(f"NO-ERROR rank={hvd.rank()}", flush=True)
    os._exit(1)


def build(m, name, scheme="pgc-cr", s=1, lr=0.1, momentum=0.0, **kw):
    base = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
    return pgc_hvd.DistributedOptimizer(base, m.named_parameters(), scheme=scheme,
                                        stragglers=s, name=name, timeout=30, **kw)


def loss_of(m, xb, yb):
    dtype = next(m.parameters()).dtype
    return F.cross_entropy(m(xb.to(dtype)).float(), yb)


# -- non-finite parameters on one rank ----------------------------------------------------------
def check_nonfinite_parameters(bad):
    """Rank ``bad`` multiplies a weight by inf at step 10 (a fault outside the optimizer). Its
    messages are non-finite from then on; the run must stop on every rank, naming the rank and
    the step, instead of training on with that rank excluded and ending with ranks that differ."""
    r = hvd.rank()
    m = model()
    loader = data(hvd.size())
    opt = build(m, "nonfinite")

    def run():
        while opt.version < 40:
            if r == bad and opt.version == 10:
                with torch.no_grad():
                    m[0].weight.mul_(float("inf"))
            for xb, yb in opt.batches(loader):
                loss_of(m, xb, yb).backward()
            opt.step()
        opt.close()
    must_fail(run, (AgentError, RuntimeError))


# -- parameters compared at close() -------------------------------------------------------------
def check_diverged():
    """Rank 2 adds 1e-3 to a weight at step 5 (finite: every message stays finite). close() must
    compare the ranks' parameters and raise on every rank, naming rank 2."""
    r = hvd.rank()
    m = model()
    loader = data(hvd.size())
    opt = build(m, "diverged")

    def run():
        while opt.version < 10:
            if r == 2 and opt.version == 5:
                with torch.no_grad():
                    m[2].bias.add_(1e-3)
            for xb, yb in opt.batches(loader):
                loss_of(m, xb, yb).backward()
            opt.step()
        opt.close()
    must_fail(run, (AgentError,))


# -- close() applies the updates decided after this rank's loop ended ---------------------------
def check_early_stop(steps=12, early=4):
    """Rank 2 stops training at version ``early`` (a straggler whose loop ends there: it waits
    for the others, then leaves without another step()), while the others train to ``steps``
    without it (pgc-cr, s = 1). After close() every rank is at version ``steps`` with the same
    parameters: rank 2 applied the updates decided after its loop ended."""
    r = hvd.rank()
    m = model()
    loader = data(hvd.size())
    opt = build(m, "early", momentum=0.9)
    while opt.version < steps:
        if r == 2 and opt.version == early:
            deadline = time.monotonic() + 60
            while opt.agent.decided() < steps and time.monotonic() < deadline:
                time.sleep(0.01)
            assert opt.agent.decided() == steps, opt.agent.decided()
            break
        for xb, yb in opt.batches(loader):
            loss_of(m, xb, yb).backward()
        opt.step()
    opt.close()
    v = same_version_on_all_ranks(opt, "early")
    assert v == steps, f"final version {v}, not the {steps} the other ranks trained to"
    same_on_all_ranks(m, "early")
    ok("early_stop_catches_up_at_close")


# -- fp16 / bf16 / fp64 models ------------------------------------------------------------------
def train_dtype(dtype, scheme, s, steps, name):
    m = model(dtype)
    loader = data(hvd.size())
    opt = build(m, name, scheme=scheme, s=s, lr=0.2, momentum=0.9)
    while opt.version < steps:
        for xb, yb in opt.batches(loader):
            loss_of(m, xb, yb).backward()
        opt.step()
    opt.close()
    assert all(p.dtype == dtype for p in m.parameters()), [p.dtype for p in m.parameters()]
    assert torch.isfinite(flat_params(m)).all()
    same_on_all_ranks(m, name)
    return flat_params(m)


def check_dtypes(steps=5):
    """Messages, ring and decoded updates are fp32 (the kernels' dtype); the update is cast to
    each parameter's dtype when applied. dgd is deterministic, so each dtype's run is compared
    with the fp32 run: within the dtype's rounding (fp16/bf16) or fp32's (fp64: the gradient is
    rounded to fp32 on its way)."""
    init = flat_params(model())
    ref = train_dtype(torch.float32, "dgd", 0, steps, "dt-ref")
    moved = float((ref - init).norm())
    assert moved > 1e-3, moved
    for dtype, tol in ((torch.float64, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 6e-2)):
        got = train_dtype(dtype, "dgd", 0, steps, f"dt-{dtype}")
        err = float((got - ref).norm() / (ref - init).norm())
        assert err < tol, f"{dtype}: trained parameters differ from the fp32 run by {err} (> {tol})"
        train_dtype(dtype, "pgc-cr", 1, steps, f"dt-pgc-{dtype}")
    ok("dtypes_fp16_bf16_fp64")


# -- everything that must agree is compared -----------------------------------------------------
def expect_config_error(make, needles, what):
    """``make()`` must raise ValueError on every rank, naming ranks [1] and every needle."""
    r = hvd.rank()
    try:
        make()
    except ValueError as err:
        msg = str(err)
        for needle in ("ranks [1]",) + tuple(needles):
            assert needle in msg, f"{what}: {needle!r} not in the error: {msg}"
        print(f"INFO config {what} rank={r}: {' '.join(msg.split())[:300]}", flush=True)
    else:
        raise AssertionError(f"{what}: no error on rank {r}")


def check_config():
    r, n = hvd.rank(), hvd.size()
    one = r == 1

    def sgd(**kw):
        def make():
            m = model()
            args = dict(lr=0.1, momentum=0.0, weight_decay=0.0)
            args.update(kw)
            return pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), **args),
                                                m.named_parameters(), scheme="pgc-cr",
                                                stragglers=1, timeout=30)
        return make

    expect_config_error(sgd(lr=0.2 if one else 0.1), ["lr", "0.1", "0.2"], "lr")
    expect_config_error(sgd(momentum=0.9 if one else 0.0), ["momentum"], "momentum")
    expect_config_error(sgd(weight_decay=1e-4 if one else 0.0), ["weight_decay"], "weight_decay")

    def adam(betas):
        def make():
            m = model()
            return pgc_hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=1e-3,
                                                                 betas=betas),
                                                m.named_parameters(), stragglers=1, timeout=30)
        return make

    expect_config_error(adam((0.8, 0.999) if one else (0.9, 0.999)), ["betas"], "betas")

    def cls():
        m = model()
        base = (torch.optim.Adam(m.parameters(), lr=0.1) if one else
                torch.optim.SGD(m.parameters(), lr=0.1))
        return pgc_hvd.DistributedOptimizer(base, m.named_parameters(), stragglers=1, timeout=30)

    expect_config_error(cls, ["optimizer class", "Adam", "SGD"], "class")

    def kw(**k):
        return lambda: build(model(), k.pop("name", "cfg"), **k)

    expect_config_error(kw(name="other" if one else "cfg"), ["name", "other"], "name")
    expect_config_error(kw(optimistic=not one, control="allgather"), ["optimistic"], "optimistic")
    expect_config_error(kw(control="store" if one else "allgather"), ["control"], "control")

    def dtype():
        m = model(torch.float64 if one else torch.float32)
        return build(m, "cfg")

    expect_config_error(dtype, ["dtype", "float64"], "dtype")

    def groups():
        m = model()
        if one:
            base = torch.optim.SGD([{"params": m[0].parameters()},
                                    {"params": m[2].parameters(), "lr": 0.01}], lr=0.1)
        else:
            base = torch.optim.SGD(m.parameters(), lr=0.1)
        return pgc_hvd.DistributedOptimizer(base, m.named_parameters(), stragglers=1, timeout=30)

    expect_config_error(groups, ["param_groups (parameters per group)"], "groups")

    # the same settings on every rank pass, and train
    m = model()
    opt = build(m, "cfg-ok", optimistic=True, control="allgather")
    loader = data(n)
    while opt.version < 2:
        for xb, yb in opt.batches(loader):
            loss_of(m, xb, yb).backward()
        opt.step()
    opt.close()
    same_on_all_ranks(m, "cfg-ok")
    ok("config_fields_named")

    # the loader's partitioning, compared at the first batches()
    for what, loader, needles in (
            ("seed", data(n, seed=4 if one else 3), ["seed"]),
            ("batch_size", data(n, batch_size=16 if one else 12), ["batch_size"])):
        m = model()
        opt = build(m, f"ld-{what}")
        expect_config_error(lambda: next(iter(opt.batches(loader))), needles, f"loader {what}")
        opt.close()
        same_on_all_ranks(m, f"ld-{what}")
    ok("loader_partitioning_compared")


# -- a skipped backward inside batches() --------------------------------------------------------
def check_skipped_backward(scheme="pgc-cr"):
    """Rank 1's loop body skips backward (``continue``) at step 3: that slot got no gradient, so
    step() must refuse instead of sending a zero gradient, and every rank stops."""
    r = hvd.rank()
    m = model()
    loader = data(hvd.size())
    opt = build(m, "skipped", scheme=scheme)

    def run():
        while opt.version < 12:
            for xb, yb in opt.batches(loader):
                if r == 1 and opt.version == 3:
                    continue
                loss_of(m, xb, yb).backward()
            opt.step()
        opt.close()
    must_fail(run, (AgentError, RuntimeError))


def main():
    hvd.init()
    mode = sys.argv[1]
    if mode == "nonfinite":
        check_nonfinite_parameters(int(sys.argv[2]))
    elif mode == "diverged":
        check_diverged()
    elif mode == "clean":
        check_early_stop()
        check_dtypes()
    elif mode == "config":
        check_config()
    elif mode == "skipped":
        check_skipped_backward()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ALL OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
