"""Runs on every rank (horovodrun or torchrun, ``pgc_hvd.engine()`` picks the engine):
``stragglers="auto"`` in the runtime.

    python auto_s_checks.py [STEPS]

1. refusals before any collective: ``stragglers="auto"`` with ``s_max`` above n - 1, and a
   fixed s above n - 1, raise ValueError naming the fix on every rank (no collective runs:
   the ranks go on to the next check without a hang);
2. a switch: pgc-cr from s = 0, one rank persistently slow (``slow:worker=n-1``): the rule
   raises s at an early boundary (step 2 or 3, before ``first`` = 4: the runtime's default
   ``early_gain``) on every rank at the same version, the optimizer
   re-plans (code, ring, agent) and trains on; every rank saw the same switches, every loop
   ends at the same version with identical parameters (cross-rank hash); then every rank
   saves a checkpoint (``save_checkpoint``, at s = 1) and a new run under auto, starting at
   s = 0, restores it (``load_checkpoint``: a file of another s gives the model, torch's state
   and the step, with an empty ring) and trains on, identical parameters again;
3. and back: pgc-cr from s = 1 on the control plane, no straggler at first and a heavy
   staleness cost: s goes to 0 at step 4, whose steps run no control round (the rows ride in
   the data allreduce, runtime/sum_rows.py; records' control_ops 0), then a rank turns slow
   (transient from step 10) and s goes back to 1 (the control plane) at step 12, the rows of
   the s = 0 steps having fed the rule; identical parameters at the end.

Checks print "CHECK <name> ok rank=<r>".
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

import pgc_hvd

hvd = pgc_hvd.engine()
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "runtime", "scripts"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from consistency_fault_checks import data, model, same_on_all_ranks, same_version_on_all_ranks  # noqa: E402
from checks import ok  # noqa: E402


def refusals(n: int) -> None:
    m = model()
    for kw, words in ((dict(stragglers="auto", auto={"s_max": n}), "s_max <="),
                      (dict(stragglers=n), "s in [0")):
        try:
            pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                         named_parameters=m.named_parameters(), scheme="pgc-cr",
                                         timeout=30, **kw)
        except ValueError as err:
            assert words in str(err), err
            print(f"CLEAR-ERROR rank={hvd.rank()}: {err}", flush=True)
        else:
            raise SystemExit(f"{kw} was not refused at n = {n}")
    try:
        pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                     named_parameters=m.named_parameters(), scheme="pgc-cr",
                                     stragglers=1, auto={"s_max": 1})
    except ValueError as err:
        assert "stragglers='auto'" in str(err), err
    else:
        raise SystemExit("auto options with a fixed s were not refused")
    ok("auto_refused_before_any_collective")


def switch(n: int, steps: int) -> None:
    m = model()
    loader = data(n)
    records = []
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        named_parameters=m.named_parameters(), scheme="pgc-cr", stragglers="auto",
        auto={"s_start": 0, "s_max": 1, "first": 4, "every": 4, "cooldown": 4, "window": 6},
        delay=f"slow:worker={n - 1},delay=0.05", timeout=60, name="autos",
        on_record=records.append if hvd.rank() == 0 else None)
    assert opt.config.stragglers == 0 and opt.scheme.s == 0
    while opt.version < steps:
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    auto = opt.auto_stragglers
    sw = [(d["step"], d["old_s"], d["new_s"]) for d in auto.switches]
    assert sw and sw[0][1:] == (0, 1) and 1 <= sw[0][0] < 4, sw    # early: before first = 4
    at = sw[0][0]
    assert opt.scheme.s == auto.s == 1, (opt.scheme.s, auto.s)
    v = same_version_on_all_ranks(opt, "auto")
    assert v == steps, v
    allsw = hvd.allgather(torch.tensor([hash(tuple(sw)) & 0xFFFFFFFF], dtype=torch.int64),
                          name="audit.auto.switches")
    assert len(set(allsw.tolist())) == 1, f"switches differ across ranks: {allsw.tolist()}"
    opt.close()
    same_on_all_ranks(m, "auto")
    if hvd.rank() == 0:
        got = [r.extra["auto_s"][0]["new_s"] for r in records if r.extra.get("auto_s")]
        assert got[:1] == [1], got
        assert records[at - 1].s == 0 and records[at].s == 1, [r.s for r in records[:6]]
        why = records[at - 1].extra["auto_s"][0]["reason"]
        assert "predicted progress/s" in why and "early boundary" in why, why
    resume_at_another_s(m, opt, steps, n)
    ok("auto_switch_identical_parameters")


def resume_at_another_s(m, opt, steps: int, n: int) -> None:
    """``load_checkpoint`` under auto of a file saved at another s (module doc, 2)."""
    import tempfile
    from pgc_hvd.runtime import load_checkpoint, save_checkpoint
    pid = hvd.allgather(torch.tensor([os.getpid()], dtype=torch.int64), name="audit.auto.pid")
    path = os.path.join(tempfile.gettempdir(), f"pgc-auto-resume-{int(pid[0])}")
    try:
        save_checkpoint(path, m, opt)
        m2 = model()
        opt2 = pgc_hvd.DistributedOptimizer(
            torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9),
            named_parameters=m2.named_parameters(), scheme="pgc-cr", stragglers="auto",
            auto={"s_start": 0, "s_max": 1}, timeout=60, name="autoresume")
        load_checkpoint(path, m2, opt2)
    finally:
        hvd.allgather(torch.zeros(1), name="audit.auto.loaded")   # every rank read its file
        if os.path.exists(f"{path}.rank{hvd.rank()}"):
            os.remove(f"{path}.rank{hvd.rank()}")
    assert opt2.version == steps and opt2.scheme.s == 0, (opt2.version, opt2.scheme.s)
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    assert opt2.state_dict()["state"][0]["momentum_buffer"].equal(
        opt.state_dict()["state"][0]["momentum_buffer"])
    loader = data(n)
    while opt2.version < steps + 2:
        for xb, yb in opt2.batches(loader):
            F.cross_entropy(m2(xb), yb).backward()
        opt2.step()
    opt2.close()
    same_on_all_ranks(m2, "autoresume")


def switch_back(n: int, steps: int = 16) -> None:
    import time
    m = model()
    loader = data(n)
    records, modes = [], {}
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        named_parameters=m.named_parameters(), scheme="pgc-cr", stragglers="auto",
        auto={"s_start": 1, "s_max": 1, "first": 4, "every": 4, "cooldown": 4, "window": 6,
              "staleness_cost": 1.0, "early_gain": None},   # the regular boundaries only
        # the slow steps dear enough that s = 1 pays at the first boundary after they start
        # (step 12) whatever fixed cost a step pays on a loaded machine (the model calibrates
        # it from the rows' ready times: up to ~0.19 s a step here)
        delay=f"transient:n={n},count=1,delay=0.6,start=10,stop=1000", timeout=60,
        name="autoback", on_record=records.append if hvd.rank() == 0 else None)
    while opt.version < steps:
        modes[opt.version] = (opt.scheme.s, opt.agent.sum_rows is not None)
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
            time.sleep(0.03)            # every rank computes: tau, not a delay
        opt.step()
    sw = [(d["step"], d["old_s"], d["new_s"]) for d in opt.auto_stragglers.switches]
    assert sw == [(4, 1, 0), (12, 0, 1)], sw
    assert all(modes[v] == ((0, True) if 4 <= v < 12 else (1, False)) for v in modes), modes
    opt.close()
    same_on_all_ranks(m, "autoback")
    if hvd.rank() == 0:
        ops = [r.extra["control_ops"] for r in records]
        assert ops[5:12] == [0] * 7 and all(o > 0 for o in ops[1:4] + ops[13:15]), ops
    ok("auto_switch_to_s0_and_back")


def main() -> None:
    if not hvd.is_initialized():
        hvd.init()
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    refusals(hvd.size())
    switch(hvd.size(), steps)
    switch_back(hvd.size())


if __name__ == "__main__":
    main()
