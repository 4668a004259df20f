"""Runs on every rank under horovodrun -np 2: the pgc_hvd modules one steady-state step of dense
pgc-cr enters, on the default control plane, both threads.

    python step_path_checks.py          # under horovodrun: the Horovod door
    python step_path_checks.py ddp      # under torchrun: the DDP door

Warms up a few steps, then profiles ONE step, from ``opt.batches(loader)`` to the return of
``opt.step()``: ``sys.setprofile`` on the training thread, ``threading.setprofile`` (set before
the optimizer starts its agent thread) on every other thread. A module counts when a Python
function of its file is called during that step on either thread; the loader
(:class:`pgc_hvd.data.CodedLoader`) and the kernels' Python side are included. Each rank prints
``STEP-PATH modules=<count> rank=<r>`` and one ``STEP-PATH-MODULE rank=<r> <threads> <module>``
line per module (``<threads>``: ``train``, ``agent`` or ``train+agent``); every rank prints ``CHECK step_path ok rank=<r>`` and ``ALL OK rank=<r>``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import pgc_hvd
from pgc_hvd.data import CodedLoader

PACKAGE = str(Path(pgc_hvd.__file__).resolve().parent) + "/"
WARMUP = 4


class StepProfile:
    """The pgc_hvd modules entered while :attr:`on`, per thread kind ("train" / "agent")."""

    def __init__(self):
        self.on = False
        self.entered: dict[str, set] = {"train": set(), "agent": set()}
        self.main = threading.get_ident()

    def __call__(self, frame, event, arg):
        if self.on and event == "call":
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE):
                kind = "train" if threading.get_ident() == self.main else "agent"
                self.entered[kind].add(path[len(PACKAGE):])

    def modules(self) -> list[str]:
        return sorted(self.entered["train"] | self.entered["agent"])


def horovod_door():
    """``pgc_hvd.DistributedOptimizer`` fed by ``opt.batches(CodedLoader)`` under horovodrun."""
    import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(11)
    m = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 2))
    X, y = data()
    loader = CodedLoader(TensorDataset(X, y), n=hvd.size(), batch_size=12, seed=3)
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5),
                                       m.named_parameters(), scheme="pgc-cr", stragglers=1,
                                       name="step_path", timeout=60)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)

    def one_step():
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()

    return hvd.rank(), opt, one_step


def ddp_door():
    """``pgc_hvd.DistributedDataParallel`` with ``CodedSampler`` in a DataLoader under torchrun
    (the DDP tutorial's loop body: next batch, zero_grad, forward, backward, step)."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    dist.init_process_group("gloo")
    torch.manual_seed(11)
    m = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 2))
    ds = TensorDataset(*data())
    loader = DataLoader(ds, batch_size=12, sampler=pgc_hvd.CodedSampler(ds, 12, seed=3))
    model = pgc_hvd.DistributedDataParallel(m, scheme="pgc-cr", stragglers=1, name="step_path",
                                            timeout=60)
    opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    batches = iter(loader)

    def one_step():
        xb, yb = next(batches)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()

    return dist.get_rank(), opt, one_step


def data():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(240, 6, generator=g)
    return X, ((X[:, 0] + 0.5 * X[:, 1]) > 0).long()


def main() -> None:
    torch.set_num_threads(1)
    profile = StepProfile()
    threading.setprofile(profile)   # the agent thread starts after this (at the first step)
    door = sys.argv[1] if len(sys.argv) > 1 else "horovod"
    r, opt, one_step = (ddp_door if door == "ddp" else horovod_door)()
    for _ in range(WARMUP):
        one_step()
    sys.setprofile(profile)
    profile.on = True
    one_step()
    profile.on = False
    sys.setprofile(None)
    threading.setprofile(None)
    mods = profile.modules()
    print(f"STEP-PATH modules={len(mods)} rank={r}", flush=True)
    for mod in mods:
        where = "+".join(k for k in ("train", "agent") if mod in profile.entered[k])
        print(f"STEP-PATH-MODULE rank={r} {where} {mod}", flush=True)
    assert opt.version == WARMUP + 1, opt.version
    opt.close()
    print(f"CHECK step_path ok rank={r}", flush=True)
    print(f"ALL OK rank={r}", flush=True)


if __name__ == "__main__":
    main()
