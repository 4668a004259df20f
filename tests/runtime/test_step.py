"""The step on its own, in one process: :class:`~pgc_hvd.runtime.step.Step`,
:class:`~pgc_hvd.runtime.capture.GradientCapture` (the faults: tests/runtime/test_faults.py)
with a real model, real gradients, the compiled extension and the real
:class:`~pgc_hvd.runtime.agent.CommAgent` on a world of one rank (``LoopbackChannel``: the agent
decides every step from this rank's message alone; it is not what is tested here). What the
horovodrun tests cover through the facade, one part at a time: the gradient hooks and their
refusals, AMP unscaling, the ``zero_grad`` guard, the message's formation and its checks, the
update in ``p.grad`` (``op`` factor, ``on_update``, fp16/bf16 parameters), the user's rule with
the momentum correction, the hyper-parameter digest, the clock, and getters that change
nothing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.control.momentum import implicit_momentum
from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime.agent import CommAgent
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.capture import GradientCapture
from pgc_hvd.runtime.step import Step, all_finite, declared_metrics, hyper_digest
from pgc_hvd.runtime.rows import ctrl_len
from pgc_hvd.schemes import Ring, get_scheme


def data(seed=0, rows=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 5, generator=g), torch.randint(0, 3, (rows,), generator=g)


class World:
    """One rank's step over a real model and agent (``scheme`` at n = ``n``)."""

    def __init__(self, scheme="dgd", n=1, s=0, dtype=torch.float32, lr=0.1, momentum=0.0,
                 start=True, passes=1, **step_kw):
        torch.manual_seed(3)
        self.model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(dtype)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum)
        self.layout = lay = FlatLayout([p for g in self.opt.param_groups for p in g["params"]])
        self.scheme = get_scheme(scheme, n, s)
        ring = Ring(self.scheme, 0)
        self.encoder = MessageEncoder(lay.numel, None, complex_messages=ring.complex,
                                      device="cpu")
        self.agent = CommAgent(None, self.scheme, 0, lay.numel, self.scheme.lookback,
                               codec=self.encoder.codec, device="cpu", poll_interval=0.001,
                               timeout=30, optimistic=True, reports=True,
                               channel=LoopbackChannel(ctrl_len(n), lay.numel))
        self.capture = GradientCapture(lay, ring, ring_mode=bool(self.scheme.pipelined
                                                                  or ring.complex),
                                       passes_per_step=passes, scheme=self.scheme, rank=0)
        self.step = Step(self.capture, self.encoder, self.agent, self.scheme, 0,
                         param_groups=self.opt.param_groups, **step_kw)
        self.capture.attach()
        if start:
            self.step.start()

    def loss(self, seed=0, scale=1.0):
        X, y = data(seed)
        return F.cross_entropy(self.model(X.to(self.layout.params[0].dtype)).float(), y) * scale

    def true_grad(self, seed=0) -> torch.Tensor:
        """The gradient of :meth:`loss`, computed apart (hooks off, p.grad restored)."""
        saved = [p.grad for p in self.layout.params]
        self.capture.remove_hooks()
        for p in self.layout.params:
            p.grad = None
        self.loss(seed).backward()
        g = torch.cat([p.grad.detach().float().reshape(-1) for p in self.layout.params])
        for p, old in zip(self.layout.params, saved):
            p.grad = old
        self.capture.attach()
        return g

    def evaluate(self, seed=0, scale=1.0):
        """What ``batches()`` does for every partition of the plan: begin its slot, backward."""
        plan = self.step.begin()
        for i, (_, slot) in enumerate(plan.evaluate):
            self.capture.begin(slot, plan, self.step.version)
            self.loss(seed, scale).backward()
            if i + 1 < len(plan.evaluate):
                self.capture.end_pending(plan, self.step.version)
            else:
                self.capture.last_batch_done()

    def decide(self, **send_kw):
        self.step.send(**send_kw)
        self.agent.wait_for(self.step.version)
        self.step.load(self.agent.take(self.step.version))

    def close(self):
        self.capture.remove_hooks()
        if self.step.started:
            self.agent.finish()


def grads(params) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().reshape(-1) for p in params])


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in params])


@pytest.fixture
def world(request):
    made = []

    def make(*args, **kw):
        made.append(World(*args, **kw))
        return made[-1]
    yield make
    for w in made:
        w.close()


# -- the message and the update --------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["dgd", "pgc-cr"])
def test_one_step_sends_the_gradient_and_applies_it_with_the_users_rule(world, scheme):
    w = world(scheme)
    g = w.true_grad()
    before = flat(w.layout.params)
    w.evaluate()
    w.decide(loss=1.5)
    assert torch.allclose(grads(w.layout.params), g, atol=1e-6)   # n = 1: the update is g
    assert w.step.metrics(())["loss"] == pytest.approx(1.5)
    w.step.apply(w.opt.step, correct_momentum=False)
    assert torch.allclose(flat(w.layout.params), before - 0.1 * g, atol=1e-6)
    assert w.step.version == 1 and w.step.plan is None
    assert all(p.grad is None for p in w.layout.params)
    assert w.step.busy > 0.0


def test_a_step_reports_its_wait_and_data_phase(world):
    """What a profile of the step reads without reaching in: the exchange's wait for the
    decision (``Step.wait_seconds``) and the agent's data phase (the update's
    ``info["data_seconds"]``), on every rank."""
    w = world("pgc-cr")
    assert w.step.wait_seconds == 0.0
    w.evaluate()
    assert w.step.exchange(loss=1.0) is True
    w.step.load_decided()
    assert w.step.wait_seconds >= 0.0
    info = w.step.last.info
    assert 0.0 <= info["data_seconds"] < 60 and info["control_rounds"] >= 1


def test_hvd_sum_multiplies_the_update_by_n_and_on_update_sees_it_first(world):
    seen = []
    w = world(op_scale=3.0, on_update=lambda t, flat_, decision: seen.append(
        (t, flat_.clone(), decision.step)))
    g = w.true_grad()
    w.evaluate()
    w.decide()
    (t, first, dstep), = seen
    assert t == 0 and dstep == 0 and torch.allclose(first, g, atol=1e-6)
    assert torch.allclose(grads(w.layout.params), 3.0 * g, atol=1e-5)


def test_on_update_with_two_arguments(world):
    seen = []
    w = world(on_update=lambda t, flat_: seen.append(t))
    w.evaluate()
    w.decide()
    assert seen == [0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_parameters_get_the_update_in_their_dtype(world, dtype):
    w = world(dtype=dtype)
    g = w.true_grad()
    w.evaluate()
    w.decide()
    for p in w.layout.params:
        assert p.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float64 else 2e-2
    assert torch.allclose(grads(w.layout.params), g, atol=tol)
    w.step.apply(w.opt.step, correct_momentum=False)   # the rule runs in the params' dtype
    assert all(p.dtype == dtype for p in w.layout.params)


def test_amp_scale_is_divided_out_of_the_message(world):
    w = world()
    g = w.true_grad()
    w.evaluate(scale=1024.0)   # a GradScaler's scaled loss
    w.decide(grad_scale=1024.0)
    assert torch.allclose(grads(w.layout.params), g, atol=1e-5)
    assert w.capture.amp


def test_clipping_the_decoded_update_before_the_rule(world):
    """Horovod's way: synchronize (the update in p.grad), clip it, then step()."""
    w = world()
    w.evaluate()
    w.decide()
    before = flat(w.layout.params)
    torch.nn.utils.clip_grad_norm_(w.layout.params, 1e-3)
    clipped = grads(w.layout.params)
    assert float(clipped.norm()) == pytest.approx(1e-3, rel=1e-3)
    w.step.apply(w.opt.step, correct_momentum=False)
    assert torch.allclose(flat(w.layout.params), before - 0.1 * clipped, atol=1e-7)


def test_momentum_correction_runs_the_rule_with_the_reduced_momentum(world):
    w = world(momentum=0.9)
    w.evaluate()
    w.decide()
    w.step.last.decision.info["mean_age"] = 2.0   # a stale update (pipelined schemes)
    seen = []

    def rule():
        seen.append((w.opt.param_groups[0]["momentum"], w.opt.param_groups[0]["lr"]))
        w.opt.step()
    w.step.apply(rule, correct_momentum=True)
    beta = max(0.0, 0.9 - implicit_momentum(2.0))   # beta' = max(0, beta - mu_imp(age))
    assert beta < 0.9
    assert seen == [(pytest.approx(beta), pytest.approx(0.1 * (1 - beta) / (1 - 0.9)))]
    assert w.opt.param_groups[0]["momentum"] == 0.9 and w.opt.param_groups[0]["lr"] == 0.1


def test_hyper_digest_follows_every_applied_update_and_its_hyper_parameters(world):
    a, b = world(), world()
    for w, lr in ((a, 0.1), (b, 0.2)):
        w.opt.param_groups[0]["lr"] = lr
        w.evaluate()
        w.decide()
        w.step.apply(w.opt.step, correct_momentum=False)
    assert a.step.hyper_digest != b.step.hyper_digest
    assert a.step.hyper_digest == hyper_digest(a.opt.param_groups, 0)


def test_slots_without_a_gradient_are_named(world):
    w = world()
    w.step.begin()
    with pytest.raises(RuntimeError, match=r"slots \[0\] got no gradient"):
        w.step.send()


def test_non_finite_messages_are_never_sent():
    assert all_finite(torch.tensor([1.0, -2.0]))
    assert all_finite(torch.full((4,), 3e38))   # the sum overflows, the entries do not
    assert not all_finite(torch.tensor([1.0, math.nan]))
    assert not all_finite(torch.tensor([1.0, math.inf]))
    assert not all_finite(torch.tensor([1 + 1j, complex(math.inf, 0)]))


def test_declared_metrics_are_the_control_rows_floats():
    assert declared_metrics(("acc", "top5"), {"acc": 0.5}) == (0.5, pytest.approx(math.nan,
                                                                                 nan_ok=True))
    assert declared_metrics((), None) == ()
    with pytest.raises(ValueError, match=r"not declared: pass metrics=\['acc', 'x'\]"):
        declared_metrics(("acc",), {"x": 1.0})
    with pytest.raises(TypeError, match="numbers"):
        declared_metrics(("acc",), {"acc": "high"})


# -- the plan, the clock, getters ------------------------------------------------------------
def test_reading_the_plan_changes_nothing(world):
    w = world(start=False)
    plan = w.step.peek_plan()
    assert w.step.would_compute() and w.step.plan is None and w.step.busy == 0.0
    assert w.step.begin().evaluate == plan.evaluate and w.step.plan is not None


def test_a_rank_behind_catches_up_without_computing(world):
    w = world()
    w.evaluate()
    w.decide()
    w.step.apply(w.opt.step, correct_momentum=False)
    w.step.version = 0          # as if the update of step 0 had been decided without this rank
    w.step.next()
    assert not w.step.would_compute()
    w.step.begin()
    assert not w.step.computes


def test_replayed_steps_compute_exactly_as_recorded(world):
    w = world(start=False, replay_steps=(0, 2))
    computes = []
    for version in (0, 1, 2):
        w.step.version = version
        computes.append(w.step.would_compute())
    assert computes == [True, False, True]


# -- the capture's hooks and guards ----------------------------------------------------------
def test_a_backward_outside_batches_begins_the_step_for_own_partition_schemes(world):
    w = world()
    w.loss().backward()             # no batches(): dgd asks for this rank's own partition
    assert w.step.plan is not None and w.capture.target_slot is not None
    w.decide()


def test_a_backward_outside_batches_is_refused_where_partitions_rotate(world):
    w = world("gc-cr", n=2, s=1, start=False)
    with pytest.raises(RuntimeError, match="outside optimizer.batches"):
        w.loss().backward()


def test_zero_grad_between_backward_and_step_is_refused(world):
    w = world()
    w.evaluate()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward"):
        w.capture.check_zero_grad(w.step.version)


def test_more_backward_passes_than_declared_are_refused(world):
    w = world(passes=1)
    w.evaluate()
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1"):
        w.loss().backward()


def test_a_gradient_changed_after_the_last_backward_is_refused_where_it_is_one_of_several(
        world):
    w = world("gc-cr", n=2, s=1, start=False)
    w.evaluate()                    # two partitions; the last one's gradient still in p.grad
    torch.nn.utils.clip_grad_norm_(w.layout.params, 1e-3)
    with pytest.raises(RuntimeError, match="p.grad was changed after the last backward"):
        w.capture.check_untouched(w.step.plan, 0, None)


# -- the partition's gradient into its slot ---------------------------------------------------
class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops that run inside the mode (their names)."""

    def __init__(self):
        super().__init__()
        self.names: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("loop_fed", [False, True])
def test_a_partitions_gradient_moves_into_its_slot_in_one_op(world, loop_fed):
    """``p.grad`` of every parameter into the slot by one concatenation (an add into a view per
    parameter cost 10-15 us each on the step's path); fed by the loop (the DDP door), GC's one
    partition goes straight into the message."""
    w = world("dgd")
    if loop_fed:
        w.capture.feed_from_loop(w.step.version)
    want = w.true_grad(0)
    plan = w.step.begin()
    w.capture.begin(plan.evaluate[0][1], plan, w.step.version)
    w.loss(0).backward()
    with _Ops() as ops:
        w.capture.end(plan, w.step.version)
    assert ops.names.count("cat.out") == 1 and "add_.Tensor" not in ops.names, ops.names
    torch.testing.assert_close(w.capture.msg, want)
    assert all(p.grad is None for p in w.layout.params)


def test_a_parameter_without_a_gradient_or_of_another_dtype_is_moved_too(world):
    w = world("dgd", dtype=torch.float64)
    want = w.true_grad(0).clone()
    plan = w.step.begin()
    w.capture.begin(plan.evaluate[0][1], plan, w.step.version)
    w.loss(0).backward()
    first = w.layout.params[0]
    k = first.numel()
    first.grad = None                 # no gradient: zeros in its segment
    want[:k] = 0
    w.capture.end(plan, w.step.version)
    torch.testing.assert_close(w.capture.msg, want.float())


def test_the_hyper_digest_terms_are_cached_by_value_and_type():
    """The digest of a step is a lookup while the hyper-parameters stay; 1, 1.0 and True are
    equal keys of a dict but distinct hyper-parameters."""
    ints, floats = [{"params": [], "lr": 1}], [{"params": [], "lr": 1.0}]
    assert hyper_digest(ints, 0) != hyper_digest(floats, 0)
    assert hyper_digest(ints, 0) == hyper_digest([{"params": [], "lr": 1}], 0)
    tensors = [{"params": [], "lr": torch.tensor(0.5)}]      # no key: computed each time
    assert hyper_digest(tensors, 0) == hyper_digest([{"params": [], "lr": 0.5}], 0)


def test_a_sparse_gradient_is_moved_too(world):
    w = world("dgd")
    want = w.true_grad(0)
    plan = w.step.begin()
    w.capture.begin(plan.evaluate[0][1], plan, w.step.version)
    w.loss(0).backward()
    first = w.layout.params[0]
    first.grad = first.grad.to_sparse()      # an embedding's sparse=True gradient, say
    w.capture.end(plan, w.step.version)
    torch.testing.assert_close(w.capture.msg, want)
