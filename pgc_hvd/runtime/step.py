"""One step of this rank, on the training thread: its plan, its message and its update.

The facade (:mod:`pgc_hvd.runtime.optimizer`) drives it (docs/architecture.md, "The runtime's
parts"); the step's faults are :mod:`pgc_hvd.runtime.faults`', the partition being evaluated
(gradient capture into the ring slots, the forward pass's randomness)
:mod:`pgc_hvd.runtime.capture`'s, the replicas' first-step checks :mod:`pgc_hvd.runtime.replicas`':

* :class:`Step`: the model version t (the number of decided updates applied), the step's plan
  (which partitions this rank evaluates at t, whether it computes at t -- a rank whose step was
  decided without it catches up -- and whether the step was overtaken under
  ``straggler_policy="cancel"``), the compute clock (busy seconds, sent in the control rows),
  the path of the message (end the partition still in ``p.grad``, refuse slots that got no
  gradient, unscale under AMP, form it -- :class:`~pgc_hvd.compress.encoder.MessageEncoder`,
  straight into the payload row when rows are dense --, inject the configured delay, check it
  is finite, encode it, hand it to the agent) and the update (the decided update into
  ``p.grad`` in each parameter's dtype: ``on_update``, Horovod's ``op`` factor, the user's rule
  with the momentum correction around it, the hyper-parameter digest compared at ``close()``).

The plan is formed by :meth:`Step.begin`, never by a getter (:meth:`Step.peek_plan`).

Owns :class:`Step` and the hyper-parameter digest (:func:`hyper_digest`).
Thread: the training thread (:meth:`Step.current` and :meth:`Step.open_stream` from the
capture's hooks too, inside its ``backward()``).
May import: ``compress.codecs`` (``all_finite``), ``control.momentum``, ``runtime.agent``
(``Outgoing``), ``runtime.capture`` (``GradientCapture``, ``loop_plan``),
``runtime.communicator`` (``Stream``: the overlap's handoff), ``runtime.config``
(``takes_three``), ``runtime.errors``, ``runtime.interop`` and torch.
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Optional

import torch

from pgc_hvd.compress.codecs import all_finite
from pgc_hvd.control.momentum import compensated
from pgc_hvd.runtime import interop
from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.capture import GradientCapture, loop_plan
from pgc_hvd.runtime.config import takes_three
from pgc_hvd.runtime.communicator import Stream
from pgc_hvd.runtime.errors import AgentError


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


_TERMS: dict = {}   # hyper_digest's terms by the groups' values: a lookup while they stay


def hyper_digest(param_groups, prev: int) -> int:
    """A running CRC32 over every scalar hyper-parameter of every param group (lr, momentum,
    betas, weight decay, ...), one term per applied update: equal on every rank iff every
    update was applied with the same hyper-parameters everywhere."""
    try:   # values and their types (1, 1.0 and True: equal keys, distinct terms)
        key = tuple(tuple((k, type(v), v) for k, v in g.items() if k != "params")
                    for g in param_groups)
        term = _TERMS.get(key)
    except TypeError:      # a value that cannot be a key (a tensor, a list): no cache
        key = term = None
    if term is None:
        term = _hyper_term(param_groups)
        if key is not None:
            if len(_TERMS) >= 256:
                _TERMS.clear()
            _TERMS[key] = term
    return zlib.crc32(term, prev)


def _hyper_term(param_groups) -> bytes:
    parts = []
    for g in param_groups:
        for k in sorted(g):
            v = g[k]
            if k == "params" or torch.is_tensor(v):   # a one-element tensor: its float
                v = float(v) if torch.is_tensor(v) and v.numel() == 1 else ...
            if isinstance(v, (bool, int, float, str, tuple, type(None))):
                parts.append(f"{k}={v!r}")
    return ";".join(parts).encode()


class Step:
    """This rank's current step: version, plan, clock, message and update (module doc).

    ``capture`` (a :class:`GradientCapture`), ``encoder`` (a
    :class:`~pgc_hvd.compress.encoder.MessageEncoder`) and ``agent`` (a
    :class:`~pgc_hvd.runtime.agent.CommAgent`, or any object with its training-thread members)
    are used through their public members; ``param_groups`` are the optimizer's (a version
    ``hvd.broadcast_optimizer_state`` wrote there is adopted at the first use,
    :meth:`adopt`)."""

    def __init__(self, capture: GradientCapture, encoder, agent, scheme, rank: int, *,
                 param_groups, delay=None, cancel: bool = False, replay_steps=(),
                 op_scale: float = 1.0, on_update=None):
        self.capture, self.encoder, self.agent, self.scheme = capture, encoder, agent, scheme
        self.worker_ring, self.layout = capture.worker_ring, capture.layout
        self.rank = int(rank)
        self.param_groups = param_groups
        self.delay, self.cancel = delay, bool(cancel)
        self.replay_steps = set(replay_steps)
        self.replay_end = max(self.replay_steps) if self.replay_steps else -1
        self.op_scale = float(op_scale)
        self.on_update = on_update
        # on_update(step, flat) (original form) or on_update(step, flat, decision): decided once
        self._with_decision = on_update is not None and takes_three(on_update)
        #: the model version t: decided updates applied (= the step computed next)
        self.version = 0
        #: the first step has begun (the agent runs): written by :meth:`start` only
        self.started = False
        self.plan = None              # the current step's WorkPlan (None: not begun)
        self.computes = True          # this rank sends a message at the current step
        self.cancelled = False        # the current step fired without this rank (cancel)
        #: seconds this rank has computed (forward, backward, forming messages), all steps
        self.busy = 0.0
        self._since: Optional[float] = None   # start of the current step's compute
        self._bufs: dict = {}          # param id -> update buffer in the parameter's dtype
        #: (data_ptr, numel) of an update's vector -> its per-parameter views (a kept view keeps
        #: its buffer's memory, so an address seen again is the same buffer); at most 4
        self._views: dict = {}
        #: running digest of the hyper-parameters of every applied update (:func:`hyper_digest`)
        self.hyper_digest = 0
        #: the last update loaded (its decision and info), None before the first
        self.last = None
        #: seconds the last :meth:`exchange` waited for its step's decision
        self.wait_seconds = 0.0
        #: the decoder reads each message's compression error (read once: a property of the
        #: scheme's checks, off the step's path)
        self.error_norms = bool(scheme.needs_error_norms)
        capture.current = self.current
        # the overlap (module pgc_hvd.runtime.overlap): None until the first send() has shown
        # the loop's habits (True: later steps may stream), the streamed message's buffer, the
        # step's Outgoing while it streams, and the loss and metrics the last streamed step()
        # got (they ride with this rank's next message: a streamed message leaves before them)
        self.may_stream: Optional[bool] = None
        self._stream_buf: Optional[torch.Tensor] = None
        self._streamed: Optional[Outgoing] = None
        self._bucket_done = None
        self._lagged: tuple = (math.nan, ())
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

    def begin_loop(self) -> bool:
        """A training forward of the user's loop (the DDP door) begins the step (:meth:`begin`);
        returns whether this rank computes at it (False: the step was decided without it; the
        loop's gradient is dropped and ``step()`` applies the decided update; under a
        GradScaler p.grad then holds zeros for its inf check)."""
        self.begin()
        if not self.computes and self.capture.amp:
            self.capture.zero_grads()
        return self.computes

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
        first ``send()`` showed no habit that needs the whole message at ``step()`` (a
        GradScaler's scale, ``p.grad`` changed after the backward) and the step is not
        overtaken. Then the message is submitted now, its buckets to come (the configured
        delay, a straggler's, is slept first), with the loss and metrics of this rank's
        previous streamed step, and the bucket callback is returned; else None."""
        plan, t, cap = self.plan, self.version, self.capture
        if (not self.may_stream or not self.computes or self.overtaken()
                or cap.passes_per_step != 1
                or (len(plan.evaluate) != 1 and not cap.loop_fed)):
            return None
        self._delay(t)
        if self._stream_buf is None:
            self._stream_buf = self.layout.zeros()
        buf = self._stream_buf
        for sl in cap.evaluated(plan, slot):
            self.worker_ring.fill(sl, t)     # its gradient is on the way
        (loss, metrics), self._lagged = self._lagged, (math.nan, ())
        out = Outgoing(t, t, buf, time.time(), loss, self.worker_ring.message_versions(plan),
                       metrics=metrics, stream=Stream(len(cap.buckets.ranges)))
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

    def _end_stream(self, loss, metrics: tuple, grad_scale) -> None:
        """``send()`` of a streamed step: the buckets no gradient completed are formed now;
        the loss and metrics wait for the next message. A change to ``p.grad`` after the
        backward (clipping, ``unscale_``) or a loss scale came after the message left: refused
        with the fix (the first ``step()`` shows whether the loop does these)."""
        cap, t = self.capture, self.version
        late = ("p.grad was changed after loss.backward() (clip_grad_norm_, "
                "GradScaler.unscale_, ...)" if cap.touched() else
                "a GradScaler's scale reached optimizer.step()" if grad_scale is not None
                else None)
        if late:
            raise RuntimeError(
                f"pgc_hvd: at step {t} {late}, but this rank's message had left during the "
                f"backward (the overlap: the first step() showed neither, so later steps "
                f"stream). Clip the decoded update instead: optimizer.synchronize(); "
                f"clip_grad_norm_(...); with optimizer.skip_synchronize(): optimizer.step(); "
                f"or build the optimizer with overlap=False (the message is then formed at "
                f"step())")
        for k in cap.end_stream(self.plan, t):
            self._bucket_done(k)
        out, self._streamed, self._bucket_done = self._streamed, None, None
        self._lagged = (math.nan if loss is None else float(loss), tuple(metrics))
        self.stop_clock()
        if not all_finite(out.payload):
            # it left before this check: a decision that used it applies nothing (the sum
            # shows it on every rank); reported as the checked path does, and this rank's
            # later messages are checked before they leave
            self.may_stream = False
            self.agent.report_bad(t, self.busy)

    def send(self, *, loss=None, metrics: tuple = (), grad_scale=None) -> None:
        """Form, check, encode and submit the message of the current (begun) step (module
        doc); nothing is sent once the step fired without this rank (:meth:`overtaken`). A
        streamed step's message went at its first gradient (:meth:`open_stream`); here its
        last buckets are formed."""
        plan = self.plan
        cap, enc, agent, t = self.capture, self.encoder, self.agent, self.version
        if self._streamed is not None:
            return self._end_stream(loss, metrics, grad_scale)
        self._lagged = (math.nan, ())
        if self.may_stream is None and cap.buckets is not None:   # the first send: habits
            self.may_stream = (grad_scale is None and not cap.amp
                               and not (cap.target_slot is not None and cap.touched()))
        packed = payload = msg = None
        if cap.target_slot is not None:   # the last partition's gradient is in p.grad
            cap.check_untouched(plan, t, grad_scale)
            if cap.gradient_is_message and enc.dense_rows:   # moved straight into the row:
                packed, payload = agent.payload_buffer()   # no copy, no zeroed message
            cap.end_pending(plan, t, out=payload)
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
                msg = cap.message
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
        error_norm = enc.encode(msg, payload, error_norm=self.error_norms)
        agent.submit(Outgoing(t, t, payload, time.time(), math.nan if loss is None else float(loss),
                              self.worker_ring.message_versions(plan), packed=packed,
                              error_norm=error_norm, metrics=metrics), self.busy)

    def skip(self) -> None:
        """A rank that catches up computes nothing at this step: a gradient its loop computed
        anyway is dropped and the clock stops."""
        self.capture.discard()
        self.stop_clock()

    # -- the step's round with the agent (the one part of the training thread that talks to it
    # in a step: send, wait, take)
    def exchange(self, *, loss=None, metrics: tuple = (), grad_scale=None) -> bool:
        """This rank's part of the current (begun) step: its message sent (:meth:`send`), or
        nothing when it catches up (:meth:`skip`); then wait until the step is decided.
        Returns whether this rank computed at it; :attr:`wait_seconds` says how long it waited."""
        computed = self.computes
        if computed:
            self.send(loss=loss, metrics=metrics, grad_scale=grad_scale)
        else:
            self.skip()
        t_wait = time.perf_counter()
        self.agent.wait_for(self.version)
        self.wait_seconds = time.perf_counter() - t_wait
        return computed

    def load_decided(self) -> None:
        """The decided update of step :attr:`version` into ``p.grad`` (:meth:`load`)."""
        self.load(self.agent.take(self.version))

    @property
    def behind(self) -> bool:
        """Whether a step at or after :attr:`version` is already decided (an update this rank
        has not applied yet)."""
        return self.version < self.agent.decided()

    def _delay(self, t: int) -> None:
        delay = 0.0 if self.delay is None else float(self.delay.sample(self.rank, t))
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
        if update.info.get("nonfinite_sum"):   # a streamed message held NaN/Inf: no update
            for p in self.layout.params:
                p.grad = None
            return
        if self.on_update is not None:
            if self._with_decision:
                self.on_update(self.version, flat, update.decision)
            else:
                self.on_update(self.version, flat)
        if self.op_scale != 1.0:
            flat.mul_(self.op_scale)
        bufs, key = self._bufs, (flat.data_ptr(), flat.numel())
        views = self._views.get(key)     # the pool's buffers recur: their views are kept
        if views is None:
            if len(self._views) >= 4:
                self._views.clear()
            views = self._views[key] = list(self.layout.views(flat))
        for p, v in views:
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

    def start(self) -> None:
        """Start the agent thread (the first step, a re-plan, or a close before any step)."""
        self.agent.start()
        self.started = True

    def applied(self) -> None:
        """An update was applied with the current hyper-parameters: clear p.grad, extend the
        digest, ``version += 1``; the agent frees what the steps before it held, the next step
        begins at its first use."""
        for p in self.layout.params:
            p.grad = None
        self.hyper_digest = hyper_digest(self.param_groups, self.hyper_digest)
        self.capture.update_applied()
        self.version += 1
        self.after_update()

    def after_update(self) -> None:
        self.agent.release_before(self.version)
        self.next()
        self.clock(restart=True)
