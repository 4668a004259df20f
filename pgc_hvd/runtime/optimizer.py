"""``pgc_hvd.DistributedOptimizer``: a Horovod optimizer that steps with the n-s fastest ranks.

Shaped like ``hvd.DistributedOptimizer``: it returns an instance of a dynamic subclass of the
user's optimizer class, so ``isinstance(opt, torch.optim.SGD)`` still holds and the user's
``step`` rule (momentum, weight decay, Adam moments, ...) applies the decoded update. Each rank
is one worker of the scheme (n = ``hvd.size()``).

Per step t (= the rank's model version, the number of updates it has applied):

1. the scheme's work plan says which partitions to evaluate into which ring slots
   (:meth:`batches` yields their batches; each partition's gradient accumulates in ``p.grad``
   as usual -- clipping or a GradScaler's ``unscale_`` after ``backward()`` act on it -- and
   moves into its flat ring slot when the partition ends);
2. :meth:`step` forms the coded message m_j = sum_l b_{j,l} g_l from the ring
   (:func:`pgc_hvd.ops.coded_accumulate`; GC accumulates slot by slot with
   :func:`pgc_hvd.ops.add_slot`), optionally compresses it (top-kappa, error feedback; fp16
   wire), checks it is finite, and hands it to the rank's
   :class:`~pgc_hvd.runtime.agent.CommAgent`;
3. it waits until step t is decided (by the n-s fastest ranks, or the scheme's rule) and
   applies ONE update, update t. A rank that is behind (step t was decided without it)
   computes nothing at that step (:attr:`computes` is False, :meth:`batches` yields nothing)
   and applies the next decided update at once. So the i-th ``step()`` call applies update i on
   every rank: loops of N calls end at version N everywhere, and what a loop does per
   iteration (a scheduler's ``step()``, an lr from the loop counter, clipping between
   :meth:`synchronize` and ``step()`` under :meth:`skip_synchronize`) happens at the same
   update on every rank (docs/from_horovod.md).

Consistency (:mod:`pgc_hvd.runtime.consistency`; each check once, none per step): construction
compares across ranks everything that must agree (optimizer class, every hyper-parameter of every
param group, scheme, s, options, compression, control, name, optimistic, the parameters' dtypes,
device kind and shapes) and the first :meth:`batches` of a loader its partitioning, each mismatch
a ValueError on every rank naming the field, the ranks and their values; a rank whose parameters
turn non-finite stops every rank (:meth:`_pgc_check_params`); :meth:`close` brings every rank to
the same final version and compares the parameters' digests. fp16, bf16 and fp64 parameters
train with fp32 ring, messages and updates, the update cast to each parameter's dtype.

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
    opt.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
import zlib
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

import pgc_hvd.ops as ops
from pgc_hvd.compress import TopK, make_codec, optimistic_default
from pgc_hvd.compress.codecs import DenseCodec, ResidualMemory
from pgc_hvd.control.momentum import compensated, momentum_correction
from pgc_hvd.options import is_count
from pgc_hvd.runtime.agent import AgentError, CommAgent, Outgoing
from pgc_hvd.flat_layout import FlatLayout


def _takes_three(fn) -> bool:
    """Whether ``fn`` accepts three positional arguments (``on_update(step, flat, decision)``)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    pos = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos += 1
    return pos >= 3


def _all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one read of x and no allocation: any NaN or
    Inf entry makes the sum NaN or Inf; a finite sum proves them all finite. Only a sum that
    overflowed (or a real NaN/Inf) is checked entry by entry."""
    total = float(x.sum()) if not x.is_complex() else complex(x.sum())
    if (math.isfinite(total) if isinstance(total, float)
            else math.isfinite(total.real) and math.isfinite(total.imag)):
        return True
    return bool(torch.isfinite(x).all())


_VERSION_KEY = "pgc_version"   # rank 0's version in param_groups[0] of state_dict()


def _is_horovod_broadcast_state(code) -> bool:
    """Whether ``code`` is horovod.torch's ``broadcast_optimizer_state``."""
    fn = None
    try:
        from horovod.torch import functions
        fn = getattr(functions, "broadcast_optimizer_state", None)
    except ImportError:
        return False
    return fn is not None and code is fn.__code__


def _hyper_digest(param_groups, prev: int) -> int:
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


def _check_arguments(n: int, *, stragglers, compression, delays, records, timeout, poll_interval,
                     on_record, on_update, replay_arrivals, scheme_options, optimistic=None):
    """Type and range checks of DistributedOptimizer's arguments, before any collective, each
    error naming the argument. Returns (s as an int, delays as a DelayModel or None); a delay
    spec string (``"exp:mean=0.1,seed=1"``) is parsed as the simulator's ``--delay``."""
    import operator

    from pgc_hvd.delays import check_workers, parse_delay

    if isinstance(stragglers, bool):
        raise TypeError("stragglers must be an int (the straggler budget s), got a bool")
    try:
        s = operator.index(stragglers)
    except TypeError:
        raise TypeError(f"stragglers must be an int (the straggler budget s), got "
                        f"{stragglers!r}") from None
    if compression is not None and not isinstance(compression, TopK):
        raise TypeError(f"compression must be None (dense messages) or pgc_hvd.runtime.TopK(...), "
                        f"got {compression!r}; Horovod's hvd.Compression does not apply here")
    if optimistic is not None and not isinstance(optimistic, bool):
        raise TypeError(f"optimistic must be None (by message size), True or False, got "
                        f"{optimistic!r}")
    if isinstance(delays, str):
        delays = parse_delay(delays)
    if delays is not None and not callable(getattr(delays, "sample", None)):
        raise TypeError(f"delays must be None, a delay model (DelayModel, or any object with "
                        f"sample(worker, step) -> seconds) or a spec string such as "
                        f"'exp:mean=0.1,seed=1', got {delays!r}")
    if delays is not None:
        check_workers(delays, n)
    if records is not None and not callable(getattr(records, "write", None)):
        raise TypeError(f"records must be None or have a write(record) method (e.g. "
                        f"pgc_hvd.metrics.records.RecordWriter(path)), got {records!r}")
    for name, fn in (("on_record", on_record), ("on_update", on_update)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be None or callable, got {fn!r}")
    for name, v in (("timeout", timeout), ("poll_interval", poll_interval)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0):
            raise ValueError(f"{name} must be finite seconds > 0, got {v!r}")
    for w, _ in replay_arrivals or ():
        if not 0 <= int(w) < n:
            raise ValueError(f"replay_arrivals names worker {w}, outside [0, n) = [0, {n}): "
                             "was the schedule recorded with another number of ranks?")
    if (scheme_options or {}).get("decoder") == "min-error" and compression is None:
        raise ValueError("decoder='min-error' picks the complete class whose messages lost least "
                         "to compression (sum of ||C(u_i) - u_i||), so it needs compressed "
                         "messages: pass compression=pgc_hvd.runtime.TopK(...), or use "
                         "decoder='n-s' for dense ones")
    return s, delays


@dataclass(frozen=True)
class RuntimeConfig:
    """The keyword arguments of :func:`DistributedOptimizer` (its docstring says what each
    means), in one object. :meth:`checked` validates them for a world of n ranks before any
    collective (:func:`_check_arguments`), parses a delay spec string, and returns the config
    the optimizer is built from."""

    scheme: str = "pgc-cr"
    stragglers: int = 1
    compression: Any = None
    delays: Any = None
    records: Any = None
    scheme_options: Optional[dict] = None
    timeout: float = 60.0
    poll_interval: float = 0.002
    name: str = "pgc"
    on_record: Any = None
    on_update: Any = None
    replay_arrivals: Any = None
    straggler_policy: str = "continue"
    optimistic: Optional[bool] = None
    control: str = "allgather"
    backward_passes_per_step: int = 1
    op_scale: float = 1.0
    wire_dtype: Optional[str] = None     # "float16": dense messages travel as fp16
    metrics: tuple = ()                  # names of the user metrics step(metrics=) carries
    momentum_correction: bool = True     # pgc_hvd.control.momentum (stale gradients' momentum)

    def checked(self, n: int) -> "RuntimeConfig":
        s, delays = _check_arguments(
            n, stragglers=self.stragglers, compression=self.compression, delays=self.delays,
            records=self.records, timeout=self.timeout, poll_interval=self.poll_interval,
            on_record=self.on_record, on_update=self.on_update,
            replay_arrivals=self.replay_arrivals, scheme_options=self.scheme_options,
            optimistic=self.optimistic)
        from pgc_hvd.control.momentum import parse_momentum_correction
        return dataclasses.replace(self, stragglers=s, delays=delays,
                                   momentum_correction=parse_momentum_correction(
                                       self.momentum_correction))


class _PGCOptimizer(torch.optim.Optimizer):
    """Methods copied into the dynamic subclass of the user's optimizer class."""

    # GradScaler.step(opt) hands this optimizer the scale (``opt.grad_scale``) instead of
    # unscaling p.grad itself: the ring slots of the current step are unscaled in step()
    _step_supports_amp_scaling = True

    def __init__(self, optimizer, named_parameters, config: RuntimeConfig, hvd):
        # the wrapper shares the user's param-group dicts and state (as hvd.DistributedOptimizer
        # does), so a scheduler built on the optimizer before the wrap still sets the lr used
        super(self.__class__, self).__init__(optimizer.param_groups)
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._pgc_hvd = hvd
        self.rank, self.n = hvd.rank(), hvd.size()
        self._pgc_config = config = config.checked(self.n)
        (scheme, stragglers, compression, delays, records, scheme_options, timeout, poll_interval,
         name, on_record, on_update, replay_arrivals, straggler_policy, optimistic, control) = (
            config.scheme, config.stragglers, config.compression, config.delays, config.records,
            config.scheme_options, config.timeout, config.poll_interval, config.name,
            config.on_record, config.on_update, config.replay_arrivals, config.straggler_policy,
            config.optimistic, config.control)
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            ids = {id(p) for _, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in ids and p.requires_grad]
            if missing:
                raise ValueError(f"named_parameters does not name {len(missing)} of the "
                                 f"optimizer's parameters (indices {missing[:5]})")
            self._pgc_names = {id(p): nm for nm, p in named}
        self._pgc_layout = FlatLayout(params)
        self._pgc_compression = compression
        self._pgc_timeout = float(timeout)
        scheme_options = dict(scheme_options or {})
        if control not in ("allgather", "store"):
            raise ValueError(f"control must be 'allgather' or 'store', got {control!r}")
        self._pgc_check_config(str(scheme), int(stragglers), scheme_options, compression, control,
                               name=name, optimistic=optimistic, replay=replay_arrivals)
        from pgc_hvd.schemes import Ring, get_scheme
        self.scheme = get_scheme(scheme, self.n, int(stragglers), **scheme_options)
        self._pgc_delays = delays
        self._pgc_started = False
        self._pgc_version = 0
        self._pgc_on_record = on_record
        self._pgc_on_update = on_update
        # on_update(step, flat) (original form) or on_update(step, flat, decision): decided once
        self._pgc_update_decision = on_update is not None and _takes_three(on_update)
        replay = [(int(w), int(k)) for w, k in replay_arrivals] if replay_arrivals else None
        # replay: the steps this rank computes, in order (it skips the others, as in the run
        # the order came from)
        self._pgc_replay_steps = sorted({k for w, k in replay or () if w == self.rank})
        self._pgc_replay_set = set(self._pgc_replay_steps)
        if straggler_policy not in ("continue", "cancel"):
            raise ValueError(f"straggler_policy must be 'continue' or 'cancel', "
                             f"got {straggler_policy!r}")
        if straggler_policy == "cancel":
            if self.scheme.late_usable:
                raise ValueError(f"straggler_policy='cancel' drops late messages, but "
                                 f"{self.scheme.name} uses them (staleness table)")
            if replay:
                raise ValueError("replay_arrivals replays a schedule in which every rank "
                                 "computes given steps; use straggler_policy='continue'")
        self._pgc_cancel = straggler_policy == "cancel"
        self._pgc_cancelled = False
        self._pgc_records = records
        # slot versions, plans and the unfilled-slot rule (schemes.ring); the buffers are ours
        self._pgc_worker_ring = Ring(self.scheme, self.rank)
        self._pgc_complex = self._pgc_worker_ring.complex
        # ring mode keeps every slot (pipelined schemes; complex codes); accumulate mode forms the
        # GC message slot by slot with add_slot (two buffers instead of c)
        self._pgc_ring_mode = bool(self.scheme.pipelined or self._pgc_complex)
        L = self._pgc_worker_ring.size
        nslots = L if self._pgc_ring_mode else 1
        lay = self._pgc_layout
        self._pgc_ring = [lay.zeros() for _ in range(nslots)]
        self._pgc_msg = lay.zeros() if not self._pgc_complex else None
        d = lay.numel
        memory = (ResidualMemory(d, lay.device) if isinstance(compression, TopK) and
                  compression.error_feedback and not self._pgc_complex else None)
        wire = None if config.wire_dtype is None else getattr(torch, config.wire_dtype)
        self._pgc_codec = make_codec(d, compression, complex_messages=self._pgc_complex,
                                     memory=memory, wire_dtype=wire)
        self._pgc_residual = None if memory is None else memory.residual
        self._pgc_plan = None
        self._pgc_done_slots: set = set()
        self._pgc_target_slot = None       # the slot whose gradient accumulates in p.grad
        self._pgc_computes = True          # this rank sends a message at step `version`
        self._pgc_synced = False           # synchronize() put update `version` in p.grad
        self._pgc_skip_sync = False        # inside skip_synchronize()
        self._pgc_amp = False              # a GradScaler has handed a scale to step()
        self._pgc_zero_flat = None         # zeros for p.grad in a catch-up step under AMP
        self._pgc_sentinel = None          # the parameter whose hook counts backward passes
        self._pgc_passes = 0
        self._pgc_grad_version = -1        # its p.grad._version after the last backward
        self._pgc_passes_per_step = int(config.backward_passes_per_step)
        self._pgc_op_scale = float(config.op_scale)
        self._pgc_own_only = None          # the scheme always asks for this rank's partition
        self._pgc_hp_digest = 0            # running digest of applied hyper-parameters
        self._pgc_last_update = None
        self.catch_up_steps = 0            # step() calls that applied an update decided without
        #                                    this rank's message, computing nothing
        self._pgc_busy = 0.0
        self._pgc_compute_start = None
        self._pgc_closed = False
        self._pgc_t0 = time.time()
        if optimistic is None:   # small payloads ride with the control rows (compress.transport)
            optimistic = control == "allgather" and optimistic_default(
                self._pgc_codec.payload_bytes, torch.device(lay.device).type == "cpu", self.n)
        self._pgc_optimistic = bool(optimistic)
        channel = None
        if control == "store":
            from pgc_hvd.runtime.control_store import StoreChannel
            channel = StoreChannel.create(hvd, self.rank, self.n, name, timeout)
        self._pgc_agent = CommAgent(
            hvd, self.scheme, self.rank, d, self.scheme.lookback, codec=self._pgc_codec,
            device=lay.device, timeout=timeout, poll_interval=poll_interval,
            on_step=self._pgc_record_step if (self.rank == 0) else None, name=name, replay=replay,
            optimistic=self._pgc_optimistic, channel=channel,
            metrics=len(config.metrics))
        # bounded staleness: the bound c it was built with (set_staleness_bound may lower it)
        self._pgc_c0 = (int(self.scheme.staleness_bound)
                        if self.scheme.staleness_bound_adjustable else None)
        self._pgc_hooks = [p.register_post_accumulate_grad_hook(self._pgc_grad_hook)
                           for p in lay.params]

    # -- construction checks ----------------------------------------------------
    def _pgc_check_config(self, scheme, s, options, compression, control="allgather", *,
                          name="pgc", optimistic=None, replay=None):
        """Every rank compares everything that must agree across ranks before any scheme is built
        (:func:`pgc_hvd.runtime.consistency.optimizer_fingerprint`: scheme, s, options,
        compression, control, name, optimistic, replayed arrivals, the optimizer class and every
        hyper-parameter of every param group, the parameters' dtypes, device kind and shapes);
        a mismatch raises the same ValueError on every rank, naming each field that differs, the
        ranks that differ from rank 0 and their values. The collectives are named
        ``pgc.config.*`` whatever ``name`` is, so a different ``name`` is reported, not waited
        on. Local checks that need no collective come first (:meth:`_pgc_check_dtypes`)."""
        from pgc_hvd.compress.transport import optimistic_threshold
        from pgc_hvd.runtime import consistency

        self._pgc_name = str(name)
        self._pgc_loader_fps: list = []   # loader fingerprints already compared (batches())
        self._pgc_last_loader = None      # the loader last passed to batches() (checked)
        self._pgc_bad_checked = 0         # bad_log entries already looked at (_pgc_check_params)
        self._pgc_grad_bufs: dict = {}    # param id -> update buffer in the parameter's dtype
        self._pgc_got_grad = False        # a gradient reached the current partition's slot
        self._pgc_check_dtypes()
        # the effective optimistic setting follows from the payload size (the same on every rank
        # once the rest agrees) and PGC_HVD_OPTIMISTIC_BYTES (per rank)
        opt_field = (bool(optimistic) if optimistic is not None else
                     f"by payload size (n payloads at most {optimistic_threshold()} bytes, "
                     f"PGC_HVD_OPTIMISTIC_BYTES)")
        fp = consistency.optimizer_fingerprint(
            type(self).__bases__[0], self.param_groups, self._pgc_layout.params, scheme=scheme,
            stragglers=s, options=options, compression=compression, control=control,
            name=str(name), optimistic=opt_field, replay=replay,
            extra={"wire dtype": self._pgc_config.wire_dtype or "float32",
                   "op (update factor)": self._pgc_config.op_scale,
                   "backward_passes_per_step": self._pgc_config.backward_passes_per_step,
                   "metrics (names)": list(self._pgc_config.metrics),
                   "momentum_correction": self._pgc_config.momentum_correction})
        rows = consistency.gather_fingerprints(
            self._pgc_hvd, fp, name="pgc.config", timeout=self._pgc_timeout, rank=self.rank,
            what="the construction check of DistributedOptimizer (every rank must construct it)")
        diffs = consistency.fingerprint_differences(rows)
        if diffs:
            raise ValueError(consistency.mismatch_message(
                diffs, what="pgc_hvd.DistributedOptimizer",
                fix=f"Every rank must build the optimizer with the same arguments, "
                    f"hyper-parameters and model: compute them from the same configuration, not "
                    f"from the rank (world size {self.n})."))

    def _pgc_check_dtypes(self) -> None:
        """Parameters must be real floating point. fp16, bf16 and fp64 parameters work: the ring,
        the coded messages and the decoded update are fp32 (the kernels' dtype; gradients are
        added into the fp32 ring slots as they arrive), and the update is cast to each
        parameter's dtype when it is applied (:meth:`_pgc_apply`), so an fp64 gradient is
        rounded to fp32 on its way, an fp16/bf16 one is not rounded further. Complex
        parameters have no fp32 ring form: refused here, before any collective."""
        bad = [(i, p.dtype) for i, p in enumerate(self._pgc_layout.params)
               if not p.dtype.is_floating_point]
        if bad:
            names = getattr(self, "_pgc_names", {})
            which = ", ".join(f"{names.get(id(self._pgc_layout.params[i]), f'#{i}')} "
                              f"({str(dt).replace('torch.', '')})" for i, dt in bad[:5])
            raise TypeError(f"pgc_hvd.DistributedOptimizer: parameters {which} are not real "
                            f"floating point; the ring and messages are fp32 vectors. Use "
                            f"float32, float16, bfloat16 or float64 parameters (e.g. keep real "
                            f"and imaginary parts as two real parameters)")

    @property
    def version(self) -> int:
        """The model version: the number of decided updates this rank has applied (= the step it
        computes next). Before the first step, a version that ``hvd.broadcast_optimizer_state``
        brought from rank 0 (:meth:`state_dict`) is taken on first read."""
        if not self._pgc_started and _VERSION_KEY in self.param_groups[0]:
            self._pgc_adopt_broadcast_version()
        return self._pgc_version

    @version.setter
    def version(self, value: int) -> None:
        self._pgc_version = int(value)

    @property
    def current_partition(self) -> Optional[int]:
        """The partition whose gradient the backward passes now accumulate (inside
        :meth:`batches`' loop body; None outside), e.g. to seed dropout by (partition, step)."""
        slot = self._pgc_target_slot
        return None if slot is None else dict(
            (sl, q) for q, sl in self.work_plan.evaluate).get(slot)

    # -- data side ---------------------------------------------------------------
    @property
    def work_plan(self):
        """The scheme's WorkPlan for this rank at its current step (= ``version``)."""
        if self._pgc_plan is None:
            # a ring slot never filled (warm-up cancelled) is evaluated now (Ring.plan)
            self._pgc_plan = self._pgc_worker_ring.plan(self.version)
            self._pgc_done_slots = set()
            self._pgc_computes = self._pgc_decide_computes()
            if not self._pgc_ring_mode:
                self._pgc_msg.zero_()
            if self._pgc_compute_start is None:
                self._pgc_compute_start = time.monotonic()
        return self._pgc_plan

    def _pgc_decide_computes(self) -> bool:
        """Whether this rank evaluates its plan and sends a message at step ``version``.

        Every ``step()`` applies exactly one decided update (update ``version``), so a rank
        whose step ``version`` has already been decided without it (a straggler that is behind)
        computes nothing while it catches up: its message would be too late, its ring keeps
        the partition gradients it has; it computes again at the first step not yet decided.
        Replaying a schedule (``replay_arrivals``), a rank computes exactly the steps it
        computed there."""
        if self._pgc_replay_steps and self.version <= self._pgc_replay_steps[-1]:
            return self.version in self._pgc_replay_set
        return not self._pgc_started or self.version >= self._pgc_agent.decided()

    @property
    def computes(self) -> bool:
        """Whether this rank computes a message at its current step (False while it catches up
        on steps decided without it: :meth:`batches` then yields nothing)."""
        self.work_plan
        return self._pgc_computes

    def begin_partition(self, slot: int) -> None:
        """Backward passes until :meth:`end_partition` are the gradient of ring slot ``slot``:
        they accumulate in ``p.grad`` as usual (so ``clip_grad_norm_`` or a GradScaler's
        ``unscale_`` after ``backward()`` act on them), and :meth:`end_partition` moves them
        into the slot."""
        plan = self.work_plan
        if slot not in [sl for _, sl in plan.evaluate]:
            raise ValueError(f"slot {slot} is not evaluated at step {self.version} "
                             f"(plan {plan.evaluate})")
        if self._pgc_target_slot is not None:
            self.end_partition()
        self._pgc_target_slot = slot
        self._pgc_passes = 0
        self._pgc_got_grad = False

    def end_partition(self) -> None:
        """Move the gradients in ``p.grad`` (fp16/bf16/fp64 cast to fp32) into the current ring
        slot (GC: add b_l times it into the message) and clear ``p.grad``."""
        slot = self._pgc_target_slot
        if slot is None:
            return
        lay = self._pgc_layout
        target = self._pgc_ring[slot if self._pgc_ring_mode else 0]
        target.zero_()
        for p in lay.params:
            if p.grad is not None:
                lay.view(target, p).add_(p.grad)
                p.grad = None
        if not self._pgc_ring_mode:
            coef = dict(self.work_plan.combine)[slot]
            ops.add_slot(self._pgc_msg, self._pgc_ring[0], float(coef))
        self._pgc_worker_ring.fill(slot, self.version)
        self._pgc_done_slots.add(slot)
        self._pgc_target_slot = None
        self._pgc_sentinel = None

    @contextlib.contextmanager
    def partition(self, slot: int):
        self.begin_partition(slot)
        try:
            yield
        finally:
            self.end_partition()

    def batches(self, loader):
        """Yield the batch of every partition the scheme wants this rank to evaluate now, with
        the gradient target set to its ring slot (run forward + backward on each). ``loader``:
        :class:`pgc_hvd.CodedLoader` for any torch Dataset (torchvision's ``CIFAR10`` /
        ``ImageFolder``, DataLoader workers and prefetching), or
        :class:`~pgc_hvd.runtime.PartitionLoader` for in-memory tensors.

        Nothing is yielded while this rank catches up on steps decided without it
        (:attr:`computes`): each ``step()`` then applies one more decided update. The gradient of
        the last batch stays in ``p.grad`` until ``step()`` (or ``synchronize()``), the
        others move into their ring slots when the loop asks for the next batch.

        A batch whose loop body runs no backward (``continue``) leaves its slot without a
        gradient: :meth:`step` then refuses ("slots ... got no gradient") instead of sending a
        zero gradient for it. The first time a loader is seen its partitioning is compared
        across ranks (:meth:`_pgc_check_loader`)."""
        self._pgc_check_loader(loader)
        if getattr(loader, "_pgc_bound", None) is not self:
            bind = getattr(loader, "bind", None)
            if callable(bind):  # lets a prefetching loader foresee the (partition, step) pairs
                bind(self.scheme, self.rank)
            try:
                loader._pgc_bound = self
            except AttributeError:
                pass
        plan = self.work_plan
        if not self._pgc_computes:
            if self._pgc_amp:
                self._pgc_zero_grads()
            return
        evaluate = plan.evaluate
        for i, (partition, slot) in enumerate(evaluate):
            if self._pgc_overtaken():
                return  # straggler_policy="cancel": this step fired without us
            self.begin_partition(slot)
            yield loader.batch(partition, self.version)
            if i + 1 < len(evaluate) or not self._pgc_got_grad:
                self._pgc_end_pending()   # into its slot; no backward: step() names the slot
            elif self._pgc_sentinel is not None and self._pgc_sentinel.grad is not None:
                # the last partition's gradient stays in p.grad until step(); what the loop
                # body did to it (clipping) is in; a change after the loop is checked there
                self._pgc_grad_version = self._pgc_sentinel.grad._version

    def _pgc_zero_grads(self) -> None:
        """p.grad = zeros (one flat buffer, viewed per parameter): a GradScaler's inf check in an
        iteration that computes nothing (catching up) then finds finite gradients."""
        lay = self._pgc_layout
        if self._pgc_zero_flat is None:
            self._pgc_zero_flat = lay.zeros()
        self._pgc_zero_flat.zero_()
        for p, v in lay.views(self._pgc_zero_flat):
            p.grad = v if p.dtype == v.dtype else v.to(p.dtype)

    def _pgc_check_loader(self, loader) -> None:
        """Compare the loader's partitioning across ranks
        (:func:`pgc_hvd.runtime.consistency.loader_fingerprint`: class, n, seed, batch size,
        partitions, samples and labels of a PartitionLoader) the first time this loader object
        is passed to :meth:`batches`, and again whenever a loader with a partitioning not
        compared before is passed: one collective on the training thread, so every rank must
        pass its loaders in the same order; the same loader again costs nothing. A mismatch
        raises the same ValueError on every rank naming the field and the ranks."""
        if loader is self._pgc_last_loader:
            return
        from pgc_hvd.runtime import consistency

        n_parts = getattr(loader, "n", None)
        if n_parts is not None and n_parts != self.n:
            raise ValueError(f"pgc_hvd: the loader splits the data into n = {n_parts} partitions "
                             f"but {self.scheme.name} runs on {self.n} ranks, one partition per "
                             f"rank: build it with n=hvd.size()")
        fp = consistency.loader_fingerprint(loader)
        if fp not in self._pgc_loader_fps:
            k = len(self._pgc_loader_fps)
            rows = consistency.gather_fingerprints(
                self._pgc_hvd, fp, name=f"{self._pgc_name}.loader.{k}",
                timeout=self._pgc_timeout, rank=self.rank,
                what=f"the comparison of loader {k} across ranks at its first batches() (every "
                     f"rank must iterate optimizer.batches(loader) with its loaders in the same "
                     f"order)")
            diffs = consistency.fingerprint_differences(rows)
            if diffs:
                raise ValueError(consistency.mismatch_message(
                    diffs, what="pgc_hvd: optimizer.batches(loader)", hint=consistency.LOADER_HINT,
                    fix="Build the loader from the same data and arguments on every rank."))
            self._pgc_loader_fps.append(fp)
        self._pgc_last_loader = loader

    def _pgc_overtaken(self) -> bool:
        """straggler_policy="cancel": has the step this rank is computing been decided without
        its message? (Then the rest of the step is abandoned: no message is sent, evaluated
        ring slots are kept, and the rank moves on to the newest model.)"""
        if self._pgc_cancel and self._pgc_started and self._pgc_agent.decided() > self.version:
            self._pgc_cancelled = True
        return self._pgc_cancelled

    def _pgc_grad_hook(self, p: torch.Tensor) -> None:
        """After each parameter's gradient is accumulated into ``p.grad``: note it (the
        gradient stays in p.grad until the partition ends), count backward passes
        (``backward_passes_per_step``), and start the plan's partition implicitly for a loop that
        does not use :meth:`batches` (allowed only where the scheme always asks a rank for its
        own partition: dgd, is-sgd)."""
        if p.grad is None:
            return
        if self._pgc_synced:
            raise RuntimeError(
                "pgc_hvd: a backward pass ran after optimizer.synchronize() and before step(): "
                "p.grad holds the decoded update of step "
                f"{self.version}; call step() (under skip_synchronize()) first")
        if self._pgc_target_slot is None:
            self._pgc_begin_implicit()
        if self._pgc_sentinel is None:
            self._pgc_sentinel = p
        if p is self._pgc_sentinel:
            self._pgc_passes += 1
            if self._pgc_passes > self._pgc_passes_per_step:
                raise RuntimeError(
                    f"pgc_hvd: {self._pgc_passes} backward passes for one partition at step "
                    f"{self.version}, more than backward_passes_per_step="
                    f"{self._pgc_passes_per_step}; call step() after every "
                    f"{self._pgc_passes_per_step} backward pass(es), or raise "
                    f"backward_passes_per_step")
            self._pgc_grad_version = p.grad._version
        self._pgc_got_grad = True

    def _pgc_begin_implicit(self) -> None:
        """A backward pass outside :meth:`batches`: the gradient is taken as the one of the
        partition the plan wants next. That is only what the loop computed if the scheme asks
        this rank for its own partition at every step (dgd, is-sgd: then the user's own
        DataLoader with a DistributedSampler is this rank's shard); for every other scheme it is
        refused, because the data of the user's loader is not the partition the code needs
        (it would silently train on the fast ranks' data only)."""
        plan = self.work_plan
        if not self._pgc_own_partition_only():
            raise RuntimeError(
                f"pgc_hvd: a backward pass ran outside optimizer.batches(loader), but "
                f"{self.scheme.name} asks rank {self.rank} for partitions "
                f"{[q for q, _ in plan.evaluate]} at step {self.version} (the partitions rotate "
                f"or are replicated), which your own DataLoader does not know: the run would "
                f"train on the wrong data. Feed the dataset through the scheme: `loader = "
                f"pgc_hvd.data.CodedLoader(dataset, n=hvd.size(), batch_size=..., num_workers=...)` (any "
                f"torch Dataset) and `for xb, yb in optimizer.batches(loader): ...backward()`; "
                f"or use scheme='dgd' / 'is-sgd', which keep one shard per rank")
        todo = [sl for _, sl in plan.evaluate if sl not in self._pgc_done_slots]
        if not todo:
            raise RuntimeError(
                f"pgc_hvd: a backward pass ran at step {self.version} after every partition "
                f"of the work plan was evaluated; call optimizer.step() first")
        self.begin_partition(todo[0])

    def _pgc_own_partition_only(self) -> bool:
        """Does the scheme ask this rank for exactly its own partition at every step? (Checked
        over 2n + ring steps once: the plans are periodic.)"""
        if self._pgc_own_only is None:
            span = 2 * self.n + self._pgc_worker_ring.size + 1
            self._pgc_own_only = all(
                [q for q, _ in self.scheme.work_plan(self.rank, t).evaluate] == [self.rank]
                for t in range(span))
        return self._pgc_own_only

    # -- the step ------------------------------------------------------------------
    def step(self, closure=None, loss=None, metrics=None):
        """Apply ONE decided update: update ``version``, then ``version += 1``.

        If this rank computes at this step (:attr:`computes`) its message is formed from the
        ring and sent first, and the call waits until the step is decided by the n - s fastest
        ranks (or the scheme's rule); a rank that is behind (its step was decided without it)
        applies the next decided update at once. So the i-th ``step()`` call applies update i on
        every rank: a loop of N calls ends at version N everywhere, and whatever the loop does
        per iteration (a scheduler's ``step()``, an lr set from the iteration count, clipping
        under ``synchronize()``) happens at the same update on every rank.

        After :meth:`synchronize` (the decoded update already sits in ``p.grad``, perhaps
        clipped), ``step()`` applies ``p.grad``. ``loss`` (a float) travels in the control row
        and ``metrics`` (``{name: float}`` for the names given at construction) travel in the
        control row; :attr:`metrics` shows the decided step's means on every rank."""
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
        if not self._pgc_synced:
            if self._pgc_skip_sync:
                raise RuntimeError(
                    "pgc_hvd: step() under skip_synchronize() without synchronize() first: call "
                    "optimizer.synchronize() (it sends this rank's message and puts the decoded "
                    "update in p.grad), then step() under skip_synchronize()")
            self.synchronize(loss, metrics)
        self._pgc_apply_grads()
        return ret

    def synchronize(self, loss=None, metrics=None) -> None:
        """Horovod's ``synchronize()``: send this rank's message (if it computes at this step),
        wait until the step is decided, and put the decoded update -- the averaged gradient the
        step applies, the same bits on every rank -- into ``p.grad`` (in each parameter's dtype).
        The user may then inspect or clip it (``clip_grad_norm_`` then clips identically on
        every rank) and apply it with ``with optimizer.skip_synchronize(): optimizer.step()``.
        Idempotent until that ``step()``."""
        if self._pgc_closed:
            raise RuntimeError("pgc_hvd optimizer is closed")
        if self._pgc_synced:
            return
        self._pgc_exchange(loss, metrics)
        self._pgc_load_update()
        self._pgc_synced = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's ``skip_synchronize()``: ``step()`` inside it applies ``p.grad`` as
        :meth:`synchronize` left it (and refuses when ``synchronize()`` was not called)."""
        self._pgc_skip_sync = True
        try:
            yield
        finally:
            self._pgc_skip_sync = False

    def _pgc_exchange(self, loss, metrics=None) -> None:
        """Send this rank's message for step ``version`` if it computes at this step (else drop
        any gradient the loop computed anyway), then wait until the step is decided."""
        if not self._pgc_started:
            self._pgc_start()
        try:
            self.work_plan
            values = self._pgc_metric_values(metrics)
            if self._pgc_computes:
                self._pgc_send(loss, values)
            else:
                self.catch_up_steps += 1
                self._pgc_discard_gradients()
            self._pgc_agent.wait_for(self.version)
        except AgentError as err:
            better = self._pgc_explain(err)
            if better is err:
                raise
            raise better from err
        except BaseException:
            self._pgc_fail()
            raise

    def _pgc_start(self) -> None:
        """First step: take a version broadcast by ``hvd.broadcast_optimizer_state`` (a resume
        where rank 0 loaded the checkpoint), check that every rank starts at the same version
        (one int64 allgather), start the agent."""
        from pgc_hvd.runtime import consistency

        versions = consistency.gather_versions(
            self._pgc_hvd, self.version, name=f"{self._pgc_name}.start.version",
            timeout=self._pgc_timeout, rank=self.rank)
        if len(set(versions)) != 1:
            by = {}
            for r, v in enumerate(versions):
                by.setdefault(v, []).append(r)
            listing = ", ".join(f"ranks {rs}: version {v}" for v, rs in sorted(by.items()))
            raise ValueError(
                f"pgc_hvd: the ranks start at different model versions ({listing}): "
                f"a checkpoint was loaded on some ranks only. Load it on every rank "
                f"(pgc_hvd.runtime.load_checkpoint), or load it on rank 0 and then call "
                f"hvd.broadcast_parameters(model.state_dict(), 0) and "
                f"hvd.broadcast_optimizer_state(optimizer, 0) on every rank before the first "
                f"step")
        self._pgc_agent.start()
        self._pgc_started = True

    def _pgc_adopt_broadcast_version(self) -> None:
        """Before the first step: ``hvd.broadcast_optimizer_state`` wrote rank 0's version into
        ``param_groups[0]["pgc_version"]`` (see :meth:`state_dict`); continue from it."""
        g0 = self.param_groups[0]
        if _VERSION_KEY in g0:
            v = int(round(float(g0.pop(_VERSION_KEY))))
            if v != self.version:
                self.start_at(v)

    def _pgc_discard_gradients(self) -> None:
        """A rank that catches up computes nothing: a gradient its loop computed anyway (its
        own DataLoader, a GradScaler's zeros) is dropped."""
        for p in self._pgc_layout.params:
            p.grad = None
        self._pgc_target_slot = None
        self._pgc_sentinel = None
        self._pgc_busy += time.monotonic() - self._pgc_compute_start

    def _pgc_init_from_horovod(self) -> bool:
        """``hvd.broadcast_optimizer_state(opt, root)`` on an optimizer without state first sets
        every ``p.grad`` to zeros and calls ``opt.step()`` to create the state (Adam's moments,
        momentum buffers); for its own DistributedOptimizer it calls the wrapped class's step.
        Recognised by the caller's code object, that call runs the user's optimizer rule on
        the zero gradients, as Horovod's does (the same on every rank), and sends nothing."""
        import sys

        if self.state:   # Horovod creates the state only where there is none
            return False
        frame, hops = sys._getframe(2), 0
        while frame is not None and hops < 4:   # through torch's step wrappers
            if _is_horovod_broadcast_state(frame.f_code):
                break
            frame, hops = frame.f_back, hops + 1
        else:
            return False
        if frame is None:
            return False
        # the zero-gradient step must not move the parameters (weight decay would, on the ranks
        # that had no state, e.g. all but rank 0 on a resume): they are put back
        keep = [p.detach().clone() for p in self._pgc_layout.params]
        super(self.__class__, self).step()
        with torch.no_grad():
            for p, k in zip(self._pgc_layout.params, keep):
                p.copy_(k)
                p.grad = None
        return True

    def _pgc_metric_values(self, metrics) -> tuple:
        """``step(metrics={name: value})`` as the k floats of the control row (NaN for a name
        not given); unknown names or non-numbers are refused."""
        names = self._pgc_config.metrics
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

    @property
    def metrics(self) -> dict:
        """What the control rows said about the last update this rank applied, the same on
        every rank without a collective: ``step``, ``loss`` (the mean of the losses sent with
        the messages the decision used), each declared user metric's mean over those messages
        (NaN where none carried it), and ``ranks`` (whose messages were used). A per-batch
        ``hvd.allreduce`` of the loss would wait for every rank and put them back in lockstep,
        which is the straggler tolerance lost; read this instead. Empty before the first
        update."""
        upd = self._pgc_last_update
        if upd is None:
            return {}
        info = upd.info
        out = {"step": upd.step, "loss": info.get("loss"),
               "ranks": sorted({u.worker for u in upd.decision.uses})}
        for name, v in zip(self._pgc_config.metrics, info.get("metrics", ())):
            out[name] = v
        return out

    def _pgc_send(self, loss, metrics: tuple = ()) -> None:
        plan = self.work_plan
        if self._pgc_target_slot is not None:   # the last partition's gradient is in p.grad
            self._pgc_check_grad_untouched(plan)
            self._pgc_end_pending()
        if self._pgc_overtaken():
            self._pgc_busy += time.monotonic() - self._pgc_compute_start
            return
        missing = [sl for _, sl in plan.evaluate if sl not in self._pgc_done_slots]
        if missing:
            raise RuntimeError(
                f"pgc_hvd: scheme {self.scheme.name} asks rank {self.rank} to evaluate partitions "
                f"{[p for p, sl in plan.evaluate]} at step {self.version}, but slots {missing} got "
                f"no gradient; iterate `for batch in optimizer.batches(loader)` (or use "
                f"optimizer.partition(slot)) and run backward on each batch")
        self._pgc_unscale_amp(plan)
        t = self.version
        packed = payload = None
        if self._pgc_complex:
            msg = sum(self._pgc_ring[sl].to(torch.complex64) * c for sl, c in plan.combine)
        elif self._pgc_ring_mode:
            if isinstance(self._pgc_codec, DenseCodec):
                # the dense payload row is the message: form it in place (one pass over d)
                packed, payload = self._pgc_agent.payload_buffer()
                msg = payload
            else:
                msg = self._pgc_msg
            ops.coded_accumulate(msg, [self._pgc_ring[sl] for sl, _ in plan.combine],
                                    [float(c) for _, c in plan.combine])
        else:
            msg = self._pgc_msg
        if self._pgc_delays is not None:  # straggler injection on the compute side
            delay = float(self._pgc_delays.sample(self.rank, t))
            if delay > 0:
                if self._pgc_cancel:  # cut short when the step fires without this rank
                    self._pgc_agent.wait_decided_beyond(t, delay)
                else:
                    time.sleep(delay)
        if self._pgc_overtaken():
            self._pgc_busy += time.monotonic() - self._pgc_compute_start
            return
        self._pgc_busy += time.monotonic() - self._pgc_compute_start
        if not _all_finite(msg):
            self._pgc_agent.report_bad(t, self._pgc_busy)
            return
        if payload is None:
            packed, payload = self._pgc_agent.payload_buffer()
        error_norm = self._pgc_payload(msg, payload)
        slot_versions = self._pgc_worker_ring.message_versions(plan)
        self._pgc_agent.submit(Outgoing(t, t, payload, time.time(),
                                        math.nan if loss is None else float(loss),
                                        slot_versions, packed=packed, error_norm=error_norm,
                                        metrics=metrics),
                               self._pgc_busy)

    def _pgc_end_pending(self) -> None:
        """End the partition whose gradient is still in p.grad (a backward ran) or drop the
        target (none did: the slot stays missing and step() names it)."""
        if self._pgc_got_grad:
            self.end_partition()
        else:
            self._pgc_target_slot = None
    
    def _pgc_check_grad_untouched(self, plan) -> None:
        """Where a step evaluates several partitions (GC, BCGC, PGC's warm-up), only the last
        one's gradient is still in p.grad after the loop: a change made to it there (clipping,
        GradScaler.unscale_) would act on one partition of several. Refused, with the two ways
        that work. (A GradScaler's own inf check in ``scaler.step`` also writes p.grad in
        place; it is recognised by the scale it hands over, ``grad_scale``.)"""
        sentinel = self._pgc_sentinel
        if len(plan.evaluate) < 2 or sentinel is None or sentinel.grad is None:
            return
        if sentinel.grad._version == self._pgc_grad_version:
            return
        if getattr(self, "grad_scale", None) is not None:
            return   # GradScaler.step(): its inf check touched p.grad, the scale comes next
        raise RuntimeError(
            f"pgc_hvd: p.grad was changed after the last backward (clip_grad_norm_, "
            f"GradScaler.unscale_, ...), but {self.scheme.name} evaluates "
            f"{len(plan.evaluate)} partitions at step {self.version} and only the last one's "
            f"gradient is still in p.grad, so the change would act on one partition of "
            f"{len(plan.evaluate)}. Clip inside the batches() loop right after backward() (each "
            f"partition's gradient), or clip the decoded update: optimizer.synchronize(); "
            f"clip_grad_norm_(...); with optimizer.skip_synchronize(): optimizer.step(). With a "
            f"GradScaler, call scaler.step(optimizer) without unscale_()")

    def _pgc_unscale_amp(self, plan) -> None:
        """``GradScaler.step(optimizer)`` sets ``optimizer.grad_scale`` (the loss scale S every
        backward pass of this step used; it changes only in ``scaler.update()``, after the step):
        the ring slots evaluated at this step (GC: the accumulated message) are divided by S
        before the message is formed, so every message, and the ring that later messages reuse,
        holds true gradients whatever each rank's scale (the scales differ across ranks: each
        rank's scaler backs off on its own overflows). A message that overflowed is non-finite
        and left out like a straggler's. ``grad_scale`` is None when the user already called
        ``scaler.unscale_(optimizer)`` (p.grad was unscaled in place)."""
        scale = getattr(self, "grad_scale", None)
        if scale is None:
            return
        self._pgc_amp = True
        inv = 1.0 / float(scale)
        if inv == 1.0:
            return
        if self._pgc_ring_mode:
            for sl in self._pgc_done_slots:
                self._pgc_ring[sl].mul_(inv)
        else:
            self._pgc_msg.mul_(inv)

    def _pgc_payload(self, msg: torch.Tensor, out: torch.Tensor) -> float:
        """Write the message's payload row into ``out`` through the codec
        (:mod:`pgc_hvd.compress.codecs`; no copy when ``out`` already is the dense message).
        Returns ||C(u) - u||, the compression error the minimum-error class decoder ranks the
        classes by, when the scheme uses that decoder (nan otherwise: it costs a pass over d)."""
        return self._pgc_codec.encode(
            msg, out, error_norm=self.scheme.needs_error_norms)

    def _pgc_load_update(self) -> None:
        """Put the decided update of step ``version`` into ``p.grad``: fp32 parameters get
        views of the decoded vector, others (fp16, bf16, fp64) a cast copy in a buffer kept
        per parameter; ``op=hvd.Sum`` multiplies it by n. ``on_update`` sees it first."""
        upd = self._pgc_agent.take(self.version)
        self._pgc_last_update = upd
        flat = upd.flat
        if self._pgc_on_update is not None:
            if self._pgc_update_decision:
                self._pgc_on_update(self.version, flat, upd.decision)
            else:
                self._pgc_on_update(self.version, flat)
        if self._pgc_op_scale != 1.0:
            flat.mul_(self._pgc_op_scale)
        bufs = self._pgc_grad_bufs
        for p, v in self._pgc_layout.views(flat):
            if p.dtype != v.dtype:
                buf = bufs.get(id(p))
                if buf is None:
                    buf = bufs[id(p)] = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                buf.copy_(v)
                v = buf
            p.grad = v

    def _pgc_apply_grads(self) -> None:
        """The user's optimizer rule on ``p.grad`` (the decoded update), then ``version += 1``;
        the hyper-parameters it was applied with enter a running digest that :meth:`close`
        compares across ranks."""
        # a GradScaler's grad_scale / found_inf are this optimizer's (the ring was unscaled),
        # not the user's rule's: torch's SGD/Adam would apply them to the decoded update
        amp = {k: self.__dict__.pop(k) for k in ("grad_scale", "found_inf") if k in self.__dict__}
        upd = self._pgc_last_update
        mean_age = upd.decision.info.get("mean_age") if upd is not None else None
        try:
            with compensated(self.param_groups, mean_age, self._pgc_config.momentum_correction):
                super(self.__class__, self).step()
        finally:
            self.__dict__.update(amp)
        for p in self._pgc_layout.params:
            p.grad = None
        self._pgc_synced = False
        self._pgc_hp_digest = _hyper_digest(self.param_groups, self._pgc_hp_digest)
        self.version += 1
        self._pgc_after_update()

    def _pgc_after_update(self) -> None:
        self._pgc_agent.release_before(self.version)
        self._pgc_plan = None
        self._pgc_cancelled = False
        self._pgc_compute_start = time.monotonic()
        self._pgc_check_params()

    def _pgc_apply_decided(self, upto: Optional[int] = None) -> None:
        """Apply every decided update not applied yet (up to ``upto``), without new messages."""
        agent = self._pgc_agent
        while self.version < agent.decided() and (upto is None or self.version < upto):
            self._pgc_load_update()
            self._pgc_apply_grads()
        self._pgc_after_update()

    def _pgc_check_params(self) -> None:
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
        the step of its first non-finite message and the parameters; this rank's agent tells
        the others (``fail``), whose :class:`AgentError` names the rank and that step too
        (:meth:`_pgc_explain`)."""
        log = self._pgc_agent.bad_log
        if len(log) == self._pgc_bad_checked:
            return
        new = log[self._pgc_bad_checked:]
        self._pgc_bad_checked += len(new)
        mine = [k for w, k in new if w == self.rank]
        if not mine:
            return
        bad = [(i, p) for i, p in enumerate(self._pgc_layout.params)
               if not bool(torch.isfinite(p).all())]
        if not bad:
            return
        names = getattr(self, "_pgc_names", {})
        which = ", ".join(
            f"{names.get(id(p), f'#{i}')} ({int((~torch.isfinite(p)).sum())} of {p.numel()})"
            for i, p in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        if not self._pgc_closed:
            self._pgc_fail()
        from pgc_hvd.runtime.consistency import NonFiniteParameters
        raise NonFiniteParameters(
            f"pgc_hvd: rank {self.rank}'s parameters hold NaN/Inf at step {min(mine)} (entries "
            f"non-finite: {which}); its messages from step {min(mine)} on were non-finite and "
            f"left out. The decoded updates are finite and the same on every rank, so something "
            f"outside the optimizer changed this rank's parameters (code that runs on one rank "
            f"only, a hardware fault). Every rank stops: restart from a checkpoint saved when "
            f"the ranks agreed.")

    def _pgc_fail(self) -> None:
        """The training thread raised: tell the other ranks, and wait (at most ``timeout``)
        until this rank's agent has stopped on the control round that shows it, so that the
        others stop with an error naming this rank even when this process exits right after
        (an exiting process shuts Horovod down, which the others would only see as a rank that
        died)."""
        agent = self._pgc_agent
        agent.fail()
        if not self._pgc_started:
            return
        deadline = time.monotonic() + self._pgc_timeout
        with agent.cond:
            while agent.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                agent.cond.wait(min(left, 0.05))

    def _pgc_explain(self, err: AgentError) -> AgentError:
        """``err`` with what this rank knows about its cause: a rank that failed right after
        its messages turned non-finite (:meth:`_pgc_check_params`: its parameters are); the
        same error when there is nothing to add."""
        import re

        m = re.search(r"rank\(s\) \[([\d, ]+)\] failed", str(err))
        if m is None:
            return err
        notes = []
        for w in (int(x) for x in m.group(1).split(",")):
            steps = sorted({k for v, k in self._pgc_agent.bad_log if v == w})
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
        return type(err)(f"{err}; " + "; ".join(notes))

    def start_at(self, version: int) -> None:
        """Before the first step: continue from model version ``version`` with an empty ring
        (every slot is evaluated afresh at its first use, the warm-up rule of
        :attr:`work_plan`), e.g. a world re-formed with another n whose ranks all hold the same
        parameters at that version. Every rank must pass the same version."""
        if self._pgc_started:
            raise RuntimeError("start_at must be called before the first step()")
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        self.version = int(version)
        for b in self._pgc_ring:
            b.zero_()
        self._pgc_worker_ring.reset()
        if self._pgc_residual is not None:
            self._pgc_residual.zero_()
        self._pgc_agent.restart_at(self.version)
        self._pgc_plan = None

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
        thread = self._pgc_agent._thread
        if thread.is_alive():
            thread.join(join_timeout)
        try:
            self._pgc_apply_decided()
        except Exception as err:   # e.g. the non-finite check: keep the version reached
            import logging
            logging.getLogger("pgc_hvd.runtime").warning(
                "pgc_hvd: applying the abandoned world's decided updates stopped: %s", err)
        for h in self._pgc_hooks:
            h.remove()
        self._pgc_hooks = []
        self._pgc_closed = True
        return int(self.version)

    def close(self) -> None:
        """End of training on this rank: serve collectives until every rank is done, apply the
        updates decided after this rank's loop ended, and compare the parameters across ranks.

        Every rank's agent stops at the same control round (the first that shows every rank
        done), so every rank has the same decisions. The ranks then agree on the final version
        V = max_r version_r, the furthest any rank got in its loop
        (:func:`pgc_hvd.runtime.consistency.gather_versions`, one int64 allgather), and each rank
        applies the decided updates it has not applied yet up to V: a rank that left its loop
        early catches up; a step decided after every rank had left (bounded staleness decides
        one from its stale table alone) was applied by no rank and is left out. Every rank ends
        at version V with, the updates being identical, the same parameters (so saving after
        ``close()`` is safe). That is then checked: each rank
        allgathers ``[version, digest]`` (int64; a 63-bit BLAKE2b digest of its parameters'
        bits, one pass over d, :func:`pgc_hvd.runtime.consistency.tensors_digest`), and any
        disagreement raises :class:`AgentError` on every rank naming the ranks that differ from
        the majority."""
        if self._pgc_closed:
            return
        self._pgc_closed = True
        try:
            if not self._pgc_started:
                self._pgc_agent.start()
                self._pgc_started = True
            try:
                self._pgc_agent.finish()
            except AgentError as err:
                better = self._pgc_explain(err)
                if better is err:
                    raise
                raise better from err
            from pgc_hvd.runtime import consistency

            ends = consistency.gather_versions(
                self._pgc_hvd, self.version, name=f"{self._pgc_name}.close.version",
                timeout=self._pgc_timeout, rank=self.rank,
                what="close()'s agreement on the final model version")
            self.loop_end_versions = ends
            target = max(ends)
            if len(set(ends)) > 1:
                import warnings
                warnings.warn(
                    f"pgc_hvd: the ranks' training loops ended at different versions "
                    f"({dict(enumerate(ends))}): close() applies the missing decided updates "
                    f"(up to {target}) without the loop's own per-step code (schedulers, "
                    f"clipping). Give every rank the same number of step() calls (each applies "
                    f"one update), e.g. `for i in range(steps)` or `while opt.version < steps`",
                    RuntimeWarning, stacklevel=2)
            fault = None
            try:
                self._pgc_apply_decided(upto=target)
            except consistency.NonFiniteParameters as err:
                fault = err   # raised after the comparison, which the other ranks wait for
            differ = consistency.compare_digests(
                self._pgc_hvd, self.version, consistency.tensors_digest(self._pgc_layout.params),
                name=f"{self._pgc_name}.close", timeout=self._pgc_timeout, rank=self.rank)
            hyper = consistency.compare_digests(
                self._pgc_hvd, self.version, self._pgc_hp_digest,
                name=f"{self._pgc_name}.close.hyper", timeout=self._pgc_timeout, rank=self.rank)
            if fault is not None:
                raise fault
            if differ is not None and hyper is not None:
                differ += (" The hyper-parameters the updates were applied with (lr, momentum, "
                           "...) also differ across ranks: a learning-rate change that depends "
                           "on rank-local values (ReduceLROnPlateau on the rank's own loss, an "
                           "lr set from wall time) trains a different model on each rank. Drive "
                           "it from values every rank shares: the step count (optimizer.version "
                           "or the loop counter: each step() applies one update) or "
                           "optimizer.metrics (the decided step's mean loss).")
            if differ is not None:
                raise AgentError(differ)
        finally:
            for h in self._pgc_hooks:
                h.remove()
            if self._pgc_records is not None and hasattr(self._pgc_records, "close"):
                self._pgc_records.close()

    @property
    def staleness_bound(self) -> Optional[int]:
        """The bound c of a bounded-staleness scheme (entries used satisfy t - v < c) as the
        decisions currently use it; None for schemes whose c is fixed by their code."""
        c = self.scheme.staleness_bound
        return None if c is None else int(c)

    def set_staleness_bound(self, c: int) -> None:
        """Change the staleness bound c of a bounded-staleness scheme during training.

        Rank 0's value is what counts: it travels in rank 0's control rows and every rank applies
        it at the same control round (:mod:`pgc_hvd.runtime.agent`), so the ranks keep taking
        identical decisions. Call it on every rank with the same value (as
        :class:`pgc_hvd.control.runtime.AdaptiveController` does) or on rank 0 only. ``c`` must
        lie in [1, c_0], c_0 being the bound the optimizer was built with (its buffers and control
        rows are sized for c_0). PGC and the exact codes have no such knob: their c is the code's.
        """
        if self._pgc_c0 is None:
            raise ValueError(f"{self.scheme.name}: its pipeline depth c is fixed by the code; only "
                             f"bounded-staleness has a staleness bound that can change (lower the "
                             f"learning rate instead)")
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= self._pgc_c0:
            raise ValueError(f"staleness bound c must be an integer in [1, {self._pgc_c0}] (the c "
                             f"this optimizer was built with), got {c!r}")
        self._pgc_agent.request_c_bound(int(c))

    @property
    def nonfinite_log(self) -> list:
        """(rank, step) of every message that held NaN/Inf (treated as a straggler)."""
        return list(self._pgc_agent.bad_log)

    @property
    def busy_seconds(self) -> float:
        return self._pgc_busy

    @property
    def agent(self) -> CommAgent:
        return self._pgc_agent

    # -- records -------------------------------------------------------------------
    def _pgc_record_step(self, update, busy_step) -> None:
        if self._pgc_records is None and self._pgc_on_record is None:
            return
        from pgc_hvd.metrics.records import StepRecord
        from pgc_hvd.runtime.telemetry import gpu_stats

        dec = update.decision
        info = dict(dec.info)
        extra = {"control_rounds": update.info.get("control_rounds"),
                 "collective": update.info.get("collective"),
                 "arrived": list(dec.arrived),
                 "nonfinite_ranks": [w for w, k in self._pgc_agent.bad_log if k == dec.step],
                 "gpu": gpu_stats()}
        if self._pgc_c0 is not None:
            extra["c"] = self.staleness_bound  # the bound this decision was taken with
        extra.update(momentum_correction(self.param_groups, info.get("mean_age"),
                                         self._pgc_config.momentum_correction).record())
        rec = StepRecord.from_decision_info(
            dec.step, update.time - self._pgc_t0, info, step_time=update.info.get("step_time"),
            scheme=self.scheme.name, n=self.n, s=self.scheme.s,
            workers_used=[u.worker for u in dec.uses], versions=[u.version for u in dec.uses],
            loss=update.info.get("loss"), bytes=update.info.get("bytes"), busy=busy_step,
            extra=extra)
        if self._pgc_records is not None:
            self._pgc_records.write(rec)
        if self._pgc_on_record is not None:
            self._pgc_on_record(rec)

    # -- state_dict (the torch / Horovod way of saving and resuming) -----------------------
    def state_dict(self) -> dict:
        """torch's optimizer state plus what a resume needs: ``param_groups[0]["pgc_version"]``
        (the model version; a scalar option, so ``hvd.broadcast_optimizer_state`` carries rank
        0's to every rank) and ``"pgc"``: this rank's :meth:`pgc_state_dict` without the torch
        part (scheme, n, s, rank, ring, slot versions, error-feedback residual, RNG states).
        Tensors are referenced, not copied, as torch's own state_dict does."""
        sd = super(self.__class__, self).state_dict()
        sd["param_groups"][0][_VERSION_KEY] = self.version
        sd["pgc"] = self._pgc_extra_state(copy=False)
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a :meth:`state_dict` (or a plain torch optimizer state dict), before the first
        step. With this rank's own ``"pgc"`` part (same scheme, n, s and rank) everything is
        restored, ring included; a state saved by another rank of the same run (rank 0's file
        loaded on every rank) restores the torch state and the version, with an empty ring that
        the first steps refill; a state of another world size or scheme is refused with
        :class:`~pgc_hvd.runtime.checkpoint.CheckpointError`."""
        from pgc_hvd.runtime.checkpoint import CheckpointError, check_same_run

        sd = dict(state_dict)
        groups = [dict(g) for g in sd.get("param_groups", [])]
        version = groups[0].pop(_VERSION_KEY, None) if groups else None
        sd["param_groups"] = groups
        extra = sd.pop("pgc", None)
        if (extra is not None or version is not None) and self._pgc_started:
            raise RuntimeError("pgc_hvd: load_state_dict() of a pgc_hvd state must come before "
                               "the first step()")
        if extra is not None:
            if not isinstance(extra, dict):
                raise CheckpointError(f"the state dict's 'pgc' entry is {type(extra).__name__}, "
                                      f"not the dict state_dict() writes")
            check_same_run(extra, {"scheme": self.scheme.name, "n": self.n, "s": self.scheme.s},
                           "the optimizer state", keys=("scheme", "n", "s"))
        if extra is not None and extra.get("rank") == self.rank:
            self.load_pgc_state_dict({"optimizer": sd, **extra}, "the state dict")
            return
        self._pgc_torch_load(sd)
        if extra is not None and version is None:
            version = extra.get("version")
        if version is not None:
            self.start_at(int(round(float(version))))

    def _pgc_torch_load(self, sd: dict) -> None:
        """torch's load_state_dict, keeping the param-group dicts the user's optimizer shares
        with this one (torch replaces them; a scheduler built before the wrap holds them)."""
        shared = self.param_groups
        super(self.__class__, self).load_state_dict(sd)
        for mine, loaded in zip(shared, self.param_groups):
            params = mine["params"]
            mine.clear()
            mine.update(loaded)
            mine["params"] = params
        self.param_groups = shared

    def _pgc_extra_state(self, copy: bool = True) -> dict:
        keep = (lambda b: b.clone()) if copy else (lambda b: b)
        return {
            "version": self.version,
            "scheme": self.scheme.name, "n": self.n, "s": self.scheme.s, "rank": self.rank,
            "ring": [keep(b) for b in self._pgc_ring],
            "slot_versions": list(self._pgc_worker_ring.versions),
            "residual": None if self._pgc_residual is None else keep(self._pgc_residual),
            "busy": self._pgc_busy,
            "c_bound": self.staleness_bound,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "trace_position": {"worker": self.rank, "step": self.version},
        }

    # -- checkpoint ----------------------------------------------------------------
    def pgc_state_dict(self) -> dict:
        """Optimizer state, ring buffers, step, RNG states and delay-trace position."""
        return {"optimizer": super(self.__class__, self).state_dict(), **self._pgc_extra_state()}

    def load_pgc_state_dict(self, state: dict, source: str = "the state dict") -> None:
        """Restore a :meth:`pgc_state_dict` of this rank, before the first step. The whole state
        is checked first (:func:`pgc_hvd.runtime.checkpoint.check_pgc_state`: keys, scheme, n,
        s, rank, buffer shapes, parameter groups); a refused one raises
        :class:`~pgc_hvd.runtime.checkpoint.CheckpointError` (naming ``source``) and changes
        nothing. This rank only: :func:`~pgc_hvd.runtime.load_checkpoint` also makes the ranks
        agree on the step."""
        if self._pgc_started:
            raise RuntimeError("load_pgc_state_dict must be called before the first step()")
        from pgc_hvd.runtime.checkpoint import check_pgc_state
        check_pgc_state(state, self.pgc_state_dict(), source)
        self._pgc_torch_load(state["optimizer"])
        self.version = int(state["version"])
        for b, saved in zip(self._pgc_ring, state["ring"]):
            b.copy_(saved)
        self._pgc_worker_ring.restore(state["slot_versions"])
        if state.get("residual") is not None and self._pgc_residual is not None:
            self._pgc_residual.copy_(state["residual"])
        self._pgc_busy = float(state.get("busy", 0.0))
        if state.get("c_bound") is not None and self._pgc_c0 is not None:
            # every rank restores its own value; rank 0's request makes them agree at once
            self.scheme.staleness_bound = int(state["c_bound"])
            self._pgc_agent.request_c_bound(int(state["c_bound"]))
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        agent = self._pgc_agent
        agent.restart_at(self.version)
        self._pgc_plan = None


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         scheme: str = "pgc-cr", stragglers: Optional[int] = None,
                         compression: Any = None,
                         *, backward_passes_per_step: int = 1, op=None,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False, process_set=None,
                         delays=None, records=None, scheme_options: Optional[dict] = None,
                         timeout: float = 60.0, poll_interval: float = 0.002, on_record=None,
                         on_update=None, replay_arrivals=None, straggler_policy: str = "continue",
                         optimistic: Optional[bool] = None, control: str = "allgather",
                         name: str = "pgc", metrics=(), momentum_correction: bool = True,
                         hvd=None):
    """Wrap ``optimizer`` so that each step uses the messages of the n-s fastest ranks.

    Args:
        optimizer: the user's torch optimizer (its class and hyper-parameters are kept).
        named_parameters: ``model.named_parameters()`` (checked to cover the optimizer's).
        scheme: any name of :func:`pgc_hvd.schemes.get_scheme` (``dgd``, ``pgc-cr``, ``bcgc``,
            ``gc-cr``, ``bounded-staleness``, ...); n = ``hvd.size()``.
        stragglers: the straggler budget s; default (None): 0 for ``dgd`` (it waits for every
            rank), 1 for every other scheme.
        compression: None (dense messages) or :class:`TopK` (sparse top-kappa, error feedback);
            Horovod's ``hvd.Compression.none`` (dense) and ``hvd.Compression.fp16`` (dense
            messages travel as float16: half the bytes) are accepted.
        backward_passes_per_step: as Horovod's: the gradients of up to this many backward
            passes per partition accumulate in ``p.grad`` before ``step()``; more raise.
        op: ``hvd.Average`` (default: the decoded update is the average gradient, as Horovod's)
            or ``hvd.Sum`` (n times it); ``hvd.Adasum`` is refused (its pairwise projections
            need every rank's gradient, which gradient coding does not wait for).
        gradient_predivide_factor: accepted (> 0, with ``op=hvd.Average``, as Horovod requires);
            it only splits Horovod's averaging into a pre- and post-division for fp16
            range; pgc_hvd decodes in fp32 with the code's coefficients, so it changes nothing.
        num_groups, groups, sparse_as_dense, process_set: Horovod's allreduce fusion and
            sparse options; accepted for compatibility (one flat coded message per step; sparse
            gradients are densified into the ring). A ``process_set`` other than the global one
            is refused.
        delays: straggler injection, any object with ``sample(worker, step) -> seconds`` (the
            simulator's delay models and traces, :mod:`pgc_hvd.delays`) or a spec string in
            the simulator's ``--delay`` syntax (``"exp:mean=0.1,seed=1"``); slept on the
            compute side of this rank.
        records: a :class:`~pgc_hvd.metrics.records.RecordWriter` (rank 0 writes one StepRecord
            per step) or None; ``on_record`` is called with each record on rank 0.
        scheme_options: extra options for the scheme (e.g. ``{"decoder": "first-complete"}``;
            ``"min-error"`` with ``compression``: every rank sends ||C(u) - u|| in its control
            row, and the step takes the complete class of least total error, BCGC Sec. VI-B).
        timeout: seconds after which a collective or a step with no answer raises
            :class:`~pgc_hvd.runtime.agent.AgentError` (a rank died or hung).
        poll_interval: seconds between control rounds while waiting.
        on_update: ``on_update(step, flat_update)`` is called on the training thread with every
            decoded update (the flat vector handed to the user's optimizer) before it is applied;
            its buffer is recycled after the step, so clone it to keep it.
            A callable that takes three positional arguments is called as
            ``on_update(step, flat_update, decision)`` with the step's
            :class:`~pgc_hvd.schemes.protocol.Decision` (messages used, their versions,
            ``decision.info["max_age"]`` counting ring slots); decided once from its signature.
        replay_arrivals: ``[(worker, step), ...]`` in arrival order, e.g. a simulator's
            ``arrival_log``: the ranks' messages are offered to the scheme in exactly that order
            (while it lasts), and each rank computes exactly the steps it computes there, so the
            run takes the simulated run's decisions whatever the real timing (twin tests,
            reproducing a schedule). Every rank must pass the same list.
        straggler_policy: what a rank does when the step it is computing fires without it
            (the simulator's option of the same name). ``"continue"`` (default): it finishes
            the step and sends its late message (dropped by exact and pipelined schemes, used by
            bounded staleness). ``"cancel"`` (exact and pipelined schemes): it abandons the rest
            of the step at the next point the runtime controls -- before its next partition, or
            during the injected ``delays`` -- keeps the ring slots it has evaluated (PGC paper:
            every worker stores its own gradients whether it straggles or not), sends nothing
            and starts the newest model; the model of the paper's analysis, where every worker
            starts every step and s(t, i) >= t - c + 1. It cannot interrupt a forward/backward
            pass in progress.
        optimistic: one-collective steps: a rank's payload travels in the same allgather as
            the control row that first shows it ready, so a step that fires on that control
            round needs no second collective (every rank then receives every current-step
            payload, also the ones the decision leaves out: n payloads). Default (None): on for
            CPU payload rows while n of them are at most
            ``pgc_hvd.compress.transport.OPTIMISTIC_BYTES`` (4 MiB, measured;
            ``PGC_HVD_OPTIMISTIC_BYTES``), where latency dominates; off above it, where the
            step is decided on control rows alone and dense messages move in ONE allreduce of
            the ranks' weighted contributions (2 (n-1)/n * 4d bytes per rank, as Horovod's),
            sparse ones in an allgather of the chosen rows (:mod:`pgc_hvd.compress.transport`).
        metrics: names of small user metrics (e.g. ``["accuracy"]``) that ``step(metrics=
            {"accuracy": a})`` sends in the control row; :attr:`metrics` gives every rank the
            decided step's means (and the loss's) with no extra collective.
        momentum_correction: True (default): each update is applied with the optimizer's
            momentum less the momentum its stale gradients already add (mu_imp = a/(1+a) for the
            update's mean gradient age a; beta' = max(0, beta - mu_imp), SGD's lr scaled by
            (1-beta')/(1-beta) so lr/(1-beta) is kept; Adam's beta1 likewise), the user's values
            restored after the step; a no-op for fresh updates (DGD, GC, IS-SGD, BCGC). Records
            carry ``implicit_momentum`` and ``effective_momentum``. False applies the
            optimizer's own momentum to stale updates (:mod:`pgc_hvd.control.momentum`).
        control: how the ranks exchange control rows each round. ``"allgather"`` (default): a
            Horovod allgather (payloads may ride along, ``optimistic``). ``"store"``: a
            ``torch.distributed.TCPStore`` served by rank 0 (:mod:`pgc_hvd.runtime.control_store`;
            a round costs 0.3-0.6 ms instead of 1.3-7.7 ms here, payloads then move in one data
            allgather per step; rank 0's address from ``PGC_HVD_STORE_ADDR`` or its host name).

    Every argument is checked (type and range) before any collective; a bad one raises
    TypeError or ValueError naming it.
    """
    if hvd is None:
        import horovod.torch as hvd
    compression, wire_dtype = _horovod_compression(compression)
    op_scale = _horovod_op(hvd, op, gradient_predivide_factor)
    _horovod_fusion_options(hvd, backward_passes_per_step, num_groups, groups, sparse_as_dense,
                            process_set)
    if stragglers is None:
        stragglers = 0 if str(scheme).lower() == "dgd" else 1
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_PGCOptimizer.__dict__))
    config = RuntimeConfig(
        scheme=scheme, stragglers=stragglers, compression=compression, delays=delays,
        records=records, scheme_options=scheme_options, timeout=timeout,
        poll_interval=poll_interval, name=name, on_record=on_record, on_update=on_update,
        replay_arrivals=replay_arrivals, straggler_policy=straggler_policy, optimistic=optimistic,
        control=control, backward_passes_per_step=backward_passes_per_step, op_scale=op_scale,
        wire_dtype=wire_dtype, metrics=_metric_names(metrics),
        momentum_correction=momentum_correction)
    return cls(optimizer, named_parameters, config, hvd)


def _metric_names(metrics) -> tuple:
    if isinstance(metrics, str) or not all(isinstance(m, str) and m for m in metrics):
        raise TypeError(f"metrics must be a list of metric names (str), e.g. ['accuracy'], got "
                        f"{metrics!r}")
    if len(set(metrics)) != len(tuple(metrics)) or {"step", "loss", "ranks"} & set(metrics):
        raise ValueError(f"metrics {list(metrics)}: names must be distinct and not 'step', "
                         f"'loss' or 'ranks'")
    return tuple(metrics)


def _horovod_compression(compression):
    """``(compression, wire dtype name)``: Horovod's ``hvd.Compression.none`` -> dense fp32,
    ``hvd.Compression.fp16`` -> dense messages with a float16 wire format
    (:func:`pgc_hvd.compress.from_horovod`); pgc_hvd's :class:`TopK` as it is (fp32 values);
    anything else is refused naming what works."""
    if compression is None or isinstance(compression, TopK):
        return compression, None
    from pgc_hvd.compress import from_horovod
    wire = from_horovod(compression)
    return None, (None if wire == torch.float32 else str(wire).replace("torch.", ""))


def _horovod_op(hvd, op, predivide) -> float:
    """The factor applied to the decoded (average) update for Horovod's ``op``."""
    if isinstance(predivide, bool) or not isinstance(predivide, (int, float)) or \
            not math.isfinite(predivide) or predivide <= 0:
        raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got "
                         f"{predivide!r}")
    names = {getattr(hvd, k, object()): k for k in ("Average", "Sum", "Adasum")}
    name = "Average" if op is None else names.get(op)
    if name is None:
        raise ValueError(f"op must be hvd.Average or hvd.Sum, got {op!r}")
    if predivide != 1.0 and name != "Average":
        raise ValueError("gradient_predivide_factor != 1.0 needs op=hvd.Average (as in Horovod)")
    if name == "Adasum":
        raise ValueError(
            "op=hvd.Adasum is refused: Adasum combines every rank's gradient by pairwise "
            "projections, while gradient coding decodes the average from the n - s fastest "
            "ranks' coded messages and never has every gradient. Use op=hvd.Average (default)")
    return float(hvd.size()) if name == "Sum" else 1.0


def _horovod_fusion_options(hvd, passes, num_groups, groups, sparse_as_dense, process_set):
    """Type checks of Horovod's fusion and sparse keywords (accepted, see DistributedOptimizer)."""
    if isinstance(passes, bool) or not is_count(passes):
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    if groups is not None and not isinstance(groups, (int, list, tuple)):
        raise ValueError(f"groups must be None, an int or a list of parameter lists, got "
                         f"{groups!r}")
    if not isinstance(sparse_as_dense, bool):
        raise ValueError(f"sparse_as_dense must be a bool, got {sparse_as_dense!r}")
    if process_set is not None and process_set is not getattr(hvd, "global_process_set", None):
        raise ValueError("process_set: pgc_hvd runs the scheme over every rank "
                         "(n = hvd.size()); a process set other than the global one is "
                         "refused -- run one optimizer per job")
