"""The wiring on its own, in one process: :func:`~pgc_hvd.runtime.wiring.build_parts` (the
scheme-dependent parts the facade builds at construction and at a re-plan of
``stragglers="auto"``) and :func:`~pgc_hvd.runtime.wiring.carry_over` (what a re-plan keeps),
on a real Horovod world of one rank. The re-plan itself across ranks:
tests/control/scripts/auto_s_checks.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

hvd = pytest.importorskip("horovod.torch")

from pgc_hvd.data import CodedLoader  # noqa: E402
from pgc_hvd.flat_layout import FlatLayout  # noqa: E402
from pgc_hvd.runtime.distributed import DistributedOptimizer  # noqa: E402
from pgc_hvd.runtime.step_records import StepRecorder  # noqa: E402
from pgc_hvd.runtime.wiring import Parts, build_parts, carry_over  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    hvd.init()
    assert hvd.size() == 1
    yield


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def loader():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 6, generator=g)
    return CodedLoader(torch.utils.data.TensorDataset(X, (X[:, 0] > 0).long()), n=1,
                       batch_size=16, seed=2)


_BUILT: list = []


def request_stop(parts) -> None:
    """Stop ``parts``' control-log reader when the test ends (:func:`stop_built_parts`)."""
    _BUILT.append(parts)


@pytest.fixture(autouse=True)
def stop_built_parts():
    """The parts a test built by hand (their agent never started): their control log's reader
    thread stopped (``LogChannel.stop``), so none outlives the test blocked in a store ``get``
    (a reader whose wait ends while the interpreter exits aborts it)."""
    yield
    while _BUILT:
        _BUILT.pop().agent.channel.stop()


def test_the_parts_are_wired_to_each_other_and_tell_the_recorder():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5)
    first = DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1),
                                 name="wiring.cfg", timeout=30, scheme="pgc-cr")
    cfg = first.config
    first.close()
    lay = FlatLayout(list(m.parameters()))
    rec = StepRecorder(None, None, scheme_name="?", n=1, s=7)
    parts = build_parts(hvd, cfg, rank=0, n=1, layout=lay, names={}, reports=False,
                        param_groups=opt.param_groups, name="wiring.a", recorder=rec)
    # its agent never starts: its control log's reader thread is stopped when the test ends
    # (one left blocked in the store's get would outlive the session and abort the exit)
    request_stop(parts)
    assert isinstance(parts, Parts)
    assert parts.scheme.name == "pgc-cr" and parts.scheme.n == 1 and parts.scheme.s == 0
    assert parts.step.capture is parts.capture and parts.step.encoder is parts.encoder
    assert parts.step.agent is parts.agent and parts.faults.agent is parts.agent
    assert parts.agent.scheme is parts.scheme and parts.capture.scheme is parts.scheme
    assert (rec.scheme_name, rec.s) == ("pgc-cr", 0)
    assert parts.capture.buckets is None or len(parts.capture.buckets.ranges) >= 1


def test_a_replans_parts_continue_where_the_old_ones_stopped():
    m, data = model(), loader()
    opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                               m.named_parameters(), name="wiring.old", timeout=30,
                               scheme="pgc-cr")
    for _ in range(3):
        for xb, yb in opt.batches(data):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    step = opt.current_step
    old = Parts(opt.scheme, opt.encoder, step.capture, opt.agent, step, None, False)
    new = build_parts(hvd, opt.config, rank=0, n=1, layout=FlatLayout(list(m.parameters())),
                      names={}, param_groups=opt.param_groups, reports=False,
                      name="wiring.new")
    request_stop(new)
    step.capture.amp = True   # a habit seen at the first step
    carry_over(old, new)
    assert new.step.version == step.version == 3
    assert new.step.busy == step.busy > 0 and new.step.hyper_digest == step.hyper_digest
    assert new.step.last is step.last and new.step.may_stream == step.may_stream
    assert new.capture.amp and new.capture.loop_fed == step.capture.loop_fed
    assert new.agent is not opt.agent and not new.step.started
    opt.close()


def test_delay_and_its_old_name_delays_reach_the_step():
    """``delay=`` reaches the step; ``delays=``, its old name, too, with one FutureWarning a
    process (:func:`pgc_hvd.runtime.config.renamed_keyword`, the one place it is read)."""
    import warnings

    from pgc_hvd.delays import Exponential
    from pgc_hvd.runtime.config import WARNED_RENAMES
    for i, key in enumerate(("delay", "delays")):
        before = "delays" in WARNED_RENAMES
        m = model()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt = DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                       m.named_parameters(), name=f"wiring.delay{i}",
                                       timeout=30, **{key: "exp:mean=0.001,seed=1"})
        try:
            assert isinstance(opt.config.delay, Exponential)
            assert opt.current_step.delay is opt.config.delay
            old = [w for w in seen if issubclass(w.category, FutureWarning)]
            assert len(old) == (key == "delays" and not before), [str(w.message) for w in old]
        finally:
            opt.close()
    assert "delays" in WARNED_RENAMES
