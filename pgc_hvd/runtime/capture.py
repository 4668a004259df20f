"""Gradient capture: where each backward pass's gradient goes, up to the ring slots.

Owns the ring buffers (one flat fp32 d-vector per slot; GC's accumulate mode keeps one slot and
the message), the partition being evaluated, the gradient hooks and what they count
(``backward_passes_per_step``), the AMP unscaling of a step's slots, and the checks of a loop
that does something the scheme cannot follow (a backward outside ``batches()`` for a scheme
whose partitions rotate, ``p.grad`` changed after the last backward where several partitions
were evaluated, ``zero_grad()`` before ``step()``). The step's plan and version are arguments;
the one thing read back from the facade is the current ``(plan, version)`` when a hook starts a
partition implicitly (:attr:`GradientCapture.current`).

Runs on the training thread only (hooks fire there). May import: ``ops``, ``flat_layout`` and
torch; nothing of ``runtime``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

import pgc_hvd.ops as ops
from pgc_hvd.flat_layout import FlatLayout


class GradientCapture:
    """Moves gradients from ``p.grad`` into the ring slots of one worker (module doc).

    ``ring_mode`` keeps every slot (pipelined schemes; complex codes); otherwise (GC) the
    message m = sum_l b_l g_l is accumulated slot by slot with :func:`pgc_hvd.ops.add_slot`
    in :attr:`msg` (two buffers instead of c). ``current()`` returns the facade's
    ``(plan, version)`` (the hook's only way to learn them)."""

    def __init__(self, layout: FlatLayout, worker_ring, *, ring_mode: bool, passes_per_step: int,
                 current: Callable[[], tuple], scheme, rank: int, names: Optional[dict] = None):
        self.layout = layout
        self.worker_ring = worker_ring            # schemes.Ring: slot versions, plans
        self.ring_mode = bool(ring_mode)
        self.complex = bool(worker_ring.complex)
        nslots = worker_ring.size if self.ring_mode else 1
        self.ring = [layout.zeros() for _ in range(nslots)]
        self.msg = layout.zeros() if not self.complex else None
        self.passes_per_step = int(passes_per_step)
        self.current = current
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

    def attach(self) -> None:
        """Register the gradient hooks (last in the optimizer's construction: a construction
        that fails leaves no hook behind on the model)."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook)
                       for p in self.layout.params]

    # -- the plan's partitions ------------------------------------------------------------
    def new_step(self) -> None:
        """A new plan: no slot evaluated yet (GC: the message restarts from zero)."""
        self.done_slots = set()
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
        if not self.ring_mode:
            ops.add_slot(self.msg, self.ring[0], float(dict(plan.combine)[slot]))
        self.worker_ring.fill(slot, version)
        self.done_slots.add(slot)
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
                raise RuntimeError(
                    f"pgc_hvd: {self._passes} backward passes for one partition at step "
                    f"{self.current()[1]}, more than backward_passes_per_step="
                    f"{self.passes_per_step}; call step() after every "
                    f"{self.passes_per_step} backward pass(es), or raise "
                    f"backward_passes_per_step")
            self._grad_version = p.grad._version
        self.got_grad = True

    def _begin_implicit(self) -> None:
        """A backward pass outside ``batches()``: the gradient is taken as the one of the
        partition the plan wants next. That is only what the loop computed if the scheme asks
        this rank for its own partition at every step (dgd, is-sgd: then the user's own
        DataLoader with a DistributedSampler is this rank's shard); for every other scheme it is
        refused, because the data of the user's loader is not the partition the code needs
        (it would silently train on the fast ranks' data only)."""
        plan, version = self.current()
        if not self.own_partition_only():
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
        if len(plan.evaluate) < 2 or sentinel is None or sentinel.grad is None:
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

    def reset(self) -> None:
        """An empty ring (a run continued from another version): every slot is evaluated afresh
        at its first use."""
        for b in self.ring:
            b.zero_()
        self.worker_ring.reset()
