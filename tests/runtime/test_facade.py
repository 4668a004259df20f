"""The facade on its own, in one process: ``pgc_hvd.DistributedOptimizer``
(:mod:`pgc_hvd.runtime.distributed`, :mod:`pgc_hvd.runtime.optimizer`) on a real Horovod world
of one rank (``hvd.init()`` without a launcher, as a user debugs a script), with its end of
life (:mod:`pgc_hvd.runtime.lifecycle`) and Horovod's optimizer-state broadcast
(:mod:`pgc_hvd.runtime.interop`). What the horovodrun tests cover at n >= 2 through the same
methods, here where one process shows it: Horovod's step API, getters that change nothing, the
state dict's version, ``start_at``, ``close()``'s final versions and digest."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

hvd = pytest.importorskip("horovod.torch")

import pgc_hvd  # noqa: E402
from pgc_hvd.data import CodedLoader  # noqa: E402
from pgc_hvd.runtime import interop, lifecycle  # noqa: E402
from pgc_hvd.runtime.distributed import DistributedOptimizer  # noqa: E402
from pgc_hvd.runtime.optimizer import PGCOptimizer  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    hvd.init()
    assert hvd.size() == 1
    yield


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def loader(n=1):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 6, generator=g)
    y = (X[:, 0] > 0).long()
    return CodedLoader(torch.utils.data.TensorDataset(X, y), n=n, batch_size=16, seed=2)


def make(m, name, **kw):
    return DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5),
                                m.named_parameters(), name=name, timeout=30, **kw)


def train(opt, m, data, steps):
    for _ in range(steps):
        for xb, yb in opt.batches(data):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()


def test_the_facade_is_the_users_optimizer_and_trains_with_horovods_step_api():
    m = model()
    opt = make(m, "facade")
    assert isinstance(opt, torch.optim.SGD) and type(opt).__bases__ == (torch.optim.SGD,)
    assert type(opt).step.__qualname__ == PGCOptimizer.step.__qualname__
    assert pgc_hvd.DistributedOptimizer is DistributedOptimizer
    data = loader()
    train(opt, m, data, 3)
    assert opt.version == 3 and opt.started and opt.catch_up_steps == 0
    # synchronize(), then step() under skip_synchronize(): the decoded update in p.grad
    for xb, yb in opt.batches(data):
        F.cross_entropy(m(xb), yb).backward()
    opt.synchronize()
    assert all(p.grad is not None for p in m.parameters())
    with opt.skip_synchronize():
        opt.step()
    assert opt.version == 4
    opt.close()
    assert opt.closed and opt.loop_end_versions == [4]


def test_no_getter_changes_state():
    """Reading every public property (the plan, whether this rank computes, the version,
    ...) before a step begins forms no plan and starts no clock; the step begins in
    batches()."""
    m = model()
    opt = make(m, "getters")
    data = loader()
    train(opt, m, data, 2)
    step = opt.current_step
    busy, version = step.busy, step.version
    for _ in range(2):
        for name in ("work_plan", "computes", "version", "metrics", "current_partition",
                     "busy_seconds", "staleness_bound", "started", "failed", "closed",
                     "nonfinite_log", "config", "encoder"):
            getattr(opt, name)
    assert step.plan is None and step.busy == busy and step.version == version
    plan = opt.work_plan
    gen = opt.batches(data)
    next(gen)
    assert step.plan is not None and step.plan.evaluate == plan.evaluate
    gen.close()
    opt.close()


def test_the_state_dicts_version_is_adopted_at_the_first_use():
    """``hvd.broadcast_optimizer_state`` carries ``param_groups[0]["pgc_version"]``; reading
    ``version`` shows it without adopting it; the first step adopts it."""
    m = model()
    opt = make(m, "adopt")
    opt.param_groups[0][interop.VERSION_KEY] = 7
    assert opt.version == 7 and opt.current_step.version == 0   # read, not adopted
    train(opt, m, loader(), 1)
    assert opt.version == 8
    opt.close()


def test_start_at_refuses_a_bad_version_and_a_started_run():
    m = model()
    opt = make(m, "start_at")
    with pytest.raises(ValueError, match="version must be an int >= 0"):
        opt.start_at(-1)
    opt.start_at(5)
    train(opt, m, loader(), 1)
    assert opt.version == 6
    with pytest.raises(RuntimeError, match="before the first step"):
        opt.start_at(0)
    opt.close()


def test_an_optimizer_not_closed_is_registered_for_the_end_of_training():
    m = model()
    opt = make(m, "unclosed")
    train(opt, m, loader(), 1)
    assert opt in [o for _, o in lifecycle.unclosed()]
    assert lifecycle.close_all() == []
    assert opt.closed and opt not in [o for _, o in lifecycle.unclosed()]
