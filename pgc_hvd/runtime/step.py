"""One step of this rank, on the training thread: capture, plan, message, update, and the
replicas' randomness and first-step data.

Three objects, the ones a step crosses (the facade, :mod:`pgc_hvd.runtime.optimizer`, drives
them; docs/architecture.md, "The runtime's parts"):

* :class:`GradientCapture` (the part the gradient hooks hold): where each backward pass's
  gradient goes, up to the ring slots. It owns the ring buffers (one flat fp32 d-vector per
  slot; GC's accumulate mode keeps one slot and the message), the partition being evaluated,
  the gradient hooks and what they count (``backward_passes_per_step``), the AMP unscaling of a
  step's slots, and the checks of a loop that does something the scheme cannot follow (a
  backward outside ``batches()`` for a scheme whose partitions rotate, ``p.grad`` changed after
  the last backward where several partitions were evaluated, ``zero_grad()`` before
  ``step()``). When a hook starts a partition implicitly it asks the step for the current
  ``(plan, version)`` (:meth:`Step.current`).
* :class:`Step`: the model version t (the number of decided updates applied), the step's plan
  (which partitions this rank evaluates at t, whether it computes at t -- a rank whose step was
  decided without it catches up -- and whether the step was overtaken under
  ``straggler_policy="cancel"``), the compute clock (busy seconds, sent in the control rows),
  the path of the message (end the partition still in ``p.grad``, refuse slots that got no
  gradient, unscale under AMP, form it -- :class:`~pgc_hvd.compress.codecs.MessageEncoder`,
  straight into the payload row when rows are dense --, inject the configured delay, check it
  is finite, encode it, hand it to the agent) and the update (the decided update into
  ``p.grad`` in each parameter's dtype: ``on_update``, Horovod's ``op`` factor, the user's rule
  with the momentum correction around it, the hyper-parameter digest compared at ``close()``).
* :class:`FaultMonitor`: the step's faults. How far the agent's log of non-finite messages
  has been looked at, the check of this rank's parameters that it triggers after an update
  (:meth:`FaultMonitor.check_params`), the report of a failure to the other ranks
  (:meth:`FaultMonitor.fail`), and the explanation added to an
  :class:`~pgc_hvd.runtime.errors.AgentError` from its typed ``failed_ranks`` (never from its
  text). The agent is used through its public members (``bad_log``, ``fail``, ``cond``,
  ``error``).

The plan is formed by :meth:`Step.begin` (``batches()``, ``synchronize()``, or a backward pass
outside ``batches()``), never by a getter; reading it (:meth:`Step.peek_plan`,
:meth:`Step.would_compute`) changes nothing.

The replicas (at the end of this module, :class:`ReplicaRNG`, :class:`ReplicaDataCheck`): their
forward-pass randomness as a function of (seed, partition, step), and
their first step's data, compared once across the ranks that evaluate it.

Gradient coding decodes the full gradient only when the replicas of a partition compute the
same gradient. Dropout, stochastic depth and any other torch random draw in the forward pass
come from the rank's own generator, so two ranks evaluating the same batch would draw different
masks. :meth:`ReplicaRNG.scope` wraps the loop body of each partition that
``optimizer.batches()`` yields: torch's default CPU generator (and the CUDA generator of the
parameters' device, when they are on one) is seeded from ``(seed, partition, step)`` and its
previous state is restored when the body ends, so the user's generators outside
``batches()`` are left as they were.

The seed is agreed at construction (:func:`agree_seed`: rank 0's ``torch.initial_seed()``, one
int64 allgather), so a script that calls ``torch.manual_seed(s)`` gets the same masks run after
run, and one that does not gets fresh ones, as in a plain torch script; the data loader's
samples have their own seeds (:mod:`pgc_hvd.data.coded_loader`).

The first step's data (:class:`ReplicaDataCheck`): gradient coding decodes the full gradient
only when every rank that evaluates partition k at
step t gets the same batch. A dataset generated on each rank without a seed (``torch.randn``
data), or a per-rank shard where the scheme expects the whole dataset, trains something else
without a word. At the optimizer's first step, every batch ``optimizer.batches()`` yielded is
noted as a 63-bit digest of its tensors (:func:`batch_digest`); at the first ``step()`` the
ranks allgather one row of n int64 (the digest of each partition, -1 where the rank did not
evaluate it) and a partition whose replicas differ raises the same ValueError on every rank,
naming the partition, the ranks and the fix. One pass over the first step's batches and one
collective of 8 n bytes per rank, once; nothing after the first step.

Runs on the training thread only (hooks fire there). May import: ``ops``, ``flat_layout``,
``control.momentum``, ``runtime.agent`` (``Outgoing``), ``runtime.agreement``, ``runtime.config``
(``takes_three``), ``runtime.consistency`` (``NonFiniteParameters``), ``runtime.errors``,
``runtime.interop``, numpy and torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import struct
import time
import zlib
from typing import Callable, Optional

import numpy as np
import torch

import pgc_hvd.ops as ops
from pgc_hvd.control.momentum import compensated
from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime import interop
from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.agreement import allgather_polled, gather_versions, tensors_digest
from pgc_hvd.runtime.config import takes_three
from pgc_hvd.runtime.consistency import NonFiniteParameters
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.overlap import Stream


class GradientCapture:
    """Moves gradients from ``p.grad`` into the ring slots of one worker (module doc).

    ``ring_mode`` keeps every slot (pipelined schemes; complex codes); otherwise (GC) the
    message m = sum_l b_l g_l is accumulated slot by slot with :func:`pgc_hvd.ops.add_slot`
    in :attr:`msg` (two buffers instead of c). ``current()`` begins the step if needed and
    returns its ``(plan, version)`` (:meth:`Step.current`, the hook's only way to learn them;
    set by the :class:`Step` that uses this capture)."""

    def __init__(self, layout: FlatLayout, worker_ring, *, ring_mode: bool, passes_per_step: int,
                 scheme, rank: int, names: Optional[dict] = None):
        self.layout = layout
        self.worker_ring = worker_ring            # schemes.Ring: slot versions, plans
        self.ring_mode = bool(ring_mode)
        self.complex = bool(worker_ring.complex)
        nslots = worker_ring.size if self.ring_mode else 1
        self.ring = [layout.zeros() for _ in range(nslots)]
        self.msg = layout.zeros() if not self.complex else None
        self.passes_per_step = int(passes_per_step)
        self.current: Optional[Callable[[], tuple]] = None   # Step.current, set by the Step
        self.scheme, self.rank = scheme, int(rank)
        self.scheme_name = scheme.name
        self.names = names or {}
        self._own_only: Optional[bool] = None    # the scheme always asks for this rank's own
        self.done_slots: set = set()
        self.target_slot: Optional[int] = None    # the slot whose gradient accumulates in p.grad
        self.got_grad = False                     # a gradient reached the target slot
        self.update_in_grad = False               # synchronize() put the update in p.grad
        self.amp = False                          # a GradScaler has handed a scale to step()
        self._sentinel = None                     # the parameter whose hook counts passes
        self._passes = 0
        self._grad_version = -1                   # its p.grad._version after the last backward
        self._zero_flat = None                    # zeros for p.grad in a catch-up under AMP
        self._hooks: list = []                    # attach() registers them
        #: the overlap (:mod:`pgc_hvd.runtime.overlap`): the buckets (None: no overlap) and
        #: the step's ``open_stream(slot)`` (:meth:`Step.open_stream`, set by the Step), asked at
        #: the step's first gradient; it returns the bucket callback while the step streams
        self.buckets = None
        self.open_stream: Optional[Callable] = None
        self._bucket_done: Optional[Callable] = None   # this step streams: bucket k formed
        self._left: Optional[list] = None              # parameters each bucket still waits for
        #: the user's own loop feeds the plan's partitions (the DDP door's sampler): a backward
        #: outside ``batches()`` is the plan's evaluation, where several partitions are
        #: evaluated it holds their message already (rows weighted by the coefficients), and
        #: the ring starts filled with zeros instead of a warm-up (:meth:`zero_start`)
        self.loop_fed = False

    def attach(self) -> None:
        """Register the gradient hooks (last in the optimizer's construction: a construction
        that fails leaves no hook behind on the model)."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook)
                       for p in self.layout.params]

    # -- the plan's partitions ------------------------------------------------------------
    def new_step(self) -> None:
        """A new plan: no slot evaluated yet (GC: the message restarts from zero)."""
        self.done_slots = set()
        self._left = self._bucket_done = None
        if not self.ring_mode:
            self.msg.zero_()

    def begin(self, slot: int, plan, version: int) -> None:
        """Backward passes from now on are the gradient of ring slot ``slot``."""
        if slot not in [sl for _, sl in plan.evaluate]:
            raise ValueError(f"slot {slot} is not evaluated at step {version} "
                             f"(plan {plan.evaluate})")
        if self.target_slot is not None:
            self.end(plan, version)
        self.target_slot = slot
        self._passes = 0
        self.got_grad = False

    def end(self, plan, version: int) -> None:
        """Move ``p.grad`` (fp16/bf16/fp64 cast to fp32) into the current slot (GC: add b_l
        times it into the message) and clear ``p.grad``."""
        slot = self.target_slot
        if slot is None:
            return
        lay = self.layout
        target = self.ring[slot if self.ring_mode else 0]
        target.zero_()
        for p in lay.params:
            if p.grad is not None:
                lay.view(target, p).add_(p.grad)
                p.grad = None
        if self.loop_fed:     # one backward evaluated every partition of the plan
            slots = [sl for _, sl in plan.evaluate]
            if not self.ring_mode:
                ops.add_slot(self.msg, self.ring[0], 1.0)   # the rows carried b_l already
        else:
            slots = [slot]
            if not self.ring_mode:
                ops.add_slot(self.msg, self.ring[0], float(dict(plan.combine)[slot]))
        for sl in slots:
            self.worker_ring.fill(sl, version)
            self.done_slots.add(sl)
        self.target_slot = None
        self._sentinel = None

    def end_pending(self, plan, version: int) -> None:
        """End the partition whose gradient is still in p.grad (a backward ran) or drop the
        target (none did: the slot stays missing and step() names it)."""
        if self.got_grad:
            self.end(plan, version)
        else:
            self.target_slot = None

    def last_batch_done(self) -> None:
        """The loop body of the last batch is over: what it did to p.grad (clipping) is in; a
        change after it is refused by :meth:`check_untouched`."""
        if self._sentinel is not None and self._sentinel.grad is not None:
            self._grad_version = self._sentinel.grad._version

    def touched(self) -> bool:
        """Whether ``p.grad`` changed after the last backward (clipping, ``unscale_``)."""
        sentinel = self._sentinel
        return (sentinel is not None and sentinel.grad is not None
                and sentinel.grad._version != self._grad_version)

    def missing(self, plan) -> list:
        """Slots of ``plan`` that got no gradient."""
        return [sl for _, sl in plan.evaluate if sl not in self.done_slots]

    def slots(self, plan) -> tuple[list, list]:
        """The ring slots the plan's message combines and their coefficients."""
        return [self.ring[sl] for sl, _ in plan.combine], [c for _, c in plan.combine]

    @property
    def pending_gradient(self) -> bool:
        """Whether a partition's gradient sits in p.grad, not yet in its slot."""
        return self.target_slot is not None and self.got_grad

    # -- hooks ----------------------------------------------------------------------------
    def _hook(self, p: torch.Tensor) -> None:
        """After each parameter's gradient is accumulated into ``p.grad``: note it (it stays in
        p.grad until the partition ends), count backward passes, and start the plan's
        partition implicitly for a loop that does not use ``batches()``."""
        if p.grad is None:
            return
        if self.update_in_grad:
            raise RuntimeError(
                "pgc_hvd: a backward pass ran after optimizer.synchronize() and before step(): "
                "p.grad holds the decoded update of step "
                f"{self.current()[1]}; call step() (under skip_synchronize()) first")
        if self.target_slot is None:
            self._begin_implicit()
        if self._sentinel is None:
            self._sentinel = p
        if p is self._sentinel:
            self._passes += 1
            if self._passes > self.passes_per_step:
                if self.loop_fed:
                    raise RuntimeError(
                        f"pgc_hvd.DistributedDataParallel: a second backward pass at step "
                        f"{self.current()[1]} before optimizer.step(): one DataLoader batch is "
                        f"one step (the CodedSampler cuts the data by steps), so accumulating "
                        f"the gradients of several batches (no_sync) would mix steps. Take a "
                        f"batch k times larger instead (the same batch_size in the CodedSampler "
                        f"and the DataLoader), or call optimizer.step() after every backward")
                raise RuntimeError(
                    f"pgc_hvd: {self._passes} backward passes for one partition at step "
                    f"{self.current()[1]}, more than backward_passes_per_step="
                    f"{self.passes_per_step}; call step() after every "
                    f"{self.passes_per_step} backward pass(es), or raise "
                    f"backward_passes_per_step")
            self._grad_version = p.grad._version
        self.got_grad = True
        if self.buckets is not None:
            self._stream(p)

    # -- the overlap ----------------------------------------------------------------------
    def _stream(self, p: torch.Tensor) -> None:
        """A streamed step (:mod:`pgc_hvd.runtime.overlap`): ``p.grad`` goes into the slot at
        once, and a bucket whose parameters all have their gradient is handed to the step."""
        if self._left is None:          # the step's first gradient: does it stream?
            self._left = list(self.buckets.counts)
            self._bucket_done = self.open_stream(self.target_slot)
            if self._bucket_done is not None:
                self._slot().zero_()     # parameters that get no gradient stay zero
        if self._bucket_done is None:
            return
        self.layout.view(self._slot(), p).copy_(p.grad)
        k = self.buckets.of_param[id(p)]
        self._left[k] -= 1
        if self._left[k] == 0:
            self._bucket_done(k)

    def _slot(self) -> torch.Tensor:
        return self.ring[self.target_slot if self.ring_mode else 0]

    @property
    def streaming(self) -> bool:
        """Whether the current step's message is streaming (its buckets leave during backward)."""
        return self._bucket_done is not None

    def end_stream(self, plan, version: int) -> list:
        """``step()`` of a streamed step: the buckets no hook completed (parameters with no
        gradient: their zeros are in the slot), returned for the step to form; ``p.grad``
        cleared and the slot filled, as :meth:`end` does, without moving it again. A change to
        ``p.grad`` after the backward (clipping, ``GradScaler.unscale_``) came too late: the
        message left during the backward; refused with the fix."""
        sentinel = self._sentinel
        if sentinel is not None and sentinel.grad is not None \
                and sentinel.grad._version != self._grad_version:
            raise RuntimeError(
                f"pgc_hvd: p.grad was changed after loss.backward() at step {version} "
                f"(clip_grad_norm_, GradScaler.unscale_, ...), but this rank's message left "
                f"during the backward (the overlap, overlap=True). Clip the decoded update "
                f"instead: optimizer.synchronize(); clip_grad_norm_(...); with "
                f"optimizer.skip_synchronize(): optimizer.step(); or build the optimizer with "
                f"overlap=False (the message is then formed at step())")
        left = [k for k, m in enumerate(self._left) if m > 0]
        for p in self.layout.params:
            p.grad = None
        slot = self.target_slot
        slots = [sl for _, sl in plan.evaluate] if self.loop_fed else [slot]
        for sl in slots:
            self.worker_ring.fill(sl, version)
            self.done_slots.add(sl)
        self.target_slot = None
        self._sentinel = None
        self._bucket_done = None
        return left

    def _begin_implicit(self) -> None:
        """A backward pass outside ``batches()``: the gradient is taken as the one of the
        partition the plan wants next. That is only what the loop computed if the scheme asks
        this rank for its own partition at every step (dgd, is-sgd: then the user's own
        DataLoader with a DistributedSampler is this rank's shard); for every other scheme it is
        refused, because the data of the user's loader is not the partition the code needs
        (it would silently train on the fast ranks' data only)."""
        plan, version = self.current()
        if not self.loop_fed and not self.own_partition_only():
            raise RuntimeError(
                f"pgc_hvd: a backward pass ran outside optimizer.batches(loader), but "
                f"{self.scheme_name} asks rank {self.rank} for partitions "
                f"{[q for q, _ in plan.evaluate]} at step {version} (the partitions rotate "
                f"or are replicated), which your own DataLoader does not know: the run would "
                f"train on the wrong data. Feed the dataset through the scheme: `loader = "
                f"pgc_hvd.data.CodedLoader(dataset, n=hvd.size(), batch_size=..., num_workers=...)` (any "
                f"torch Dataset) and `for xb, yb in optimizer.batches(loader): ...backward()`; "
                f"or use scheme='dgd' / 'is-sgd', which keep one shard per rank")
        todo = self.missing(plan)
        if not todo:
            raise RuntimeError(
                f"pgc_hvd: a backward pass ran at step {version} after every partition "
                f"of the work plan was evaluated; call optimizer.step() first")
        self.begin(todo[0], plan, version)

    def own_partition_only(self) -> bool:
        """Does the scheme ask this rank for exactly its own partition at every step? (Checked
        over 2n + ring steps once: the plans are periodic.)"""
        if self._own_only is None:
            span = 2 * self.scheme.n + self.worker_ring.size + 1
            self._own_only = all(
                [q for q, _ in self.scheme.work_plan(self.rank, t).evaluate] == [self.rank]
                for t in range(span))
        return self._own_only

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- checks and AMP -------------------------------------------------------------------
    def check_zero_grad(self, version: int) -> None:
        """``zero_grad()`` while a partition's gradient is still in p.grad (after the last
        backward, before ``step()``) would drop it from the message (dgd: a zero update):
        refused, as Horovod refuses a ``zero_grad()`` between ``backward()`` and ``step()``."""
        if self.pending_gradient:
            raise AssertionError(
                f"pgc_hvd: optimizer.zero_grad() was called after loss.backward() but before "
                f"optimizer.step() or optimizer.synchronize() (step {version}): p.grad holds "
                f"the gradient of partition slot {self.target_slot}, which step() sends. Call "
                f"zero_grad() before the forward pass or after step(), as with Horovod")

    def check_untouched(self, plan, version: int, grad_scale) -> None:
        """Where a step evaluates several partitions (GC, BCGC, PGC's warm-up), only the last
        one's gradient is still in p.grad after the loop: a change made to it there (clipping,
        GradScaler.unscale_) would act on one partition of several. Refused, with the two ways
        that work. (A GradScaler's own inf check in ``scaler.step`` also writes p.grad in
        place; it is recognised by the scale it hands over, ``grad_scale``.)"""
        sentinel = self._sentinel
        if (self.loop_fed or len(plan.evaluate) < 2 or sentinel is None
                or sentinel.grad is None):
            return
        if sentinel.grad._version == self._grad_version or grad_scale is not None:
            return
        raise RuntimeError(
            f"pgc_hvd: p.grad was changed after the last backward (clip_grad_norm_, "
            f"GradScaler.unscale_, ...), but {self.scheme_name} evaluates "
            f"{len(plan.evaluate)} partitions at step {version} and only the last one's "
            f"gradient is still in p.grad, so the change would act on one partition of "
            f"{len(plan.evaluate)}. Clip inside the batches() loop right after backward() (each "
            f"partition's gradient), or clip the decoded update: optimizer.synchronize(); "
            f"clip_grad_norm_(...); with optimizer.skip_synchronize(): optimizer.step(). With a "
            f"GradScaler, call scaler.step(optimizer) without unscale_()")

    def unscale(self, grad_scale) -> None:
        """``GradScaler.step(optimizer)`` sets ``optimizer.grad_scale`` (the loss scale S every
        backward pass of this step used; it changes only in ``scaler.update()``, after the step):
        the ring slots evaluated at this step (GC: the accumulated message) are divided by S
        before the message is formed, so every message, and the ring that later messages reuse,
        holds true gradients whatever each rank's scale (the scales differ across ranks: each
        rank's scaler backs off on its own overflows). A message that overflowed is non-finite
        and left out like a straggler's. ``grad_scale`` is None when the user already called
        ``scaler.unscale_(optimizer)`` (p.grad was unscaled in place)."""
        if grad_scale is None:
            return
        self.amp = True
        inv = 1.0 / float(grad_scale)
        if inv == 1.0:
            return
        if self.ring_mode:
            for sl in self.done_slots:
                self.ring[sl].mul_(inv)
        else:
            self.msg.mul_(inv)

    def discard(self) -> None:
        """A rank that catches up computes nothing: a gradient its loop computed anyway (its
        own DataLoader, a GradScaler's zeros) is dropped."""
        for p in self.layout.params:
            p.grad = None
        self.target_slot = None
        self._sentinel = None

    def zero_grads(self) -> None:
        """p.grad = zeros (one flat buffer, viewed per parameter): a GradScaler's inf check in an
        iteration that computes nothing (catching up) then finds finite gradients."""
        lay = self.layout
        if self._zero_flat is None:
            self._zero_flat = lay.zeros()
        self._zero_flat.zero_()
        for p, v in lay.views(self._zero_flat):
            p.grad = v if p.dtype == v.dtype else v.to(p.dtype)

    def reset(self, version: int) -> None:
        """An empty ring (a run continued from model ``version``): every slot is evaluated
        afresh at its first use; a loop-fed ring starts with zeros (:meth:`zero_start`)."""
        for b in self.ring:
            b.zero_()
        self.worker_ring.reset()
        if self.loop_fed and self.ring_mode:
            self.zero_start(version)

    def feed_from_loop(self, version: int) -> None:
        """From now on a backward is the plan's evaluation (:attr:`loop_fed`); a ring starts
        with zeros of model ``version``."""
        self.loop_fed = True
        if self.ring_mode:
            self.zero_start(version)

    def zero_start(self, version: int) -> None:
        """Every slot holds a zero gradient of model ``version`` (the loop-fed warm-up: a loop
        that runs one batch per step cannot evaluate the c partitions of PGC's warm-up step, so
        the first c - 1 messages hold only the gradients evaluated so far)."""
        for b in self.ring:
            b.zero_()
        for sl in range(self.worker_ring.size):
            self.worker_ring.fill(sl, version)


def loop_plan(scheme, rank: int, step: int, ring_mode: bool):
    """The work plan of worker ``rank`` at ``step`` for a loop that runs ONE batch per step (the
    DDP door): the scheme's plan, except that a pipelined scheme's warm-up (every slot at step
    0) evaluates the one slot its rotation gives (that of step ``step + L``, L the ring size;
    the other slots start as zeros, :meth:`GradientCapture.zero_start`). Several partitions of
    a non-pipelined plan (GC, BCGC: c per step) share the batch, rows weighted by their
    coefficients (:mod:`pgc_hvd.runtime.ddp`). A function of (scheme, rank, step) only, so the
    sampler predicts the steps to come with it."""
    plan = scheme.work_plan(rank, step)
    if ring_mode and len(plan.evaluate) > 1:
        later = scheme.work_plan(rank, step + plan.ring_size).evaluate
        if len(later) != 1:
            raise ValueError(
                f"scheme {scheme.name} evaluates {len(later)} ring slots at step "
                f"{step + plan.ring_size}: a loop that runs one batch per step cannot feed it; "
                f"use optimizer.batches(loader) (pgc_hvd.DistributedOptimizer) or another "
                f"scheme")
        plan = dataclasses.replace(plan, evaluate=later)
    return plan


def declared_metrics(names: tuple, metrics) -> tuple:
    """``step(metrics={name: value})`` as the k floats of the control row (NaN for a name not
    given); unknown names or non-numbers are refused."""
    if metrics is None:
        return (math.nan,) * len(names) if names else ()
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict {{name: float}}, got {metrics!r}")
    unknown = sorted(set(metrics) - set(names))
    if unknown:
        raise ValueError(f"step(metrics=...) names {unknown}, not declared: pass "
                         f"metrics={sorted(set(names) | set(unknown))} to "
                         f"DistributedOptimizer (the control rows are sized for them)")
    try:
        return tuple(float(metrics.get(k, math.nan)) for k in names)
    except (TypeError, ValueError):
        raise TypeError(f"metrics values must be numbers, got {metrics!r}") from None


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one read of x and no allocation: any NaN or
    Inf entry makes the sum NaN or Inf; a finite sum proves them all finite. Only a sum that
    overflowed (or a real NaN/Inf) is checked entry by entry."""
    total = float(x.sum()) if not x.is_complex() else complex(x.sum())
    if (math.isfinite(total) if isinstance(total, float)
            else math.isfinite(total.real) and math.isfinite(total.imag)):
        return True
    return bool(torch.isfinite(x).all())


def hyper_digest(param_groups, prev: int) -> int:
    """A running CRC32 over every scalar hyper-parameter of every param group (lr, momentum,
    betas, weight decay, ...), one term per applied update: equal on every rank iff every
    update was applied with the same hyper-parameters everywhere."""
    parts = []
    for g in param_groups:
        for k in sorted(g):
            v = g[k]
            if k == "params" or torch.is_tensor(v):
                v = float(v) if torch.is_tensor(v) and v.numel() == 1 else None
                if v is None:
                    continue
            if isinstance(v, (bool, int, float, str, tuple, type(None))):
                parts.append(f"{k}={v!r}")
    return zlib.crc32(";".join(parts).encode(), prev)


class Step:
    """This rank's current step: version, plan, clock, message and update (module doc).

    ``capture`` (a :class:`GradientCapture`), ``encoder`` (a
    :class:`~pgc_hvd.compress.codecs.MessageEncoder`) and ``agent`` (a
    :class:`~pgc_hvd.runtime.agent.CommAgent`, or any object with its training-thread members)
    are used through their public members; ``param_groups`` are the optimizer's (a version
    ``hvd.broadcast_optimizer_state`` wrote there is adopted at the first use,
    :meth:`adopt`)."""

    def __init__(self, capture: GradientCapture, encoder, agent, scheme, rank: int, *,
                 param_groups, delays=None, cancel: bool = False, replay_steps=(),
                 op_scale: float = 1.0, on_update=None):
        self.capture, self.encoder, self.agent, self.scheme = capture, encoder, agent, scheme
        self.worker_ring, self.layout = capture.worker_ring, capture.layout
        self.rank = int(rank)
        self.param_groups = param_groups
        self.delays, self.cancel = delays, bool(cancel)
        self.replay_steps = set(replay_steps)
        self.replay_end = max(self.replay_steps) if self.replay_steps else -1
        self.op_scale = float(op_scale)
        self.on_update = on_update
        # on_update(step, flat) (original form) or on_update(step, flat, decision): decided once
        self._with_decision = on_update is not None and takes_three(on_update)
        #: the model version t: decided updates applied (= the step computed next)
        self.version = 0
        #: the first step has begun (the agent runs)
        self.started = False
        self.plan = None              # the current step's WorkPlan (None: not begun)
        self.computes = True          # this rank sends a message at the current step
        self.cancelled = False        # the current step fired without this rank (cancel)
        #: seconds this rank has computed (forward, backward, forming messages), all steps
        self.busy = 0.0
        self._since: Optional[float] = None   # start of the current step's compute
        self._bufs: dict = {}          # param id -> update buffer in the parameter's dtype
        #: running digest of the hyper-parameters of every applied update (:func:`hyper_digest`)
        self.hyper_digest = 0
        #: the last update loaded (its decision and info), None before the first
        self.last = None
        capture.current = self.current
        # the overlap (module pgc_hvd.runtime.overlap): None until the first send() has shown
        # the loop's habits (True: later steps may stream), the streamed message's buffer and
        # the step's Outgoing while it streams
        self.may_stream: Optional[bool] = None
        self._stream_buf: Optional[torch.Tensor] = None
        self._streamed: Optional[Outgoing] = None
        #: steps whose message streamed (left during the backward)
        self.streamed_steps = 0
        capture.open_stream = self.open_stream

    # -- the plan ------------------------------------------------------------------------------
    def adopt(self) -> None:
        """Before the first step: continue from a version ``hvd.broadcast_optimizer_state``
        wrote into ``param_groups[0]["pgc_version"]``."""
        if not self.started:
            v = interop.take_broadcast_version(self.param_groups)
            if v is not None and v != self.version:
                self.restart_at(v)

    def restart_at(self, version: int) -> None:
        """Continue from model version ``version`` with an empty ring and a fresh residual."""
        self.version = int(version)
        self.capture.reset(self.version)
        self.encoder.reset()
        self.agent.restart_at(self.version)
        self.next()

    def begin(self):
        """Begin the step at :attr:`version` if it has not begun: form its plan (a ring slot
        never filled, warm-up cancelled, is evaluated now: :meth:`~pgc_hvd.schemes.Ring.plan`),
        decide whether this rank computes at it, start the compute clock. Returns the plan."""
        self.adopt()
        if self.plan is None:
            self.computes = self.would_compute()   # pinned for the step
            self.plan = self.plan_at(self.version)
            self.capture.new_step()
            self.clock()
        return self.plan

    def plan_at(self, version: int):
        """The plan of step ``version``: the ring's, or :func:`loop_plan` when the user's loop
        feeds the partitions (:attr:`GradientCapture.loop_fed`)."""
        if self.capture.loop_fed:
            return loop_plan(self.scheme, self.rank, version, self.capture.ring_mode)
        return self.worker_ring.plan(version)

    def current(self) -> tuple:
        """``(plan, version)`` of the step, begun if needed (a backward pass outside
        ``batches()`` begins it: the capture's hook)."""
        return self.begin(), self.version

    def peek_plan(self):
        """The plan of the current step, begun or not (nothing changes)."""
        if self.plan is not None:
            return self.plan
        if not self.started:
            v = interop.broadcast_version(self.param_groups)
            if v is not None:
                return self.plan_at(v)
        return self.plan_at(self.version)

    def would_compute(self) -> bool:
        """Whether this rank computes at the current step: as decided when it began, else as
        it would be now (nothing changes). A step decided without this rank is caught up on;
        replaying a schedule (``replay_arrivals``) it computes exactly the steps it computed
        there."""
        if self.plan is not None:
            return self.computes
        version = self.version
        if version <= self.replay_end:
            return version in self.replay_steps
        return not self.started or version >= self.agent.decided()

    def overtaken(self) -> bool:
        """``straggler_policy="cancel"``: has the current step been decided without this rank's
        message? (Then the rest of the step is abandoned: no message is sent, evaluated ring
        slots are kept, and the rank moves on to the newest model.)"""
        if self.cancel and self.started and self.agent.decided() > self.version:
            self.cancelled = True
        return self.cancelled

    def next(self) -> None:
        """An update was applied (or the version changed): the next step begins at its first
        use."""
        self.plan = None
        self.cancelled = False

    # -- the clock -------------------------------------------------------------------------------
    def clock(self, restart: bool = False) -> None:
        """Start the current step's compute clock (``restart``: even if it runs)."""
        if restart or self._since is None:
            self._since = time.monotonic()

    def stop_clock(self) -> None:
        """The step's compute is over: add it to :attr:`busy`."""
        self.busy += time.monotonic() - self._since

    # -- the message -----------------------------------------------------------------------------
    def open_stream(self, slot: int):
        """The step's first gradient (the capture's hook): stream the message
        (:mod:`pgc_hvd.runtime.overlap`) when the step evaluates one slot by one backward, the
        first ``send()`` showed no habit that needs the whole message at ``step()`` (a loss or
        metrics for the control row, a GradScaler, ``p.grad`` changed after the backward) and
        the step is not overtaken. Then the message is submitted now, its buckets to come
        (the configured delay, a straggler's, is slept first), and the bucket callback is
        returned; else None."""
        plan, t, cap = self.plan, self.version, self.capture
        if (not self.may_stream or not self.computes or self.overtaken()
                or cap.passes_per_step != 1
                or (len(plan.evaluate) != 1 and not cap.loop_fed)):
            return None
        self._delay(t)
        if self._stream_buf is None:
            self._stream_buf = self.layout.zeros()
        buf = self._stream_buf
        for sl in ([sl for _, sl in plan.evaluate] if cap.loop_fed else [slot]):
            self.worker_ring.fill(sl, t)     # its gradient is on the way
        out = Outgoing(t, t, buf, time.time(), math.nan, self.worker_ring.message_versions(plan),
                       stream=Stream(len(cap.buckets)))
        self._streamed = out
        self.streamed_steps += 1
        self.agent.submit(out, self.busy)
        if cap.ring_mode:
            slots, coeffs = cap.slots(plan)
        else:   # GC's one slot: the loop's rows carried the coefficients (loop-fed) or b_l
            slots = [cap.ring[0]]
            coeffs = [1.0 if cap.loop_fed else float(dict(plan.combine)[slot])]
        ranges, enc = cap.buckets.ranges, self.encoder

        def bucket_done(k: int) -> None:
            lo, hi = ranges[k]
            enc.form([s[lo:hi] for s in slots], coeffs, out=buf[lo:hi])
            out.stream.mark(k)
        self._bucket_done = bucket_done
        return bucket_done

    def close_stream(self) -> None:
        """The training thread failed: an agent waiting for a bucket stops."""
        if self._streamed is not None:
            self._streamed.stream.close()

    def _end_stream(self, loss, metrics: tuple, grad_scale) -> None:
        """``send()`` of a streamed step: the buckets no gradient completed are formed now.
        A loss, metrics or a loss scale handed to this ``step()`` came after the message left;
        refused with the fix (the first ``step()`` shows whether the loop passes them)."""
        cap, out = self.capture, self._streamed
        for k in cap.end_stream(self.plan, self.version):
            self._bucket_done(k)
        self._streamed = None
        self.stop_clock()
        late = [what for what, given in (("loss", loss is not None),
                                         ("metrics", any(not math.isnan(v) for v in metrics)),
                                         ("a GradScaler's scale", grad_scale is not None))
                if given]
        if late:
            raise RuntimeError(
                f"pgc_hvd: step {out.step} got {' and '.join(late)} at optimizer.step(), but "
                f"this rank's message had left during the backward (the overlap): the first "
                f"step() had none, so later steps stream. Pass them from the first step on, "
                f"or build the optimizer with overlap=False")

    def send(self, *, loss=None, metrics: tuple = (), grad_scale=None) -> None:
        """Form, check, encode and submit the message of the current (begun) step (module
        doc); nothing is sent once the step fired without this rank (:meth:`overtaken`). A
        streamed step's message went at its first gradient (:meth:`open_stream`); here its
        last buckets are formed."""
        plan = self.plan
        cap, enc, agent, t = self.capture, self.encoder, self.agent, self.version
        if self._streamed is not None:
            return self._end_stream(loss, metrics, grad_scale)
        if self.may_stream is None and cap.buckets is not None:   # the first send: habits
            self.may_stream = (loss is None and all(math.isnan(v) for v in metrics)
                               and grad_scale is None
                               and not cap.amp and not (cap.target_slot is not None
                                                        and cap.touched()))
        if cap.target_slot is not None:   # the last partition's gradient is in p.grad
            cap.check_untouched(plan, t, grad_scale)
            cap.end_pending(plan, t)
        packed = payload = msg = None
        if not self.overtaken():
            missing = cap.missing(plan)
            if missing:
                raise RuntimeError(
                    f"pgc_hvd: scheme {self.scheme.name} asks rank {self.rank} to evaluate "
                    f"partitions {[p for p, sl in plan.evaluate]} at step {t}, but slots "
                    f"{missing} got no gradient; iterate `for batch in optimizer.batches(loader)` "
                    f"(or use optimizer.partition(slot)) and run backward on each batch")
            cap.unscale(grad_scale)
            if not cap.ring_mode:
                msg = cap.msg
            else:
                if enc.dense_rows:   # the dense payload row is the message: formed in place
                    packed, payload = agent.payload_buffer()
                msg = enc.form(*cap.slots(plan), out=payload if payload is not None else cap.msg)
            self._delay(t)
        self.stop_clock()
        if self.overtaken():
            return
        if not all_finite(msg):
            agent.report_bad(t, self.busy)
            return
        if payload is None:
            packed, payload = agent.payload_buffer()
        error_norm = enc.encode(msg, payload, error_norm=self.scheme.needs_error_norms)
        agent.submit(Outgoing(t, t, payload, time.time(), math.nan if loss is None else float(loss),
                              self.worker_ring.message_versions(plan), packed=packed,
                              error_norm=error_norm, metrics=metrics), self.busy)

    def skip(self) -> None:
        """A rank that catches up computes nothing at this step: a gradient its loop computed
        anyway is dropped and the clock stops."""
        self.capture.discard()
        self.stop_clock()

    def _delay(self, t: int) -> None:
        delay = 0.0 if self.delays is None else float(self.delays.sample(self.rank, t))
        if delay > 0:
            if self.cancel:   # cut short when the step fires without this rank
                self.agent.wait_decided_beyond(t, delay)
            else:
                time.sleep(delay)

    # -- the update ------------------------------------------------------------------------------
    def metrics(self, names: tuple) -> dict:
        """What the control rows said about the last update: ``step``, ``loss`` (the mean of
        the losses sent with the messages the decision used), each declared user metric's mean
        over those messages (NaN where none carried it), and ``ranks`` (whose messages were
        used); empty before the first update."""
        upd = self.last
        if upd is None:
            return {}
        out = {"step": upd.step, "loss": upd.info.get("loss"),
               "ranks": sorted({u.worker for u in upd.decision.uses})}
        out.update(zip(names, upd.info.get("metrics", ())))
        return out

    def load(self, update) -> None:
        """Put ``update`` (an :class:`~pgc_hvd.runtime.agent.Update` of step :attr:`version`)
        into ``p.grad``: fp32 parameters get views of the decoded vector, others (fp16, bf16,
        fp64) a cast copy in a buffer kept per parameter; ``op=hvd.Sum`` multiplies it by n.
        ``on_update`` sees it first."""
        self.last = update
        flat = update.flat
        if self.on_update is not None:
            if self._with_decision:
                self.on_update(self.version, flat, update.decision)
            else:
                self.on_update(self.version, flat)
        if self.op_scale != 1.0:
            flat.mul_(self.op_scale)
        bufs = self._bufs
        for p, v in self.layout.views(flat):
            if p.dtype != v.dtype:
                buf = bufs.get(id(p))
                if buf is None:
                    buf = bufs[id(p)] = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                buf.copy_(v)
                v = buf
            p.grad = v

    def apply(self, rule, *, correct_momentum: bool) -> None:
        """The user's rule (``rule()``, the wrapped class's ``step``, which the caller runs
        without a GradScaler's ``grad_scale`` / ``found_inf``: the ring was unscaled) on the
        loaded update, then :meth:`applied`. With ``correct_momentum`` the rule runs with the
        user's momentum less the stale gradients' implicit momentum
        (:mod:`pgc_hvd.control.momentum`)."""
        if correct_momentum:
            last = self.last
            mean_age = last.decision.info.get("mean_age") if last is not None else None
            with compensated(self.param_groups, mean_age, True):
                rule()
        else:
            rule()
        self.applied()

    def applied(self) -> None:
        """An update was applied with the current hyper-parameters: clear p.grad, extend the
        digest, ``version += 1``; the agent frees what the steps before it held, the next step
        begins at its first use."""
        for p in self.layout.params:
            p.grad = None
        self.hyper_digest = hyper_digest(self.param_groups, self.hyper_digest)
        self.capture.update_in_grad = False
        self.version += 1
        self.after_update()

    def after_update(self) -> None:
        self.agent.release_before(self.version)
        self.next()
        self.clock(restart=True)


class FaultMonitor:
    """Stops every rank on a fault of this one, and explains the others' faults (module doc)."""

    def __init__(self, agent, rank: int, params, *, names=None, timeout: float = 60.0):
        self.agent = agent
        self.rank = int(rank)
        self.params = list(params)
        self.names = names or {}
        self.timeout = float(timeout)
        self._bad_checked = 0            # bad_log entries already looked at

    def check_params(self, *, report: bool = True, started: bool = True) -> None:
        """Stop every rank when this rank's parameters are non-finite.

        The decoded updates are finite (non-finite messages are never used) and the same on
        every rank, so parameters that hold NaN/Inf on one rank were changed outside the
        optimizer (code that runs on one rank only, a hardware fault). Such a rank's messages
        are non-finite at every later step: left to itself it would be a straggler for good,
        use up the budget s, and end the run with ranks that differ (an inf model on rank 0 is
        the one evaluated and saved). The run is stopped, not repaired: copying the others'
        parameters would need a collective every rank joins at the same point, which the
        agent's protocol does not have mid-step, and it would hide the fault (a bug in the
        training script, or hardware) that made them non-finite; the ranks still hold a good
        copy, so the run restarts from a checkpoint.

        Cost: nothing per step. Only when a control round showed a non-finite message of this
        rank (``bad_log``) does it look at its parameters, one pass over d: a message that is
        non-finite because the loss was (a transient fault, the message is left out as a
        straggler's) finds finite parameters and training goes on. The error names the rank,
        the step of its first non-finite message and the parameters; with ``report`` this
        rank's agent tells the others (:meth:`fail`), whose :class:`AgentError` names the rank
        and that step too (:meth:`explain`)."""
        log = self.agent.bad_log
        if len(log) == self._bad_checked:
            return
        new = log[self._bad_checked:]
        self._bad_checked += len(new)
        mine = [k for w, k in new if w == self.rank]
        if not mine:
            return
        bad = [(i, p) for i, p in enumerate(self.params) if not bool(torch.isfinite(p).all())]
        if not bad:
            return
        which = ", ".join(
            f"{self.names.get(id(p), f'#{i}')} ({int((~torch.isfinite(p)).sum())} of {p.numel()})"
            for i, p in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        if report:
            self.fail(started=started)
        raise NonFiniteParameters(
            f"pgc_hvd: rank {self.rank}'s parameters hold NaN/Inf at step {min(mine)} (entries "
            f"non-finite: {which}); its messages from step {min(mine)} on were non-finite and "
            f"left out. The decoded updates are finite and the same on every rank, so something "
            f"outside the optimizer changed this rank's parameters (code that runs on one rank "
            f"only, a hardware fault). Every rank stops: restart from a checkpoint saved when "
            f"the ranks agreed.")

    def fail(self, started: bool) -> None:
        """The training thread raised: tell the other ranks, and wait (at most ``timeout``)
        until this rank's agent has stopped on the control round that shows it, so that the
        others stop with an error naming this rank even when this process exits right after
        (an exiting process shuts Horovod down, which the others would only see as a rank that
        died)."""
        agent = self.agent
        agent.fail()
        if not started:
            return
        deadline = time.monotonic() + self.timeout
        with agent.cond:
            while agent.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                agent.cond.wait(min(left, 0.05))

    def explain(self, err: AgentError) -> AgentError:
        """``err`` with what this rank knows about its cause: a rank that failed right after
        its messages turned non-finite (:meth:`check_params`: its parameters are); the same
        error when there is nothing to add. The failed ranks are ``err.failed_ranks``."""
        notes = []
        for w in getattr(err, "failed_ranks", ()):
            steps = sorted({k for v, k in self.agent.bad_log if v == w})
            if not steps or w == self.rank:
                continue
            first = len(steps) - 1       # start of the last run of non-finite messages
            while first > 0 and steps[first] - steps[first - 1] <= 2:
                first -= 1
            notes.append(f"rank {w} stopped right after its messages from step {steps[first]} on "
                         f"held NaN/Inf: a rank whose parameters became non-finite stops every "
                         f"rank (rank {w}'s own error names the parameters)")
        if not notes:
            return err
        return AgentError(f"{err}; " + "; ".join(notes), **err.fields())

    def raise_explained(self, err: AgentError):
        """Raise ``err``, explained when there is something to add (chained to it)."""
        better = self.explain(err)
        if better is err:
            raise err
        raise better from err


# ---- the replicas: forward-pass randomness per (seed, partition, step), first-step data -----


def replica_seed(seed: int, partition: int, step: int) -> int:
    """The 63-bit seed of the forward pass of ``(partition, step)`` (BLAKE2b of the three)."""
    raw = hashlib.blake2b(struct.pack("<3q", int(seed), int(partition), int(step)),
                          digest_size=8, person=b"pgc.fwd").digest()
    return int.from_bytes(raw, "little") & (2 ** 63 - 1)


def agree_seed(hvd, *, name: str, timeout: float, rank: int) -> int:
    """Rank 0's ``torch.initial_seed()`` (63 bits) on every rank: one int64 allgather."""
    mine = torch.initial_seed() & (2 ** 63 - 1)
    return gather_versions(hvd, mine, name=name, timeout=timeout, rank=rank,
                           what="the agreement on the forward pass's random seed")[0]


class ReplicaRNG:
    """Scopes of the forward pass's generators (module doc). ``device``: the parameters'."""

    def __init__(self, seed: int, device=None):
        self.seed = int(seed)
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = None
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.init()   # the parameters are there already: cheap
            self.cuda = torch.cuda.default_generators[index]

    @contextlib.contextmanager
    def scope(self, partition: int, step: int):
        """The body of ``(partition, step)`` draws from generators seeded by it; the previous
        states are restored after it (also when it raises)."""
        s = replica_seed(self.seed, partition, step)
        gens = [torch.random.default_generator] + ([self.cuda] if self.cuda is not None else [])
        saved = [g.get_state() for g in gens]
        for g in gens:
            g.manual_seed(s)
        try:
            yield
        finally:
            for g, st in zip(gens, saved):
                g.set_state(st)


# -- the first step's data -----------------------------------------------------------------
NOT_EVALUATED = -1

FIX = ("give every rank the same dataset (CodedLoader splits it into the scheme's partitions "
       "itself: do not shard it per rank) and make generated or randomly augmented data the "
       "same on every rank (seed it: torch.manual_seed(seed) before torch.randn, or a "
       "torch.Generator seeded the same on every rank; CodedLoader seeds the transforms of "
       "each sample itself)")


def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, np.ndarray):
        yield torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from _tensors(x[k])
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def batch_digest(batch) -> int:
    """A 63-bit digest of the tensors (and numpy arrays) in ``batch``, in order."""
    return tensors_digest(_tensors(batch))


class ReplicaDataCheck:
    """Notes the first step's batches and compares them across ranks, once (module doc)."""

    def __init__(self, n: int, rank: int):
        self.n, self.rank = int(n), int(rank)
        self.digests: dict = {}
        self.done = False

    def note(self, partition: int, batch) -> None:
        if not self.done:
            self.digests[int(partition)] = batch_digest(batch)

    def check(self, hvd, *, step: int, name: str, timeout: float) -> None:
        """One allgather of every rank's digests; ValueError when replicas differ."""
        if self.done:
            return
        self.done = True
        row = torch.full((1, self.n), NOT_EVALUATED, dtype=torch.int64)
        for k, d in self.digests.items():
            row[0, k] = d
        rows = allgather_polled(hvd, row, name=name, timeout=timeout, rank=self.rank,
                                what="the comparison of the replicas' first batches").tolist()
        bad = []
        for k in range(self.n):
            have = {r: rows[r][k] for r in range(len(rows)) if rows[r][k] != NOT_EVALUATED}
            if len(set(have.values())) > 1:
                groups: dict = {}
                for r, d in have.items():
                    groups.setdefault(d, []).append(r)
                bad.append((k, sorted(groups.values())))
        if bad:
            what = "; ".join(f"partition {k}: " + " vs ".join(f"ranks {g}" for g in gs)
                             for k, gs in bad[:4])
            more = f" and {len(bad) - 4} more partitions" if len(bad) > 4 else ""
            raise ValueError(
                f"pgc_hvd: the ranks' data differ: at step {step} the replicas of a partition "
                f"got different batches ({what}{more}). Gradient coding recovers the full "
                f"gradient only if every rank that evaluates a partition gets the same samples: "
                f"{FIX}.")
