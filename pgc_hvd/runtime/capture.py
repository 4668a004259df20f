"""The partition being evaluated, on the training thread: where its gradient goes, what its
forward pass draws, and which partitions a step of a loop-fed run evaluates.

* :class:`GradientCapture` (the part the gradient hooks hold): where each backward pass's
  gradient goes, up to the ring slots. It owns the ring buffers (one flat fp32 d-vector per
  slot; GC's accumulate mode keeps one slot and the message), the partition being evaluated,
  the gradient hooks and what they count (``backward_passes_per_step``), the AMP unscaling of a
  step's slots, and the checks of a loop that does something the scheme cannot follow (a
  backward outside ``batches()`` for a scheme whose partitions rotate, ``p.grad`` changed after
  the last backward where several partitions were evaluated, ``zero_grad()`` before
  ``step()``). When a hook starts a partition implicitly it asks the step for the current
  ``(plan, version)`` (:meth:`~pgc_hvd.runtime.step.Step.current`).
* :func:`loop_plan`: the plan of a loop that runs one batch per step (the DDP door), a function
  of (scheme, rank, step) only, so that the sampler predicts the steps to come with it.
* :class:`ReplicaRNG`: the forward pass's randomness of each partition as a function of (seed,
  partition, step). Gradient coding decodes the full gradient only when the replicas of a
  partition compute the same gradient. Dropout, stochastic depth and any other torch random
  draw in the forward pass come from the rank's own generator, so two ranks evaluating the same
  batch would draw different masks. :meth:`ReplicaRNG.scope` wraps the loop body of each
  partition that ``optimizer.batches()`` yields: torch's default CPU generator (and the CUDA
  generator of the parameters' device, when they are on one) is seeded from ``(seed,
  partition, step)`` and its previous state is restored when the body ends, so the user's
  generators outside ``batches()`` are left as they were. The seed is agreed at construction
  (:func:`pgc_hvd.runtime.replicas.agree_seed`); the first step's data is compared by
  :mod:`pgc_hvd.runtime.replicas`.

The step that drives them (version, plan, message, update) is :mod:`pgc_hvd.runtime.step`'s.

Owns :class:`GradientCapture` (the ring buffers, the partition being evaluated, the hooks),
:func:`loop_plan` and :class:`ReplicaRNG`. Thread: the training thread only (the hooks fire
inside its ``backward()``; for CUDA parameters autograd runs them on its device thread while
the training thread waits in ``backward()``).
May import: ``ops``, ``flat_layout``, numpy and torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import struct
from typing import Callable, Optional

import torch

import pgc_hvd.ops as ops
from pgc_hvd.flat_layout import FlatLayout


class GradientCapture:
    """Moves gradients from ``p.grad`` into the ring slots of one worker (module doc).

    ``ring_mode`` keeps every slot (pipelined schemes; complex codes); otherwise (GC) the
    message m = sum_l b_l g_l is accumulated slot by slot with :func:`pgc_hvd.ops.add_slot`
    in :attr:`msg` (two buffers instead of c). ``current()`` begins the step if needed and
    returns its ``(plan, version)`` (:meth:`~pgc_hvd.runtime.step.Step.current`, the hook's
    only way to learn them; set by the ``Step`` that uses this capture)."""

    def __init__(self, layout: FlatLayout, worker_ring, *, ring_mode: bool, passes_per_step: int,
                 scheme, rank: int, names: Optional[dict] = None):
        self.layout = layout
        self.worker_ring = worker_ring            # schemes.Ring: slot versions, plans
        self.ring_mode = bool(ring_mode)
        self.complex = bool(worker_ring.complex)
        nslots = worker_ring.size if self.ring_mode else 1
        self.ring = [layout.zeros() for _ in range(nslots)]
        self.msg = layout.zeros() if not self.complex else None
        #: where the step's message is (not ring mode): ``msg``, or the payload row a loop-fed
        #: step's gradient was moved into (:meth:`end`'s ``out``)
        self.message = self.msg
        self.passes_per_step = int(passes_per_step)
        self.current: Optional[Callable[[], tuple]] = None   # Step.current, set by the Step
        self.scheme, self.rank = scheme, int(rank)
        self.scheme_name = scheme.name
        self.names = names or {}
        self._own_only: Optional[bool] = None    # the scheme always asks for this rank's own
        self.done_slots: set = set()
        self.target_slot: Optional[int] = None    # the slot whose gradient accumulates in p.grad
        self.got_grad = False                     # a gradient reached the target slot
        #: synchronize() put the update in p.grad (update_loaded / update_applied write it)
        self.update_in_grad = False
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
        self._loop_width: Optional[int] = None    # loop_width(n), computed at its first use

    def attach(self) -> None:
        """Register the gradient hooks (last in the optimizer's construction: a construction
        that fails leaves no hook behind on the model)."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook)
                       for p in self.layout.params]

    # -- the plan's partitions ------------------------------------------------------------
    def new_step(self) -> None:
        """A new plan: no slot evaluated yet (GC: the message restarts from zero; a loop-fed
        step's one backward overwrites it: no pass to zero it)."""
        self.done_slots = set()
        self._left = self._bucket_done = None
        self.message = self.msg
        if not self.ring_mode and not self.loop_fed:
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

    def end(self, plan, version: int, out: Optional[torch.Tensor] = None) -> None:
        """Move ``p.grad`` (fp16/bf16/fp64 cast to fp32) into the current slot (GC: add b_l
        times it into the message) and clear ``p.grad``. A loop-fed GC step's gradient is its
        message: it goes into ``out`` when given (the payload row that is sent: no copy), else
        into ``msg``; :attr:`message` says where."""
        slot = self.target_slot
        if slot is None:
            return
        lay = self.layout
        direct = self.gradient_is_message
        if direct:
            self.message = target = self.msg if out is None else out
        else:
            target = self._slot()
        grads = [p.grad for p in lay.params]
        if all(g is not None and g.dtype == torch.float32 and g.layout == torch.strided
               for g in grads):
            torch.cat([g.reshape(-1) for g in grads], out=target)   # one op, not one a tensor
        else:
            target.zero_()
            for p, g in zip(lay.params, grads):
                if g is not None:
                    lay.view(target, p).add_(g)
        for p in lay.params:
            p.grad = None
        if not self.ring_mode and not direct:
            ops.add_slot(self.msg, self.ring[0], float(dict(plan.combine)[slot]))
        self._close(plan, version)

    @property
    def gradient_is_message(self) -> bool:
        """Loop-fed GC (no ring): the step's one backward is its message (:meth:`end`'s out)."""
        return self.loop_fed and not self.ring_mode

    def evaluated(self, plan, slot: int) -> list:
        """The ring slots one backward of ``slot`` evaluates: every slot of the plan when the
        loop feeds it (its batch holds them all), else ``slot``."""
        return [sl for _, sl in plan.evaluate] if self.loop_fed else [slot]

    def _close(self, plan, version: int) -> None:
        """The target partition's slots are filled at ``version``; no partition is open."""
        for sl in self.evaluated(plan, self.target_slot):
            self.worker_ring.fill(sl, version)
            self.done_slots.add(sl)
        self.target_slot = None
        self._sentinel = None

    def end_pending(self, plan, version: int, out: Optional[torch.Tensor] = None) -> None:
        """End the partition whose gradient is still in p.grad (a backward ran; ``out``: as in
        :meth:`end`) or drop the target (none did: the slot stays missing and step() names it)."""
        if self.got_grad:
            self.end(plan, version, out)
        else:
            self.target_slot = None

    def last_batch_done(self) -> None:
        """The loop body of the last batch is over: what it did to p.grad (clipping) is in; a
        change after it is refused by :meth:`check_untouched`."""
        if self._sentinel is not None and self._sentinel.grad is not None:
            self._grad_version = self._sentinel.grad._version

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

    def update_loaded(self) -> None:
        """``synchronize()`` put the decided update into ``p.grad``: a backward before
        ``step()`` is refused (:meth:`_hook`)."""
        self.update_in_grad = True

    def update_applied(self) -> None:
        """``step()`` applied the update in ``p.grad``: gradients may come again."""
        self.update_in_grad = False

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

    def touched(self) -> bool:
        """Whether ``p.grad`` changed after the last backward (clipping, ``unscale_``)."""
        sentinel = self._sentinel
        return (sentinel is not None and sentinel.grad is not None
                and sentinel.grad._version != self._grad_version)

    def end_stream(self, plan, version: int) -> list:
        """``step()`` of a streamed step: the buckets no hook completed (parameters with no
        gradient: their zeros are in the slot), returned for the step to form; ``p.grad``
        cleared and the slot filled, as :meth:`end` does, without moving it again."""
        left = [k for k, m in enumerate(self._left) if m > 0]
        for p in self.layout.params:
            p.grad = None
        self._close(plan, version)
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
        if (self.loop_fed or len(plan.evaluate) < 2 or not self.touched()
                or grad_scale is not None):
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
            self.message.mul_(inv)

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
        """The user's own loop feeds the scheme's partitions, one batch per step (the DDP door,
        :mod:`pgc_hvd.runtime.ddp`, with :class:`pgc_hvd.CodedSampler`): from now on a backward
        outside ``batches()`` is the step's evaluation (:attr:`loop_fed`; several partitions
        share the batch, rows weighted by their coefficients) and a pipelined scheme's ring
        starts with zeros of model ``version``. Complex coefficients are refused."""
        if self.complex:
            raise ValueError(
                f"scheme {self.scheme_name} has complex coefficients, which a batch's row "
                f"weights cannot carry: use it through optimizer.batches(loader), or another "
                f"scheme (pgc-cr, bcgc, gc-cr, ...) with pgc_hvd.DistributedDataParallel")
        self.loop_fed = True
        if self.ring_mode:
            self.zero_start(version)

    def loop_partitions(self, step: int) -> tuple:
        """``((partition, weight), ...)``: what the loop's batch of ``step`` holds (the
        partitions this rank evaluates there, :func:`loop_plan`) and the weight of each one's
        gradient in the message (1 where the ring applies the coefficients; a pipelined
        scheme's). Nothing changes."""
        plan = loop_plan(self.scheme, self.rank, int(step), self.ring_mode)
        if self.ring_mode:
            return tuple((int(q), 1.0) for q, _ in plan.evaluate)
        coef = dict(plan.combine)
        return tuple((int(q), float(coef[sl])) for q, sl in plan.evaluate)

    def loop_width(self, n: int) -> int:
        """The most partitions a loop's batch holds at a step, over the ``n`` ranks and the
        steps of a period of the plans (BCGC's loads differ by rank): every rank's batch gives
        each partition B // width rows, so replicas evaluate the same samples. Computed once."""
        if self._loop_width is None:
            span = 2 * (self.worker_ring.size + n) + 1
            self._loop_width = max(len(loop_plan(self.scheme, r, t, self.ring_mode).evaluate)
                                   for r in range(n) for t in range(span))
        return self._loop_width

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


# ---- the forward pass's randomness per (seed, partition, step) -------------------------------


def replica_seed(seed: int, partition: int, step: int) -> int:
    """The 63-bit seed of the forward pass of ``(partition, step)`` (BLAKE2b of the three)."""
    raw = hashlib.blake2b(struct.pack("<3q", int(seed), int(partition), int(step)),
                          digest_size=8, person=b"pgc.fwd").digest()
    return int.from_bytes(raw, "little") & (2 ** 63 - 1)


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
