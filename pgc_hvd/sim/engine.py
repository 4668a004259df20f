"""The event-driven virtual cluster: n workers and one decoder, real gradients, virtual time.

Model of one run (all times virtual seconds):

* The decoder holds the model beta_t, the optimizer and the scheme. Step t's round is open
  while version t is the newest model. After the round fires at time T, the decoder decodes
  g_hat = sum_m a_m m_m (the scheme's ``Decision.combine`` for complex weights, else
  :func:`pgc_hvd.compress.codecs.decode_real`, the runtime's kernel), applies the optimizer (version t+1) and broadcasts
  beta_{t+1}; every worker receives it at T + decode_time + alpha + model_bytes / b.
* A worker that receives version v while idle starts step v at once: it evaluates the
  partitions of ``scheme.work_plan(worker, v)`` at beta_v (real gradients), which takes
  ``len(plan.evaluate) * partition_time + delay.sample(worker, v)`` seconds, writes them into
  its ring, forms its coded message from the ring and compresses it (top-kappa, optionally with
  error feedback) with the runtime's :class:`~pgc_hvd.compress.encoder.MessageEncoder`
  (:mod:`.workers`) and sends it: it reaches the decoder alpha + bytes / b later. ``straggler_policy="continue"`` (default, as the Horovod
  runtime): a worker busy when a new version arrives finishes its step, sends its (late)
  message, then starts the newest version it holds; skipped steps leave older evaluations in its
  ring. ``"cancel"``: the worker abandons its unfinished step and starts the new one (the
  classic model where every step's delays are independent).
* Arrivals are offered to the open round in arrival order (late ones too: bounded staleness
  refreshes its table with them); after each update the next round is polled, so a scheme may
  fire from its table alone.

Every update writes one :class:`~pgc_hvd.metrics.records.StepRecord` (virtual time, workers
used, versions, ages, decode weight extremes, loss/accuracy when evaluated, bytes moved,
per-worker busy seconds) with the staleness diagnostics and error decomposition in ``extra``
(see :mod:`pgc_hvd.metrics.diagnostics`).

Collective model (``SimConfig.comm`` a :class:`~pgc_hvd.sim.comm.CollectiveModel`): no decoder,
no master; the step follows the Horovod runtime's protocol (:mod:`pgc_hvd.runtime.agent`,
modelled by :class:`~pgc_hvd.sim.agents.AgentModel`) with every collective costed by the
alpha-beta model:

* A worker's step takes ``k * apply + len(plan.evaluate) * partition_time + delay + form``:
  ``apply`` (the k updates it applies first: SGD reads the parameters and the update and writes
  the parameters, 12 d bytes each) and ``form`` (coded accumulation of its L ring slots,
  (L+1) 4d bytes, the finiteness check, 5 d, and the copy into the send buffer, 8 d) cost
  ``pass_beta`` seconds per byte. The message then sits in the rank's outbox.
* Control rounds: every rank's agent submits one control row (8 (11 + h) bytes, h =
  ``scheme.lookback`` slot versions: the oldest message it has not announced yet, one per round) to an allgather; the round starts when the
  last rank has submitted and costs ``allgather(n, row sizes)``. After a round that does not
  fire, an agent waits ``poll_interval`` (``poll_interval / 4`` once a message of the open round
  is known) before submitting again, except that a message becoming ready ends its rank's wait
  at once (and a rank that got one during a collective skips its next wait), so a round starts
  at the others' deadline, or when every rank has submitted. The rows are offered to the open
  round in (ready time, rank) order, as the agent does; after a decision the offers stop (the
  rest are shown again in the next round). With ``CollectiveModel.control`` ``"log"`` or
  ``"log-bcast"`` there are no rounds: :class:`~pgc_hvd.sim.log_agents.LogAgentModel` (rows
  appended to rank 0's store, one decider taking them in log order, its outcome delivered to
  every rank; costs in :mod:`pgc_hvd.sim.log_costs`); there a scheme that waits for every rank
  (dgd, s = 0) takes the runtime's s = 0 path, no control round at all
  (:class:`~pgc_hvd.sim.log_agents.SumRowsAgentModel`: the rows ride in the data allreduce).
* Data plane (``CollectiveModel.plane``, see :mod:`pgc_hvd.sim.comm`): ``allgather``: payloads
  ride with the first row that shows them ready (rows of n-s..n ranks carry 4d bytes each), a
  step that fires needs no more; ``allgather-2phase``: after the decision, an allgather of the
  chosen ranks' messages; ``allreduce``: after the decision one ring allreduce of 4d bytes
  (dense) or, for top-kappa messages, the allgather of the chosen (values, indices) when it
  receives fewer bytes than the allreduce (else densify + allreduce); small messages (n copies
  at most ``optimistic_below`` bytes) ride with the rows as on ``allgather``. Decoding reads the used
  messages and writes d floats (``pass_beta``); the allreduce plane's contribution reads the
  rank's own uses and writes d floats.
* The update is every rank's at the end of the data phase: the step's record has that time, and
  the next control round starts at once (no wait, as the agent's loop). Rounds in which nothing
  can happen (no message pending anywhere) are skipped arithmetically, not simulated one by
  one. ``record.bytes`` is the bytes received by the rank receiving most, over the step's
  collectives; ``extra["control_rounds"]`` counts the step's control rounds.

The engine's parts: this module (the config, the event loop, decoding and applying an update,
the auto re-plan), :mod:`.workers` (a worker's ring and message; when a worker starts and
finishes a step: :class:`~.workers.WorkerSteps`, the base class of :class:`Simulator`),
:mod:`.agents` (the runtime's agents under the collective model), :mod:`.step_records` (busy
seconds, diagnostics), :mod:`.progress` (the bar, when the run stops).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time as _time
from typing import Any, Callable, Optional

import numpy as np
import torch

from pgc_hvd.compress.codecs import decode_real, dense_payload
from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.compress.topk import TopK, parse_compression
from pgc_hvd.control.momentum import applies_to, compensated
from pgc_hvd.control.progress_model import POLICIES
from pgc_hvd.delays import DelayModel, as_delay_model, check_trace_covers, check_workers
from pgc_hvd.metrics.records import StepRecord
from pgc_hvd.options import is_count
from pgc_hvd.schemes import Ring, Scheme

from .agents import AgentModel
from .log_agents import LogAgentModel, SumRowsAgentModel
from .comm import CollectiveModel, CommModel, parse_comm_model
from .gradients import PartitionGradients
from .progress import Progress, stops
from .step_records import busy_seconds, diagnostics
from .workers import Worker, WorkerSteps


@dataclasses.dataclass
class SimConfig:
    """Engine settings (see module docstring). ``compression``: the runtime's compression
    object, :class:`pgc_hvd.compress.TopK` (or its spec, ``"topk:0.05,ef=0"``,
    :func:`pgc_hvd.compress.parse_compression`), None for dense messages; kappa is
    :meth:`TopK.kappa`, the runtime's rule, and error feedback ``TopK.error_feedback``.

    ``compress`` / ``error_feedback``: the older spelling, kept for callers that pass a bare
    ratio: ``compress=r`` is ``compression=TopK(r, error_feedback=error_feedback is not
    False)`` (error feedback on when None, as ``TopK``'s default; the papers' experiments pass
    False: they compress coded messages without memory). Converted here, once; the engine
    reads only :attr:`compression`."""

    steps: int = 100
    delay: Any = None                   # DelayModel | text spec | dict | None
    partition_time: Optional[float] = None  # seconds per partition gradient; None = measured
    comm: Any = dataclasses.field(default_factory=CommModel)  # CommModel | CollectiveModel | spec
    broadcast: bool = True              # charge the model broadcast
    decode_time: Any = 0.0              # seconds, or "measured" (CPU time of decide + decode)
    straggler_policy: str = "continue"  # or "cancel"
    compress: Optional[float] = None
    batch_size: Optional[int] = None    # minibatch of each partition gradient (None: full partition)
    error_feedback: Optional[bool] = None
    eval_every: int = 1
    eval_train: bool = True             # False: evaluate the validation set only (rec.loss None;
                                        # the deep experiment, whose target is an accuracy)
    diagnostics: bool = True
    diag_batch: int = 128
    diag_every: int = 1                 # diagnostics every K steps
    diag_cost: bool = False             # record their CPU seconds (extra["diag_seconds"]; not
                                        # reproducible, so off by default: replays compare records)
    step_hook: Optional[Callable] = None  # hook(sim, step, decision, g_hat, extra) before the update
                                          # is applied (pgc_hvd.control: control rule, error split)
    momentum_correction: bool = True   # subtract the stale gradients' implicit momentum from the
                                        # optimizer's (pgc_hvd.control.momentum), as the runtime
    target_loss: Optional[float] = None
    target_accuracy: Optional[float] = None  # with stop_at_target: stop once the evaluated
                                            # accuracy (validation, else training) is >= it
    stop_at_target: bool = False
    max_time: Optional[float] = None
    seed: int = 0
    progress: bool = False
    label: str = ""
    compression: Any = None             # TopK | "topk:..." spec | None (dense messages)
    auto: Any = None                    # stragglers="auto": a pgc_hvd.control.auto_s.AutoStragglers
                                        # (master comm model; see Simulator._replan)
    make_scheme: Optional[Callable] = None  # s -> the run's scheme at budget s (with auto)

    @property
    def uses_error_feedback(self) -> bool:
        """Whether compressed messages keep an error-feedback residual (None: as TopK, on)."""
        return self.compression is not None and self.compression.error_feedback

    def __post_init__(self) -> None:
        def bad(what: str, fix: str) -> None:
            raise ValueError(f"SimConfig: {what}; {fix}")

        if not is_count(self.steps):
            bad(f"steps = {self.steps!r}", "run at least one step (an int >= 1)")
        if self.partition_time is not None and not (math.isfinite(self.partition_time)
                                                    and self.partition_time >= 0):
            bad(f"partition_time = {self.partition_time!r}",
                "give finite seconds >= 0 per partition gradient, or None to measure them")
        if self.compress is not None and not (0 < self.compress <= 1):
            bad(f"compress = {self.compress!r}",
                "the top-kappa fraction kappa/d must lie in (0, 1], e.g. 0.05; None sends dense")
        if self.batch_size is not None and not is_count(self.batch_size):
            bad(f"batch_size = {self.batch_size!r}", "use an int >= 1, or None for full partitions")
        if self.straggler_policy not in POLICIES:
            bad(f"straggler_policy = {self.straggler_policy!r}", "use 'continue' or 'cancel'")
        if self.eval_every < 0 or self.diag_every < 1:
            bad(f"eval_every = {self.eval_every}, diag_every = {self.diag_every}",
                "eval_every must be >= 0 (0: never) and diag_every >= 1")
        if self.error_feedback not in (None, True, False):
            bad(f"error_feedback = {self.error_feedback!r}", "give None (on when compressing), "
                "True or False")
        if isinstance(self.compression, str):
            try:
                self.compression = parse_compression(self.compression)
            except ValueError as err:
                bad(str(err), "give a TopK or a spec such as 'topk:0.05,ef=0'")
        if self.compression is not None and not isinstance(self.compression, TopK):
            bad(f"compression = {self.compression!r}",
                "give pgc_hvd.compress.TopK(...), a spec such as 'topk:0.05', or None")
        if self.error_feedback and self.compress is None and self.compression is None:
            bad("error_feedback without compress", "error feedback needs top-kappa compression")
        if self.compress is not None:     # the older spelling, converted once
            topk = TopK(self.compress, error_feedback=self.error_feedback is not False)
            if self.compression is not None and self.compression != topk:
                bad(f"compression = {self.compression!r} and compress = {self.compress!r}",
                    "give the TopK alone, e.g. TopK(0.05, error_feedback=False)")
            self.compression = topk
        elif self.compression is not None and self.error_feedback is not None and \
                self.error_feedback != self.compression.error_feedback:
            bad(f"error_feedback = {self.error_feedback!r} with compression = "
                f"{self.compression!r}", "set it in the TopK (TopK(..., error_feedback=...))")
        if isinstance(self.comm, str):
            self.comm = parse_comm_model(self.comm)
        if not isinstance(self.comm, (CommModel, CollectiveModel)):
            bad(f"comm = {self.comm!r}", "give a CommModel (master), a CollectiveModel or a spec "
                "such as 'master', 'ring:alpha=10e-6,gbps=25' or 'fitted:comm.json'")
        if self.auto is not None and isinstance(self.comm, CollectiveModel):
            bad("stragglers='auto' with a collective comm model",
                "use the master model (the default) for auto; re-planning under the runtime's "
                "collectives is not simulated yet")
        if self.auto is not None and self.make_scheme is None:
            bad("auto without make_scheme", "give make_scheme (s -> scheme), as simulate() does")


class Simulator(WorkerSteps):
    """One run of one scheme. ``optimizer``: a torch optimizer class or a callable
    ``params -> Optimizer`` (e.g. ``lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9,
    nesterov=True)``)."""

    def __init__(self, scheme: Scheme, task, train, parts, optimizer: Callable,
                 config: SimConfig, test=None, writer=None):
        self.scheme, self.task, self.cfg = scheme, task, config
        self.n = scheme.n
        if len(parts) != self.n:
            raise ValueError(f"{len(parts)} partitions for a scheme of n={self.n}")
        dtype = next(task.model.parameters()).dtype
        self.X = torch.as_tensor(train.X, dtype=dtype)
        self.y = torch.as_tensor(train.y)
        self.test = None if test is None else (torch.as_tensor(test.X, dtype=dtype),
                                               torch.as_tensor(test.y))
        self.grads = PartitionGradients(task, self.X, self.y, parts, batch_size=config.batch_size,
                                        seed=config.seed)
        self.layout = self.grads.layout
        self.d = self.layout.dim
        self.opt = optimizer(task.model.parameters())
        self.writer = writer
        self._init_cluster(self.X.element_size())
        if config.partition_time is None:
            self.partition_time = self.grads.measure_partition_time(self._flat())
        else:
            self.partition_time = float(config.partition_time)
        rng = np.random.default_rng(config.seed + 7919)
        src = self.test if self.test is not None else (self.X, self.y)
        vb = rng.choice(len(src[0]), size=min(config.diag_batch, len(src[0])), replace=False)
        self.val_batch = (src[0][torch.as_tensor(vb)], src[1][torch.as_tensor(vb)])
        self.snapshots: dict[int, torch.Tensor] = {0: self._flat()}
        self._grad_cache: dict[int, torch.Tensor] = {}
        self._val_grads: dict[int, torch.Tensor] = {}
        self.initial = self._evaluate()

    def _init_cluster(self, element_size: int) -> None:
        """Everything but gradients: delays, comm model, workers, clock (``self.d`` is set)."""
        config, scheme = self.cfg, self.scheme
        self.delay: DelayModel = as_delay_model(config.delay)
        check_workers(self.delay, self.n)
        check_trace_covers(self.delay, self.n, config.steps)
        self.comm = config.comm
        self.collective = isinstance(self.comm, CollectiveModel)
        if config.auto is not None:
            # the master model's decoder runs no control round at any s: s = 0 and s >= 1
            # steps pay the same fixed cost (the rule's prior for the round: none)
            config.auto.round_prior = 0.0
            # a rank left out stops at once under "cancel", finishes its step under "continue"
            config.auto.straggler_policy = config.straggler_policy
        self.element_size = int(element_size)
        self.model_bytes = self.d * self.element_size
        self.kappa = (None if config.compression is None else config.compression.kappa(self.d))
        scheme.check_error_norms(self.kappa is not None,
                                 "SimConfig.compression (pgc-hvd simulate --compression "
                                 "topk:0.05), or use decoder='n-s'")
        # state
        self.workers = []
        for w in range(self.n):
            ring = Ring(scheme, w)
            self.workers.append(Worker(w, ring, MessageEncoder(
                self.d, config.compression, complex_messages=ring.complex, rows=False)))
        self.events: list = []
        self._seq = 0
        self._job_id = 0
        self.version = 0
        self.store: dict[tuple[int, int], dict] = {}
        self.records: list[StepRecord] = []
        self.diverged: Optional[int] = None   # the step at which the run diverged (non-finite)
        self.arrival_log: list[tuple[float, int, int]] = []  # (time, worker, step) at the decoder
        self.delays_seen: list[float] = []
        self.total_evals = 0
        self.total_bytes = 0
        self.busy_total = np.zeros(self.n)
        self.ingress_free = 0.0
        self.last_fire = 0.0
        self.now = 0.0
        self.agents: Optional[AgentModel] = None
        self.plan_start = 0                  # first step of the current plan (auto re-plans)
        self._auto_pending: Optional[dict] = None
        if self.collective:
            model = AgentModel if self.comm.control == "allgather" else LogAgentModel
            if self._rows_in_sum(scheme):
                model = SumRowsAgentModel
            self.agents = model(self.comm, scheme, self.workers, self.store,
                                self.arrival_log, self._push, d=self.d,
                                element_size=self.element_size, sparse=self.kappa is not None)

    def _rows_in_sum(self, scheme) -> bool:
        """Whether the runtime would run this scheme's steps on its s = 0 path
        (:meth:`pgc_hvd.runtime.config.RuntimeConfig.rows_in_sum`): the log plane, a full
        round known before any row, dense fp32 messages, real coefficients."""
        cm = self.comm
        return (cm.control in ("log", "log-bcast") and cm.rows_in_sum and self.kappa is None
                and self.element_size == 4 and not self.workers[0].ring.complex
                and scheme.full_round_weights() is not None)

    # ------------------------------------------------------------------ helpers
    def _flat(self) -> torch.Tensor:
        return self.layout.flatten()

    def _push(self, t: float, kind: str, *payload) -> None:
        heapq.heappush(self.events, (t, self._seq, kind, payload))
        self._seq += 1

    def grads_at(self, v: int) -> torch.Tensor:
        G = self._grad_cache.get(v)
        if G is None:
            G = self.grads.all(self.snapshots[v], step=v)
            self._grad_cache[v] = G
            for old in [k for k in self._grad_cache if k < self.version - 1]:
                del self._grad_cache[old]
        return G

    def val_grad(self, v: int) -> torch.Tensor:
        """Gradient on the fixed validation batch at model version v (cached)."""
        g = self._val_grads.get(v)
        if g is None:
            g = self.grads.gradient(self.snapshots[v], *self.val_batch)
            self._val_grads[v] = g
            for old in [k for k in self._val_grads if k < v - 64]:
                del self._val_grads[old]
        return g

    def _evaluate(self) -> dict:
        res = {}
        if self.cfg.eval_train or self.test is None:
            res = {"train_" + k: v for k, v in self.task.evaluate(self.X, self.y).items()}
        if self.test is not None:
            res.update({"test_" + k: v for k, v in self.task.evaluate(*self.test).items()})
        return res

    # ------------------------------------------------------------------ decoder
    def _decode(self, decision) -> torch.Tensor:
        """g_hat = sum_u a_u D(p_u) over the decision's uses: complex weights (Reed-Solomon)
        through the scheme's ``Decision.combine`` (its real part), real ones through
        :func:`pgc_hvd.compress.codecs.decode_real`."""
        uses = decision.uses
        payloads = {(u.worker, u.step): self.store[(u.worker, u.step)]["payload"] for u in uses}
        if decision.real_part or any(isinstance(u.weight, complex) for u in uses):
            acc = decision.combine({k: dense_payload(m, self.d) for k, m in payloads.items()})
            return acc.real.to(self.X.dtype) if acc.is_complex() else acc.to(self.X.dtype)
        return decode_real([payloads[(u.worker, u.step)] for u in uses],
                           [u.weight for u in uses], self.d, self.X.dtype)

    def _apply(self, g_hat: torch.Tensor, mean_age=None) -> dict:
        """The optimizer's rule on g_hat, its momentum compensated for the update's mean
        gradient age (:mod:`pgc_hvd.control.momentum`); returns the record's fields of it."""
        for p, gv in self.layout.views(g_hat):
            p.grad = gv.clone().to(p.dtype)
        enabled = self.cfg.momentum_correction and applies_to(self.scheme)
        with compensated(self.opt.param_groups, mean_age, enabled) as corr:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return corr.record()

    def _update(self, decision, step: int, decide_seconds: float) -> tuple[float, dict, dict]:
        """Decode and apply the decision's update (version step + 1); returns (decode seconds,
        the record's extra entries, evaluation metrics)."""
        w0 = _time.thread_time()
        g_hat = self._decode(decision)
        if self.cfg.decode_time == "measured":
            decode_time = decide_seconds + (_time.thread_time() - w0)
        else:
            decode_time = float(self.cfg.decode_time)
        extra: dict = {}
        if self.cfg.diagnostics and step % max(1, int(self.cfg.diag_every)) == 0:
            d0 = _time.thread_time()
            extra.update(diagnostics(decision, g_hat, self.store, self.scheme, self.snapshots,
                                     self.val_grad, self.grads_at))
            if self.cfg.diag_cost:
                extra["diag_seconds"] = _time.thread_time() - d0
        if self.cfg.step_hook is not None:
            self.cfg.step_hook(self, step, decision, g_hat, extra)
        extra.update(self._apply(g_hat, decision.info.get("mean_age")))
        self.version = step + 1
        self.snapshots[self.version] = self._flat()
        if not bool(torch.isfinite(self.snapshots[self.version]).all()):
            self.diverged = step        # non-finite parameters: the run stops after this step
        for old in [k for k in self.snapshots if k < self.version - 64]:
            del self.snapshots[old]
        extra["lr"] = float(self.opt.param_groups[0]["lr"])
        metrics = {}
        if self.cfg.eval_every and (step % self.cfg.eval_every == 0 or step == self.cfg.steps - 1):
            metrics = self._evaluate()
        return decode_time, extra, metrics

    def _fire(self, step: int, decision, t: float, decide_seconds: float = 0.0) -> StepRecord:
        decode_time, extra, metrics = self._update(decision, step, decide_seconds)
        extra["decode_time"] = decode_time
        busy = busy_seconds(self.workers, self.last_fire, t)
        self.busy_total += np.array(busy)
        extra.update({k: v for k, v in metrics.items() if k not in ("train_loss",)})
        extra["grad_evals"] = self.total_evals
        extra["partition_time"] = self.partition_time
        extra["delay_mean"] = float(np.mean(self.delays_seen[-self.n:])) if self.delays_seen else 0.0
        used_bytes = sum(self.store[(u.worker, u.step)]["bytes"] for u in decision.uses)
        extra["bytes_used"] = used_bytes
        extra["n_late"] = sum(1 for u in decision.uses if u.step < step)
        if self._auto_pending is not None:
            extra["auto_s"] = [self._auto_pending]
            self._auto_pending = None
        if self.collective:
            step_bytes, agent_extra = self.agents.fired()
            extra.update(agent_extra)
        else:
            step_bytes = self.total_bytes - self._bytes_at_last_fire + (
                self.model_bytes * self.n if self.cfg.broadcast else 0)
        rec = StepRecord.from_decision_info(
            step, t, dict(decision.info), step_time=t - self.last_fire, scheme=self.scheme.name,
            n=self.n, s=self.scheme.s, workers_used=[u.worker for u in decision.uses],
            versions=[u.version for u in decision.uses],
            loss=metrics.get("train_loss"),
            accuracy=metrics.get("test_accuracy", metrics.get("train_accuracy")),
            bytes=step_bytes, busy=busy, extra=extra)
        self._bytes_at_last_fire = self.total_bytes
        self.last_fire = t
        # broadcast the new model (collective model: every rank holds it at t already; the
        # decode passes are in the data phase)
        if self.collective:
            arrive = t + decode_time
        else:
            arrive = t + decode_time + (self.comm.cost(self.model_bytes) if self.cfg.broadcast else 0.0)
        for w in self.workers:
            self._push(arrive, "model", w.id, self.version)
        keep = self.version - self.scheme.lookback - 1
        for key in [k for k in self.store if k[1] < keep]:
            del self.store[key]
        return rec

    # ------------------------------------------------------------------ auto
    def _replan(self, step: int) -> None:
        """``stragglers="auto"`` (:mod:`pgc_hvd.control.auto_s`) at the boundary before step
        ``step``: when the rule switches s, the run goes on with the scheme of the new s
        (its code, c and ring): every worker gets a fresh ring (its first step under the new
        plan evaluates every slot, as a pipelined scheme's warm-up), the old plan's messages
        are dropped (those stored, in flight, and those of steps still being computed, whose
        workers then start the newest version), and the switch goes into the next record's
        ``extra["auto_s"]``."""
        running = {w.id: (self.now - w.job.start, len(w.job.evaluate[1]))
                   for w in self.workers if w.job is not None}
        sw = self.cfg.auto.decide(step, running)
        if sw is None:
            return
        scheme = self.cfg.make_scheme(sw.new)
        if scheme.n != self.n:
            raise ValueError(f"make_scheme({sw.new}) built a scheme of n={scheme.n}, "
                             f"the run has n={self.n}")
        self.scheme = scheme
        for w in self.workers:
            ring = Ring(scheme, w.id)
            if ring.complex != w.ring.complex:
                w.encoder = MessageEncoder(self.d, self.cfg.compression,
                                           complex_messages=ring.complex, rows=False)
            w.ring = ring
        self.store.clear()
        self.plan_start = step
        self._auto_pending = sw.as_dict()

    # ------------------------------------------------------------------ run
    def _non_finite(self, decision) -> bool:
        """Whether a message the decision uses holds Inf or NaN (the model has diverged: the
        runtime stops with an error naming the rank and step; a simulated run ends, marked
        ``diverged``)."""
        for u in decision.uses:
            m = self.store[(u.worker, u.step)]["payload"]
            vals = m[0] if isinstance(m, tuple) else m
            if isinstance(vals, torch.Tensor) and not bool(torch.isfinite(vals).all()):
                return True     # (the time-only simulator's payloads are sizes, not tensors)
        return False

    def _emit(self, rec: StepRecord, t: float, clock: Progress) -> bool:
        """Keep and write a step's record; True when the run stops here."""
        self.records.append(rec)
        if self.writer is not None:
            self.writer.write(rec)
        step = len(self.records)
        clock.tick(step, t, rec)
        if self.diverged is not None:   # non-finite parameters (_update): every later
            return True                 # message would be non-finite
        return stops(self.cfg, rec, t, step)

    def _next_event(self, step: int) -> tuple:
        if not self.events:
            raise RuntimeError(f"{self.scheme.name}: no events left but step {step} never fired")
        t, _, kind, payload = heapq.heappop(self.events)
        self.now = t
        return t, kind, payload

    def _on_done(self, t: float, payload) -> None:
        wid, jid = payload
        w = self.workers[wid]
        if w.job is not None and w.job.id == jid:
            self._finish(w, t)      # else: cancelled

    def _run_collective(self) -> list[StepRecord]:
        """The event loop under the collective model: the agents' events go to the
        :class:`~.agents.AgentModel`; a decided step's update lands at ``data_end``."""
        cfg, agents = self.cfg, self.agents
        self._bytes_at_last_fire = 0
        for w in self.workers:
            self._push(0.0, "model", w.id, 0)
        agents.begin()
        clock = Progress(cfg, self.scheme.name)
        while agents.step < cfg.steps:
            t, kind, payload = self._next_event(agents.step)
            if kind == "model":
                self._on_model(t, *payload)
            elif kind == "done":
                self._on_done(t, payload)
            elif kind == "data_end":
                _, decision = payload
                if self._non_finite(decision):
                    self.diverged = agents.step   # a used message is Inf / NaN: diverged
                    break
                rec = self._fire(agents.round.step, decision, t, agents.decide_seconds)
                if self._emit(rec, t, clock):
                    break
                agents.next_round(t)
            else:
                agents.on_event(t, kind, payload)
        clock.close()
        return self.records

    def run(self) -> list[StepRecord]:
        if self.collective:
            return self._run_collective()
        cfg = self.cfg
        self._bytes_at_last_fire = 0
        for w in self.workers:
            self._push(0.0, "model", w.id, 0)
        rnd = self.scheme.open_round(0)
        step = 0
        clock = Progress(cfg, self.scheme.name)
        while step < cfg.steps:
            t, kind, payload = self._next_event(step)
            decision = None
            decide_seconds = 0.0
            if kind == "model":
                self._on_model(t, *payload)
            elif kind == "done":
                self._on_done(t, payload)
            elif kind == "arrive":
                arrival, pl, dense, nbytes = payload
                if arrival.step < self.plan_start:
                    continue                # a message of the plan before a re-plan: dropped
                self.arrival_log.append((t, arrival.worker, arrival.step))
                self.store[(arrival.worker, arrival.step)] = {
                    "payload": pl, "dense": dense, "arrival": arrival, "bytes": nbytes}
                w0 = _time.thread_time()
                decision = rnd.offer(arrival)
                decide_seconds = _time.thread_time() - w0
            while decision is not None:
                if self._non_finite(decision):
                    self.diverged = step      # a used message is Inf / NaN: the run diverged
                    step = cfg.steps
                    break
                rec = self._fire(rnd.step, decision, t, decide_seconds)
                decide_seconds = 0.0
                step += 1
                if self._emit(rec, t, clock):
                    step = cfg.steps
                    break
                if cfg.auto is not None:
                    cfg.auto.observe_step(rec.step_time)
                    self._replan(step)
                rnd = self.scheme.open_round(step)
                decision = rnd.poll()
        clock.close()
        return self.records
