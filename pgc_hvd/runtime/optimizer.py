"""The optimizer behind ``pgc_hvd.DistributedOptimizer``: it steps with the n-s fastest ranks.

Shaped like ``hvd.DistributedOptimizer``: the constructor (:mod:`pgc_hvd.runtime.distributed`,
Horovod's signature) returns an instance of a dynamic subclass of the user's optimizer class
with the methods of :class:`PGCOptimizer`, so ``isinstance(opt, torch.optim.SGD)`` still holds
and the user's ``step`` rule (momentum, weight decay, Adam moments, ...) applies the decoded
update. Each rank is one worker of the scheme (n = ``hvd.size()``). Per step t (= the rank's model version, the number of updates it has applied):

1. the scheme's work plan says which partitions to evaluate into which ring slots
   (:meth:`batches` yields their batches; each partition's gradient accumulates in ``p.grad``
   as usual -- clipping or a GradScaler's ``unscale_`` after ``backward()`` act on it -- and
   moves into its flat ring slot when the partition ends);
2. :meth:`step` forms the coded message m_j = sum_l b_{j,l} g_l from the ring, optionally
   compresses it (top-kappa, error feedback; fp16 wire), checks it is finite, and hands it to
   the rank's :class:`~pgc_hvd.runtime.agent.CommAgent`;
3. it waits until step t is decided (by the n-s fastest ranks, or the scheme's rule) and
   applies ONE update, update t. A rank that is behind (step t was decided without it)
   computes nothing at that step (:attr:`computes` is False, :meth:`batches` yields nothing)
   and applies the next decided update at once. So the i-th ``step()`` call applies update i on
   every rank (docs/from_horovod.md).

Owns the facade: :class:`PGCOptimizer` (Horovod's step API -- ``step``,
``synchronize``, ``skip_synchronize``, ``zero_grad`` -- ``batches``, the loop-fed door) and
:class:`Lifecycle` (start, close, the re-plan of ``stragglers="auto"``, the staleness knob),
over one :class:`~pgc_hvd.runtime.step.Step`; the parts it wires (built by
:mod:`~pgc_hvd.runtime.wiring`) are listed in docs/architecture.md, "The runtime's parts".
fp16, bf16 and fp64 parameters train with fp32 ring, messages and updates, the update cast to
each parameter's dtype. Thread: the training thread (``__del__``: any thread, through
:func:`~pgc_hvd.runtime.lifecycle.collected`).
May import: numpy, torch, ``flat_layout``, ``runtime.agent``, ``runtime.auto_s``,
``runtime.capture``, ``runtime.config``, ``runtime.consistency``, ``runtime.errors``,
``runtime.interop``, ``runtime.lifecycle``, ``runtime.optim_state``, ``runtime.replicas``,
``runtime.step``, ``runtime.step_records``, ``runtime.wiring``.

Example::

    import horovod.torch as hvd, pgc_hvd
    hvd.init()
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                       named_parameters=model.named_parameters(),
                                       scheme="pgc-cr", stragglers=1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = pgc_hvd.data.CodedLoader(dataset, n=hvd.size(), batch_size=32, num_workers=2)
    for step in range(steps):
        for xb, yb in opt.batches(loader):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
        opt.step()
    # no close() needed: the end of the script closes it (runtime.lifecycle)
"""

from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np
import torch

from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime import consistency, interop, lifecycle
from pgc_hvd.runtime.agent import CommAgent
from pgc_hvd.runtime.capture import ReplicaRNG
from pgc_hvd.runtime.config import (RuntimeConfig, check_parameters, cross_rank_fields,
                                    parameter_names)
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.optim_state import StateDicts
from pgc_hvd.runtime.replicas import ReplicaDataCheck, agree_seed
from pgc_hvd.runtime.step import Step, declared_metrics
from pgc_hvd.runtime.step_records import StepRecorder
from pgc_hvd.runtime.wiring import Parts, build_parts, carry_over


def facade_methods() -> dict:
    """The methods (and class attributes) the dynamic subclass of the user's optimizer class
    carries: :class:`~pgc_hvd.runtime.optim_state.StateDicts`', :class:`Lifecycle`'s and
    :class:`PGCOptimizer`'s."""
    return {**StateDicts.__dict__, **Lifecycle.__dict__, **PGCOptimizer.__dict__}


class Lifecycle(StateDicts):
    """The facade's life around the steps, kept apart from :class:`PGCOptimizer`'s step API
    (none of it runs in a steady-state step): where the first step starts (``start_at``), the
    end (``close``, ``abandon``, ``abort``, :mod:`~pgc_hvd.runtime.lifecycle`'s order), the
    re-plan of ``stragglers="auto"`` (the parts rebuilt by :mod:`~pgc_hvd.runtime.wiring`) and
    the staleness knob. Not instantiated: the dynamic subclass carries its methods."""

    def start_at(self, version: int) -> None:
        """Before the first step: continue from model version ``version`` with an empty ring
        (every slot is evaluated afresh at its first use, the warm-up rule of
        :attr:`work_plan`), e.g. a world re-formed with another n whose ranks all hold the same
        parameters at that version. Every rank must pass the same version."""
        if self._pgc_step.started:
            raise RuntimeError("start_at must be called before the first step()")
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        self._pgc_step.restart_at(int(version))

    def apply_decided(self) -> None:
        """Apply every update decided so far (no new message), e.g. before saving a checkpoint
        at a step every rank has reached."""
        self._pgc_apply_decided()

    def abandon(self, join_timeout: float = 5.0) -> int:
        """Leave this optimizer without any collective, when its world is gone (a rank died and
        Horovod's elastic mode re-forms the world, :mod:`pgc_hvd.runtime.elastic`): wait up to
        ``join_timeout`` seconds for the agent thread to stop (its next collective fails),
        apply every update it decided (the same on every survivor), remove the gradient hooks
        and mark the optimizer closed. Returns the version reached."""
        lifecycle.abandon_in_order(join_timeout, agent=self._pgc_agent,
                                   recorder=self._pgc_recorder, capture=self._pgc_capture,
                                   apply_decided=self._pgc_apply_decided)
        self._pgc_closed = True
        return int(self.version)

    def abort(self) -> None:
        """The training thread failed and will not step again: tell the other ranks (they stop
        with an error naming this rank), remove the hooks, mark closed; no collective of the
        training thread (what :mod:`~pgc_hvd.runtime.lifecycle` does at an exit by an uncaught
        exception)."""
        if self._pgc_closed:
            return
        self._pgc_closed = True
        try:
            self._pgc_faults.fail(self._pgc_step.started)
        finally:
            self._pgc_capture.remove_hooks()
            self._pgc_recorder.close()

    def __del__(self):
        serial = getattr(self, "_pgc_serial", None)
        if serial is not None:   # a construction that failed registered nothing
            lifecycle.collected(self, serial)

    def close(self) -> None:
        """End of training (not needed: one not closed is closed at exit, at ``hvd.shutdown()``
        or once collected), in :func:`~pgc_hvd.runtime.lifecycle.close_in_order`'s steps: serve
        collectives until every rank is done, agree on the final version V = max_r version_r,
        apply the decided updates up to V, compare the parameters' and the applied
        hyper-parameters' digests (a disagreement raises :class:`AgentError` on every rank)."""
        if self._pgc_closed:
            return
        self._pgc_closed = True
        ends: list = []   # every rank's version at the end of its loop, once agreed
        try:
            lifecycle.close_in_order(
                self._pgc_hvd, self._pgc_config, self.rank, step=self._pgc_step,
                agent=self._pgc_agent, faults=self._pgc_faults, recorder=self._pgc_recorder,
                capture=self._pgc_capture, params=self._pgc_layout.params,
                apply_decided=self._pgc_apply_decided, ends=ends)
        finally:
            if ends:
                self.loop_end_versions = ends

    # -- stragglers="auto" (runtime.auto_s) ------------------------------------------------------
    @property
    def auto_stragglers(self):
        """The ``stragglers="auto"`` rule on this rank (:class:`~pgc_hvd.runtime.auto_s.
        RuntimeAutoS`: ``s``, ``switches``, ``summary()``), None for a fixed s."""
        return self._pgc_auto

    def _pgc_auto_boundary(self) -> None:
        """After update V - 1 was applied: re-plan when it carries a switch (every rank reads
        the same one at the same version V)."""
        from pgc_hvd.runtime.auto_s import switch_of
        last = self._pgc_step.last
        sw = switch_of(last)
        if sw is not None and last.step + 1 == self._pgc_step.version:
            self._pgc_replan(int(sw["new_s"]))

    def _pgc_replan(self, s: int) -> None:
        """The re-plan of a switch to budget ``s`` at version V (:mod:`pgc_hvd.runtime.auto_s`):
        leave the old agent at V (its updates decided meanwhile are applied), then the parts of
        ``s`` (:func:`~pgc_hvd.runtime.wiring.build_parts`; the agent on a channel of its own
        name) at the version reached; the loader re-bound; model and user's optimizer kept."""
        from pgc_hvd.runtime.auto_s import agent_name, replanned_config
        old_agent = self._pgc_agent
        if self._pgc_records:
            self._pgc_recorder.drain(old_agent)
        try:
            old_agent.finish()
            self._pgc_apply_decided()
        except AgentError as err:
            self._pgc_failed = True
            self._pgc_faults.raise_explained(err)
        if self._pgc_records:
            self._pgc_recorder.drain(old_agent)
        self._pgc_capture.remove_hooks()
        cfg = self._pgc_config = replanned_config(self._pgc_config, s)
        old, auto = self._pgc_parts, self._pgc_auto
        self._pgc_use(build_parts(
            self._pgc_hvd, cfg, rank=self.rank, n=self.n, layout=self._pgc_layout,
            names=self._pgc_names, param_groups=self.param_groups, recorder=self._pgc_recorder,
            reports=self._pgc_records, name=agent_name(cfg, auto.rule.n_switches),
            on_decided=auto.on_decided))
        carry_over(old, self._pgc_parts)
        bind = getattr(self._pgc_loader_seen, "bind", None)
        if bind is not None:
            bind(self.scheme, self.rank)
        auto.restarted()
        self._pgc_capture.attach()
        self._pgc_start_agent()

    # -- the staleness knob ----------------------------------------------------------------------
    @property
    def staleness_bound(self) -> Optional[int]:
        """The bound c of a bounded-staleness scheme (entries used satisfy t - v < c) as the
        decisions currently use it; None for schemes whose c is fixed by their code."""
        return self._pgc_agent.staleness_bound

    def set_staleness_bound(self, c: int) -> None:
        """Change the staleness bound c of a bounded-staleness scheme during training, to
        c in [1, c_0] (c_0: the bound the optimizer was built with). Rank 0's value is what
        counts: every rank applies it at the same control round
        (:meth:`~pgc_hvd.runtime.agent.CommAgent.request_staleness_bound`). Call it on every
        rank with the same value (as :class:`pgc_hvd.control.runtime.AdaptiveController` does)
        or on rank 0 only. PGC and the exact codes have no such knob: their c is the code's."""
        self._pgc_agent.request_staleness_bound(c)


class PGCOptimizer(Lifecycle):
    """Methods copied into the dynamic subclass of the user's optimizer class (built by
    :func:`pgc_hvd.DistributedOptimizer`; not instantiated directly)."""

    # GradScaler.step(opt) hands this optimizer the scale (``opt.grad_scale``) instead of
    # unscaling p.grad itself: the ring slots of the current step are unscaled in step()
    _step_supports_amp_scaling = True

    def __init__(self, optimizer, named_parameters, config: RuntimeConfig, hvd):
        # the wrapper shares the user's param-group dicts and state (as hvd.DistributedOptimizer
        # does), so a scheduler built on the optimizer before the wrap still sets the lr used
        super(self.__class__, self).__init__(optimizer.param_groups)
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._pgc_hvd, self.rank, self.n = hvd, hvd.rank(), hvd.size()
        self._pgc_config = config = config.checked(self.n)
        # the scheme, before any collective: its construction is the one check of s
        scheme = config.build_scheme(self.n, self.param_groups)
        params = [p for g in self.param_groups for p in g["params"]]
        self._pgc_names = parameter_names(params, named_parameters)
        lay = self._pgc_layout = FlatLayout(params)
        check_parameters(lay.params, self._pgc_names)
        consistency.check_construction(hvd, type(self).__bases__[0], self.param_groups,
                                       lay.params, cross_rank_fields(config), rank=self.rank,
                                       n=self.n, timeout=config.timeout)
        # closed; a step raised (the end of training aborts, not closes); in skip_synchronize()
        self._pgc_closed = self._pgc_failed = self._pgc_skip_sync = False
        self.catch_up_steps = 0            # step() calls that computed nothing (catching up)
        self._pgc_recorder = StepRecorder(   # its scheme's name and s: build_parts
            config.records, config.on_record, scheme_name=config.scheme, n=self.n, s=0,
            param_groups=self.param_groups)
        self._pgc_records = self._pgc_recorder.active   # rank 0's records drained per update
        self._pgc_auto = None   # stragglers="auto": the rule on this rank (runtime.auto_s)
        if config.auto is not None:
            from pgc_hvd.runtime.auto_s import RuntimeAutoS
            self._pgc_auto = RuntimeAutoS(config.auto, config.scheme, self.n,
                                          config.scheme_options)
        self._pgc_use(build_parts(   # scheme, ring, encoder, capture, agent, step, faults
            hvd, config, rank=self.rank, n=self.n, layout=lay, names=self._pgc_names,
            param_groups=self.param_groups, recorder=self._pgc_recorder,
            reports=self.rank == 0 and self._pgc_records, name=config.name,
            replay=config.replay_arrivals, replay_steps=config.replay_steps(self.rank),
            on_decided=None if self._pgc_auto is None else self._pgc_auto.on_decided,
            scheme=scheme))
        self._pgc_loader_seen = None   # the loader LoaderCheck saw last (checked at first sight)
        self._pgc_check_loader = consistency.LoaderCheck(
            hvd, n=self.n, rank=self.rank, name=config.name, timeout=config.timeout,
            scheme_name=self.scheme.name)
        # the forward pass's randomness per (seed, partition, step); the first step's data
        self._pgc_rng = ReplicaRNG(agree_seed(hvd, name=f"{config.name}.seed", rank=self.rank,
                                              timeout=config.timeout), lay.device)
        self._pgc_replicas = ReplicaDataCheck(self.n, self.rank)
        self._pgc_capture.attach()
        self._pgc_serial = lifecycle.register(self)   # closed at exit if close() is not called

    def _pgc_use(self, parts: Parts) -> None:
        """Run on ``parts`` (:func:`~pgc_hvd.runtime.wiring.build_parts`)."""
        self._pgc_parts, self.scheme = parts, parts.scheme
        self._pgc_encoder, self._pgc_capture = parts.encoder, parts.capture
        self._pgc_agent, self._pgc_step, self._pgc_faults = parts.agent, parts.step, parts.faults
        self._pgc_corrects_momentum = parts.corrects_momentum

    # -- public parts and state --------------------------------------------------------------
    @property
    def version(self) -> int:
        """The number of decided updates this rank has applied (= the step it computes next);
        before the first step, a version ``hvd.broadcast_optimizer_state`` brought (reading it
        changes nothing: the step adopts it at its first use,
        :meth:`~pgc_hvd.runtime.step.Step.adopt`)."""
        step = self._pgc_step
        if not step.started:
            v = interop.broadcast_version(self.param_groups)
            if v is not None:
                return v
        return step.version

    @version.setter
    def version(self, value: int) -> None:
        self._pgc_step.version = int(value)

    @property
    def config(self) -> RuntimeConfig:
        """The checked configuration the optimizer was built from (timeout, name, ...)."""
        return self._pgc_config

    @property
    def hvd(self):
        """The Horovod module (or stand-in) the optimizer runs on."""
        return self._pgc_hvd

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or :meth:`abandon`, :meth:`abort`) has run."""
        return self._pgc_closed

    @property
    def failed(self) -> bool:
        """Whether a step raised here or the agent stopped on an error (the end of training
        then aborts instead of closing, :mod:`~pgc_hvd.runtime.lifecycle`)."""
        return self._pgc_failed or self._pgc_agent.error is not None

    @property
    def started(self) -> bool:
        """Whether the first step has begun (checkpoints load only before it)."""
        return self._pgc_step.started

    @property
    def encoder(self):
        """The :class:`~pgc_hvd.compress.encoder.MessageEncoder` of this rank's messages."""
        return self._pgc_encoder

    @property
    def current_step(self) -> Step:
        """This rank's :class:`~pgc_hvd.runtime.step.Step` (its version, plan, clock, last
        update); reading it, or any of its attributes, changes nothing."""
        return self._pgc_step

    @property
    def agent(self) -> CommAgent:
        """This rank's communication agent (decisions, ``staleness_changes``, ``bad_log``)."""
        return self._pgc_agent

    @property
    def nonfinite_log(self) -> list:
        """(rank, step) of every message that held NaN/Inf (treated as a straggler)."""
        return list(self._pgc_agent.bad_log)

    @property
    def busy_seconds(self) -> float:
        return self._pgc_step.busy

    @property
    def current_partition(self) -> Optional[int]:
        """The partition whose gradient the backward passes now accumulate (inside
        :meth:`batches`' loop body; None outside), e.g. to seed dropout by (partition, step)."""
        slot = self._pgc_capture.target_slot
        plan = self._pgc_step.plan
        return None if slot is None or plan is None else dict(
            (sl, q) for q, sl in plan.evaluate).get(slot)

    @property
    def metrics(self) -> dict:
        """What the control rows said about the last update this rank applied, the same on
        every rank without a collective (:meth:`~pgc_hvd.runtime.step.Step.
        metrics`: ``step``, ``loss``, each declared user metric's mean, ``ranks``); read this
        instead of a per-batch ``hvd.allreduce`` of the loss, which would put the ranks back
        in lockstep. Empty before the first update."""
        return self._pgc_step.metrics(self._pgc_config.metrics)

    # -- data side ---------------------------------------------------------------------------
    @property
    def work_plan(self):
        """The scheme's WorkPlan for this rank at its current step (= ``version``); reading it
        changes nothing (the step begins in :meth:`batches`, :meth:`synchronize` or a backward
        pass: :meth:`~pgc_hvd.runtime.step.Step.begin`)."""
        return self._pgc_step.peek_plan()

    @property
    def computes(self) -> bool:
        """Whether this rank computes a message at its current step (False while it catches up
        on steps decided without it: :meth:`batches` then yields nothing): as decided when the
        step began, else as it would be now."""
        return self._pgc_step.would_compute()

    def begin_partition(self, slot: int) -> None:
        """Backward passes until :meth:`end_partition` are the gradient of ring slot ``slot``:
        they accumulate in ``p.grad`` as usual, and :meth:`end_partition` moves them into it."""
        self._pgc_capture.begin(slot, *self._pgc_step.current())

    def end_partition(self) -> None:
        """Move the gradients in ``p.grad`` into the current ring slot and clear ``p.grad``."""
        self._pgc_capture.end(*self._pgc_step.current())

    @contextlib.contextmanager
    def partition(self, slot: int):
        self.begin_partition(slot)
        try:
            yield
        finally:
            self.end_partition()

    def batches(self, loader):
        """Yield the batch of every partition the scheme wants this rank to evaluate now, with
        the gradient target set to its ring slot (run forward + backward on each); nothing while
        this rank catches up (:attr:`computes`). ``loader``: :class:`pgc_hvd.CodedLoader` (any
        torch Dataset) or :class:`~pgc_hvd.runtime.PartitionLoader`. The last batch's gradient
        stays in ``p.grad`` until ``step()``; a batch without backward leaves its slot empty
        (``step()`` names it). A loader's partitioning is compared across ranks at first sight
        (:class:`~pgc_hvd.runtime.consistency.LoaderCheck`)."""
        if loader is not self._pgc_loader_seen:
            self._pgc_check_loader(loader, bind=(self.scheme, self.rank))
            self._pgc_loader_seen = loader
        step, cap = self._pgc_step, self._pgc_capture
        plan = step.begin()
        if not step.computes:
            if cap.amp:
                cap.zero_grads()
            return
        for i, (partition, slot) in enumerate(plan.evaluate):
            if step.overtaken():
                return  # straggler_policy="cancel": this step fired without us
            version = step.version
            cap.begin(slot, plan, version)
            batch = loader.batch(partition, version)
            if not step.started:
                self._pgc_replicas.note(partition, batch)
            with self._pgc_rng.scope(partition, version):
                yield batch
            if i + 1 < len(plan.evaluate) or not cap.got_grad:
                cap.end_pending(plan, version)  # no backward: step() names the slot
            else:
                cap.last_batch_done()

    # -- the loop-fed door (pgc_hvd.DistributedDataParallel, runtime.ddp) ---------------------
    def feed_from_loop(self) -> None:
        """The user's own loop feeds the scheme's partitions, one batch per step (the DDP door,
        :mod:`pgc_hvd.runtime.ddp`; :meth:`~pgc_hvd.runtime.capture.GradientCapture.
        feed_from_loop`). Before the first step."""
        if self._pgc_step.started:
            raise RuntimeError("feed_from_loop must be called before the first step()")
        self._pgc_capture.feed_from_loop(self._pgc_step.version)

    def loop_partitions(self, step: int) -> tuple:
        """``((partition, weight), ...)`` of the loop's batch of ``step``
        (:meth:`~pgc_hvd.runtime.capture.GradientCapture.loop_partitions`)."""
        return self._pgc_capture.loop_partitions(step)

    @property
    def loop_width(self) -> int:
        """The most partitions a loop's batch holds at a step, over every rank
        (:meth:`~pgc_hvd.runtime.capture.GradientCapture.loop_width`)."""
        return self._pgc_capture.loop_width(self.n)

    def begin_loop_step(self) -> bool:
        """A training forward of the loop begins the step of :attr:`version` (if it has not);
        whether this rank computes at it (:meth:`~pgc_hvd.runtime.step.Step.begin_loop`)."""
        if self._pgc_closed:
            raise RuntimeError("pgc_hvd optimizer is closed")
        return self._pgc_step.begin_loop()

    # -- the step ------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's ``zero_grad``, refused (as Horovod refuses it) between the last
        ``backward()`` and ``step()``: p.grad then holds the gradient ``step()`` sends."""
        self._pgc_capture.check_zero_grad(self.version)
        super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    def step(self, closure=None, loss=None, metrics=None):
        """Apply ONE decided update, update ``version``, then ``version += 1``: send this rank's
        message if it computes at this step, wait until the step is decided (a rank that is
        behind applies the next decided update at once), apply it with the user's rule. After
        :meth:`synchronize` it applies ``p.grad`` as left there. ``loss`` (a float) and
        ``metrics`` (``{name: float}``, names declared at construction) travel in the control
        row; :attr:`metrics` shows the decided step's means on every rank."""
        ret = None
        if closure is not None:
            with torch.enable_grad():
                ret = closure()
            if loss is None and ret is not None:
                loss = float(ret)
        if self._pgc_closed:
            raise RuntimeError("pgc_hvd optimizer is closed")
        if self._pgc_init_from_horovod():
            return ret
        if not self._pgc_capture.update_in_grad:
            if self._pgc_skip_sync:
                raise RuntimeError(
                    "pgc_hvd: step() under skip_synchronize() without synchronize() first: call "
                    "optimizer.synchronize() (it sends this rank's message and puts the decoded "
                    "update in p.grad), then step() under skip_synchronize()")
            self.synchronize(loss, metrics)
        self._pgc_apply_grads()
        if self._pgc_auto is not None:
            self._pgc_auto_boundary()
        return ret

    def synchronize(self, loss=None, metrics=None) -> None:
        """Horovod's ``synchronize()``: send this rank's message (if it computes at this step),
        wait until the step is decided, and put the decoded update -- the averaged gradient the
        step applies, the same bits on every rank -- into ``p.grad`` (in each parameter's dtype).
        The user may then inspect or clip it and apply it with ``with
        optimizer.skip_synchronize(): optimizer.step()``. Idempotent until that ``step()``."""
        if self._pgc_closed:
            raise RuntimeError("pgc_hvd optimizer is closed")
        if self._pgc_capture.update_in_grad:
            return
        step = self._pgc_step
        try:
            if not step.started:
                self._pgc_start()
            step.begin()
            values = declared_metrics(self._pgc_config.metrics, metrics)
            if not step.exchange(loss=loss, metrics=values,
                                 grad_scale=getattr(self, "grad_scale", None)):
                self.catch_up_steps += 1
        except AgentError as err:
            self._pgc_failed = True
            self._pgc_faults.raise_explained(err)
        except BaseException:
            self._pgc_failed = True
            self._pgc_faults.fail(step.started)
            raise
        self._pgc_load_update()
        self._pgc_capture.update_loaded()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's ``skip_synchronize()``: ``step()`` inside it applies ``p.grad`` as
        :meth:`synchronize` left it (and refuses when ``synchronize()`` was not called)."""
        self._pgc_skip_sync = True
        try:
            yield
        finally:
            self._pgc_skip_sync = False

    def _pgc_start(self) -> None:
        """First step: take a version broadcast by ``hvd.broadcast_optimizer_state``, check that
        every rank starts at the same version (one int64 allgather), start the agent."""
        self._pgc_step.adopt()
        cfg = self._pgc_config
        try:
            consistency.check_start(self._pgc_hvd, self.version, timeout=cfg.timeout,
                                    name=f"{cfg.name}.start.version", rank=self.rank)
            self._pgc_replicas.check(self._pgc_hvd, step=self.version,
                                     name=f"{cfg.name}.replicas", timeout=cfg.timeout)
        except ValueError:       # the ranks disagree: the check's own message
            raise
        except RuntimeError as err:   # its collective failed: a rank died or hung before it
            raise AgentError(f"rank {self.rank}: the first step's check across the ranks "
                             f"failed, so a rank died or hung before its first step: "
                             f"{err}") from err
        self._pgc_start_agent()

    def _pgc_start_agent(self) -> None:
        self._pgc_step.start()

    def _pgc_init_from_horovod(self) -> bool:
        """``hvd.broadcast_optimizer_state``'s state-creating ``step()``: the user's rule on zero
        gradients, nothing sent (:func:`~pgc_hvd.runtime.interop.init_state_step`)."""
        if self.state or not interop.called_by_broadcast_state(depth=3):
            return False
        interop.init_state_step(self._pgc_layout.params, super(self.__class__, self).step)
        return True

    def _pgc_load_update(self) -> None:
        """Put the decided update of step ``version`` into ``p.grad``; the records of the steps
        decided so far are written first (rank 0, on this thread)."""
        if self._pgc_records:
            self._pgc_recorder.drain(self._pgc_agent)
        self._pgc_step.load_decided()

    def _pgc_apply_grads(self) -> None:
        """The user's optimizer rule on ``p.grad`` (the decoded update), then ``version += 1``.
        A GradScaler's ``grad_scale`` / ``found_inf`` on this optimizer are its own (the ring
        was unscaled), not the rule's: torch's SGD/Adam would apply them to the decoded update,
        so they are set aside while it runs."""
        mine = vars(self)
        amp = {k: mine.pop(k) for k in ("grad_scale", "found_inf") if k in mine}
        try:
            self._pgc_step.apply(super(self.__class__, self).step,
                                 correct_momentum=self._pgc_corrects_momentum)
        finally:
            mine.update(amp)
        self._pgc_check_params()

    def _pgc_check_params(self) -> None:
        if self._pgc_agent.bad_log:   # a non-finite message was seen: look (runtime/faults.py)
            self._pgc_faults.check_params(report=not self._pgc_closed,
                                          started=self._pgc_step.started)

    def _pgc_apply_decided(self, upto: Optional[int] = None) -> None:
        """Apply every decided update not applied yet (up to ``upto``), without new messages."""
        step = self._pgc_step
        while step.behind and (upto is None or step.version < upto):
            self._pgc_load_update()
            self._pgc_apply_grads()
        step.after_update()
        self._pgc_check_params()
