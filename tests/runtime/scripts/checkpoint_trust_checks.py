"""Runs on every rank under horovodrun -np 2: checkpoints are read without running code in them.

    python checkpoint_trust_checks.py

1. resume: a dgd run saved at version 4 and resumed into a fresh model reaches version 8 with
   the parameters of an uninterrupted run; the RNG states (torch, numpy, Python) are those of the
   moment of the save.
2. a pickled callable: each rank's file carries, in ``extra``, an object whose ``__reduce__``
   calls ``os.system("touch MARKER")``; load_checkpoint refuses it on every rank with one message
   naming each rank's file, the global (``posix.system``) and the fix, the command never ran
   and the model and optimizer are untouched.
3. an earlier pgc_hvd's file (numpy's and Python's RNG states as their tuples, the numpy one a
   pickled array): refused with the command that converts it; after ``convert_checkpoint`` on
   each rank it restores and the resumed run again matches the uninterrupted one.

Files live in the current folder (the fixture runs each launch in a fresh tmp_path). Each check
prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import random

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd
from pgc_hvd.runtime import PartitionLoader, load_checkpoint, save_checkpoint
from pgc_hvd.runtime.checkpoint import convert_checkpoint

import checkpoint_checks   # this folder: the refusal check and params() shared with it
from checkpoint_checks import params
from checks import ok   # tests/checks.py

torch.set_num_threads(1)
MARKER = os.path.abspath("code-ran")


class RunsCode:
    """Unpickling it calls os.system: what a hostile checkpoint carries."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def model(seed=11):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 2))


def build(m, name):
    return pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                        m.named_parameters(), scheme="dgd", stragglers=0,
                                        name=name, timeout=30)


def run(m, opt, steps):
    g = torch.Generator().manual_seed(7)
    X = torch.randn(120, 6, generator=g)
    data = PartitionLoader(X, (X[:, 0] > 0).long(), hvd.size(), batch_size=12, seed=3)
    while opt.version < steps:
        for xb, yb in opt.batches(data):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    opt.close()


def rng_draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def refused(path, m, opt, *needles):
    """checkpoint_checks.refused (the CheckpointError names every needle; model, ring, version
    and RNG unchanged), with the same message on every rank."""
    msg = checkpoint_checks.refused(path, m, opt, *needles)
    checkpoint_checks.same_message_on_all_ranks(msg)
    return msg


def resumed(path, name):
    """A fresh model restored from ``path`` and trained on to version 8."""
    m = model(seed=5)
    opt = build(m, name)
    load_checkpoint(path, m, opt)
    assert opt.version == 4, opt.version
    run(m, opt, 8)
    return params(m)


def main():
    hvd.init()
    r = hvd.rank()
    ref = model()
    run(ref, build(ref, "ref"), 8)

    # 1. resume: identical parameters, RNG states of the save
    m = model()
    opt = build(m, "first")
    run(m, opt, 4)
    torch.manual_seed(100 + r), np.random.seed(200 + r), random.seed(300 + r)
    save_checkpoint("good", m, opt, extra={"epoch": 4, "note": "ok"})
    at_save = rng_draws()
    m2 = model(seed=5)
    opt2 = build(m2, "resume")
    assert load_checkpoint("good", m2, opt2) == {"epoch": 4, "note": "ok"}
    assert rng_draws() == at_save, "the RNG states were not those of the save"
    run(m2, opt2, 8)
    assert torch.equal(params(m2), params(ref)), "the resumed run differs"
    ok("resume_identical")

    # 2. a pickled callable is refused, and never runs
    state = torch.load(f"good.rank{r}", weights_only=True)
    torch.save({**state, "extra": {"x": RunsCode()}}, f"evil.rank{r}")
    m3 = model(seed=5)
    opt3 = build(m3, "evil")
    msg = refused("evil", m3, opt3, "evil.rank0", "evil.rank1", "posix.system",
                  "weights_only=True", "Do not load a file of unknown origin")
    assert not os.path.exists(MARKER), "unpickling the checkpoint ran its command"
    ok("pickled_callable_refused")

    # 3. an earlier pgc_hvd's checkpoint: refused with the conversion, converted, restored
    rng = state["pgc"]["rng"]
    npr, pyr = rng["numpy"], rng["python"]
    legacy_rng = {**rng,
                  "numpy": (npr["kind"], npr["key"].numpy().astype(np.uint32), npr["pos"],
                            npr["has_gauss"], npr["cached_gaussian"]),
                  "python": (pyr["version"], tuple(pyr["state"].tolist()), pyr["gauss_next"])}
    torch.save({**state, "pgc": {**state["pgc"], "rng": legacy_rng}}, f"old.rank{r}")
    refused("old", m3, opt3, "old.rank0", "written by an earlier pgc_hvd",
            "convert_checkpoint('old.rank0')")
    assert convert_checkpoint(f"old.rank{r}") == f"old.rank{r}"
    opt3.close()
    assert torch.equal(resumed("old", "old"), params(ref)), "the converted file resumes otherwise"
    ok("legacy_converted")
    print(f"ALL OK rank={r}", flush=True)


if __name__ == "__main__":
    main()
