"""The event-driven virtual cluster: n workers and one decoder, real gradients, virtual time.

Model of one run (all times virtual seconds):

* The decoder holds the model beta_t, the optimizer and the scheme. Step t's round is open
  while version t is the newest model. After the round fires at time T, the decoder decodes
  g_hat = sum_m a_m m_m (:meth:`Decision`), applies the optimizer (version t+1) and broadcasts
  beta_{t+1}; every worker receives it at T + decode_time + alpha + model_bytes / b.
* A worker that receives version v while idle starts step v at once: it evaluates the
  partitions of ``scheme.work_plan(worker, v)`` at beta_v (real gradients), which takes
  ``len(plan.evaluate) * partition_time + delay.sample(worker, v)`` seconds, writes them into
  its ring, forms its coded message from the ring (``pgc_hvd.ops.coded_accumulate``),
  compresses it (top-kappa, optionally with error feedback) and sends it: it reaches the
  decoder alpha + bytes / b later. ``straggler_policy="continue"`` (default, as the Horovod
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
no master; the step follows the Horovod runtime's protocol (:mod:`pgc_hvd.runtime.agent`) with
every collective costed by the alpha-beta model:

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
  rest are shown again in the next round).
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
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import sys
import time as _time
from typing import Any, Callable, Optional

import numpy as np
import torch

import pgc_hvd.ops as ops
from pgc_hvd.compress.message import coded_sum, topk_message
from pgc_hvd.compress.topk import TopK
from pgc_hvd.compress.transport import allreduce_bytes, choose_collective
from pgc_hvd.control.momentum import applies_to, compensated
from pgc_hvd.metrics.records import StepRecord
from pgc_hvd.options import is_count
from pgc_hvd.metrics.diagnostics import error_decomposition, staleness_diagnostics
from pgc_hvd.schemes import Arrival, Ring, Scheme

from .comm import CollectiveModel, CommModel, message_bytes, parse_comm_model
from pgc_hvd.delays import DelayModel, as_delay_model, check_trace_covers, check_workers
from .gradients import PartitionGradients


@dataclasses.dataclass
class SimConfig:
    """Engine settings (see module docstring). ``compress``: fraction kappa/d of entries kept by
    top-kappa (kappa = max(1, floor(compress * d)), :meth:`pgc_hvd.compress.TopK.kappa`, the
    runtime's rule), None for dense messages. ``error_feedback``: None (default) means on when
    compressing, as :class:`pgc_hvd.compress.TopK`'s default in the runtime; the papers'
    experiments pass False (they compress coded messages without memory)."""

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

    @property
    def uses_error_feedback(self) -> bool:
        """Whether compressed messages keep an error-feedback residual (None: as TopK, on)."""
        return self.compress is not None and self.error_feedback is not False

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
        if self.straggler_policy not in ("continue", "cancel"):
            bad(f"straggler_policy = {self.straggler_policy!r}", "use 'continue' or 'cancel'")
        if self.eval_every < 0 or self.diag_every < 1:
            bad(f"eval_every = {self.eval_every}, diag_every = {self.diag_every}",
                "eval_every must be >= 0 (0: never) and diag_every >= 1")
        if self.error_feedback not in (None, True, False):
            bad(f"error_feedback = {self.error_feedback!r}", "give None (on when compressing), "
                "True or False")
        if self.error_feedback and self.compress is None:
            bad("error_feedback without compress", "error feedback needs top-kappa compression")
        if isinstance(self.comm, str):
            self.comm = parse_comm_model(self.comm)
        if not isinstance(self.comm, (CommModel, CollectiveModel)):
            bad(f"comm = {self.comm!r}", "give a CommModel (master), a CollectiveModel or a spec "
                "such as 'master', 'ring:alpha=10e-6,gbps=25' or 'fitted:comm.json'")


@dataclasses.dataclass
class _Job:
    id: int
    step: int
    start: float
    end: float
    evaluate: list          # [(partition, slot, tensor)]
    plan: Any
    delay: float


class _Worker:
    def __init__(self, wid: int, ring: Ring):
        self.id = wid
        self.ring = ring             # slots hold (G, partition): row G[partition] of version v
        self.job: Optional[_Job] = None
        self.latest: int = -1        # newest model version received
        self.done_version: int = -1  # newest version it has computed a step for
        self.applied: int = 0        # model version it holds (collective model: updates applied)
        self.residual: Optional[torch.Tensor] = None
        self.intervals: list = []    # (start, end) of compute since the last fire
        self.outbox: list = []       # collective model: messages not announced yet, oldest first


# control row of the runtime's agent: CTRL_FIXED = 11 float64 fields + one per ring slot
_CTRL_FIXED = 11


class Simulator:
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
        self.element_size = int(element_size)
        self.model_bytes = self.d * self.element_size
        self.kappa = (None if config.compress is None else
                      TopK(config.compress).kappa(self.d))
        if scheme.needs_error_norms and self.kappa is None:
            raise ValueError(f"{scheme.name} with decoder='min-error' picks the class whose "
                             "messages lost least to compression; it needs top-kappa compression "
                             "(SimConfig.compress, pgc-hvd simulate --compression topk:0.05)")
        # state
        self.workers = [_Worker(w, Ring(scheme, w)) for w in range(self.n)]
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
        if self.collective:
            self._init_agents()

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

    # ------------------------------------------------------------------ workers
    def _start(self, w: _Worker, t: float) -> None:
        v = w.latest
        plan = w.ring.plan(v)       # with any slot never filled (e.g. warm-up cancelled)
        evaluate = plan.evaluate
        G = self.grads_at(v)
        delay = float(self.delay.sample(w.id, v))
        self.delays_seen.append(delay)
        dur = len(evaluate) * self.partition_time + delay
        if self.collective:  # the worker's local passes over d (module doc)
            dur += (v - w.applied) * self._apply_seconds + self._form_seconds(len(plan.combine))
            w.applied = v
        self._job_id += 1
        # ring entries are (G, partition) pairs: the row G[partition] is read when a message is
        # formed (no per-slot tensor views on the hot path)
        w.job = _Job(self._job_id, v, t, t + dur, (G, evaluate), plan, delay)
        w.done_version = v
        self.total_evals += len(evaluate)
        self._push(t + dur, "done", w.id, self._job_id)

    def _finish(self, w: _Worker, t: float) -> None:
        job = w.job
        w.job = None
        w.intervals.append((job.start, job.end))
        G, evaluate = job.evaluate
        for p, slot in evaluate:
            w.ring.fill(slot, job.step, (G, p))
        plan = job.plan
        payload, dense, err = self._message(w, plan)
        nbytes = self._message_bytes(payload) + (8 if err is not None else 0)
        versions = w.ring.message_versions(plan)
        arrival = Arrival(w.id, job.step, job.step, None, err, versions)
        if self.collective:
            w.outbox.append({"arrival": arrival, "payload": payload, "dense": dense,
                             "bytes": nbytes, "ready": t, "sent": False})
            self._outbox_ranks.add(w.id)
            self._agent_event(w.id, t)
        else:
            self.total_bytes += nbytes
            send = t
            if self.comm.serial_ingress:
                send = max(t, self.ingress_free)
                self.ingress_free = send + self.comm.cost(nbytes)
            self._push(send + self.comm.cost(nbytes), "arrive", arrival, payload, dense, nbytes)
        if w.latest > w.done_version:
            self._start(w, t)

    def _message_bytes(self, payload) -> int:
        return message_bytes(payload)

    def _slot_rows(self, w: _Worker, slots) -> list:
        """The ring slots' gradient rows; rows from one version are gathered in one pass."""
        entries = [w.ring.slots[slot] for slot in slots]
        G0 = entries[0][0]
        if len(entries) > 2 and all(e[0] is G0 for e in entries):
            idx = torch.tensor([e[1] for e in entries], dtype=torch.long)
            return list(G0.index_select(0, idx).unbind(0))
        return [G[p] for G, p in entries]

    def _message(self, w: _Worker, plan):
        """The worker's coded message (:func:`pgc_hvd.compress.message.coded_sum`) and, with
        compression, its top-kappa (:func:`pgc_hvd.compress.message.topk_message`): the
        message code both engines share."""
        form = w.ring.form(plan)
        slots = self._slot_rows(w, form.slots)
        coefs = form.float_coefs if not form.complex and slots[0].dtype == torch.float32 \
            else form.coefs
        dense = coded_sum(slots, coefs, complex_code=form.complex)
        if self.kappa is None:
            return dense, dense, None
        ef = self.cfg.uses_error_feedback
        if ef and w.residual is None and not dense.is_complex() and dense.dtype == torch.float32:
            w.residual = torch.zeros(self.d)
        vals, idx, err = topk_message(dense, self.kappa, error_feedback=ef, residual=w.residual)
        return (vals, idx), dense, err

    # ------------------------------------------------------------------ decoder
    def _decode(self, decision) -> torch.Tensor:
        uses = decision.uses
        entries = [self.store[(u.worker, u.step)] for u in uses]
        weights = [u.weight for u in uses]
        if decision.real_part or any(isinstance(x, complex) for x in weights):
            acc = None
            for e, wgt in zip(entries, weights):
                m = e["payload"]
                if isinstance(m, tuple):
                    dense = torch.zeros(self.d, dtype=m[0].dtype)
                    dense[m[1].long()] = m[0]
                    m = dense
                term = m * wgt
                acc = term if acc is None else acc + term
            return acc.real.to(self.X.dtype) if acc.is_complex() else acc.to(self.X.dtype)
        out = torch.zeros(self.d, dtype=torch.float32)
        if self.X.dtype == torch.float32:
            return ops.decode_accumulate(out, [e["payload"] for e in entries], [float(x) for x in weights],
                                      accumulate=False)
        acc = torch.zeros(self.d, dtype=self.X.dtype)
        for e, wgt in zip(entries, weights):
            m = e["payload"]
            if isinstance(m, tuple):
                acc.index_add_(0, m[1].long(), m[0] * float(wgt))
            else:
                acc.add_(m, alpha=float(wgt))
        return acc

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
            extra.update(self._diagnostics(decision, g_hat))
            if self.cfg.diag_cost:
                extra["diag_seconds"] = _time.thread_time() - d0
        if self.cfg.step_hook is not None:
            self.cfg.step_hook(self, step, decision, g_hat, extra)
        extra.update(self._apply(g_hat, decision.info.get("mean_age")))
        self.version = step + 1
        self.snapshots[self.version] = self._flat()
        for old in [k for k in self.snapshots if k < self.version - 64]:
            del self.snapshots[old]
        extra["lr"] = float(self.opt.param_groups[0]["lr"])
        metrics = {}
        if self.cfg.eval_every and (step % self.cfg.eval_every == 0 or step == self.cfg.steps - 1):
            metrics = self._evaluate()
        return decode_time, extra, metrics

    def _diagnostics(self, decision, g_hat: torch.Tensor) -> dict:
        """:mod:`pgc_hvd.metrics.diagnostics` of this step's update: staleness over the versions
        of every ring slot of every message used, and the error decomposition."""
        versions: list[int] = []
        for u in decision.uses:
            arr = self.store[(u.worker, u.step)]["arrival"]
            versions.extend(arr.slot_versions or (u.version,))
        out: dict = {"g_hat_sq": float(g_hat.double().pow(2).sum())}
        out.update(staleness_diagnostics(decision.step, versions, self.snapshots, self.val_grad,
                                         out["g_hat_sq"]))
        rows = np.stack([self.scheme.message_row(u.worker, u.step) for u in decision.uses])
        out.update(error_decomposition(
            g_hat, self.grads_at(decision.step), rows, [u.weight for u in decision.uses],
            [self.store[(u.worker, u.step)]["dense"] for u in decision.uses]))
        return out

    def _fire(self, rnd, decision, t: float, decide_seconds: float = 0.0) -> StepRecord:
        step = rnd.step
        decode_time, extra, metrics = self._update(decision, step, decide_seconds)
        extra["decode_time"] = decode_time
        # busy seconds of each worker in (last_fire, t]
        busy = []
        for w in self.workers:
            ivs = list(w.intervals)
            if w.job is not None:
                ivs.append((w.job.start, w.job.end))
            b = sum(max(0.0, min(e, t) - max(s, self.last_fire)) for s, e in ivs)
            busy.append(b)
            w.intervals = [(s, e) for s, e in w.intervals if e > t]
        self.busy_total += np.array(busy)
        extra.update({k: v for k, v in metrics.items() if k not in ("train_loss",)})
        extra["grad_evals"] = self.total_evals
        extra["partition_time"] = self.partition_time
        extra["delay_mean"] = float(np.mean(self.delays_seen[-self.n:])) if self.delays_seen else 0.0
        used_bytes = sum(self.store[(u.worker, u.step)]["bytes"] for u in decision.uses)
        extra["bytes_used"] = used_bytes
        extra["n_late"] = sum(1 for u in decision.uses if u.step < step)
        if self.collective:
            step_bytes = int(self._recv.max())
            self._recv[:] = 0.0
            extra["control_rounds"] = self._rounds - self._rounds_at_last_fire
            extra["data_seconds"] = self._data_seconds
            self._rounds_at_last_fire = self._rounds
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

    # ------------------------------------------------------------------ collective model
    def _init_agents(self) -> None:
        """State of the runtime's agents (module doc, "Collective model")."""
        cm: CollectiveModel = self.comm
        self._row_bytes = 8 * (_CTRL_FIXED + self.scheme.lookback)
        self._late_usable = self.scheme.late_usable
        self._apply_seconds = cm.local(3 * self.model_bytes)
        self._cached: set = set()          # (worker, step) whose payload every rank holds
        self._phase = "idle"               # idle | collective | data | dormant
        self._submitted: dict = {}         # rank -> (entry or None, payload bytes) this round;
                                           # a rank not in it at the round's start shows nothing
        self._outbox_ranks: set = set()    # ranks with a message not announced yet
        self._woke: set = set()            # ranks whose next wait is skipped
        self._round_id = 0
        self._last_end = 0.0               # end of the last collective
        self._wait = cm.poll_interval
        self._dormant = None               # (end, wait, round cost) while rounds are empty
        self._rounds = 0
        self._rounds_at_last_fire = 0
        self._data_seconds = 0.0
        self._empty_round = cm.allgather(self.n, [self._row_bytes] * self.n)
        self._recv = np.zeros(self.n)      # bytes each rank received since the last update

    def _form_seconds(self, slots: int) -> float:
        """Coded accumulation of ``slots`` ring slots, finiteness check, copy to the send
        buffer (module doc)."""
        return self.comm.local((slots + 1) * self.model_bytes + 1.25 * self.model_bytes
                               + 2 * self.model_bytes)

    def _rides(self, entry) -> bool:
        """Does this message's payload ride with its control row (one-collective steps)? Old
        plane: always. New plane: while the n copies a rank receives, n * bytes, are at most
        ``optimistic_below`` (the runtime's rule, ``compress.transport.optimistic_default``)."""
        cm = self.comm
        return cm.plane == "allgather" or (cm.plane == "allreduce"
                                           and self.n * entry["bytes"] <= cm.optimistic_below)

    def _agent_event(self, wid: int, t: float) -> None:
        """A local event on rank ``wid`` (its message became ready) at time t."""
        if self._phase == "dormant":
            self._wake_from_dormant(t)
        if self._phase == "idle" and wid not in self._submitted:
            self._submit(wid)
            if len(self._submitted) == self.n:
                self._start_round(t)
        else:
            self._woke.add(wid)

    def _wake_from_dormant(self, t: float) -> None:
        """Rounds of empty rows ran every ``wait + cost`` since ``end``: find where t falls."""
        end, wait, cost = self._dormant
        self._dormant = None
        period = wait + cost
        k = max(0, int(math.floor((t - end - wait) / period))) if t > end + wait else -1
        if k < 0:               # still in the first wait
            self._enter_idle(end, wait)
            return
        start = end + wait + k * period   # start of the k-th empty round after `end`
        if t > start + period:            # rounding
            k += 1
            start += period
        self._rounds += k + 1
        each = (self.n - 1) * self._row_bytes * (k + 1)
        self._recv += each
        self.total_bytes += int(each)
        if t <= start + cost:             # inside the (k+1)-th empty round: it ends at start+cost
            self._phase = "collective"
            self._round_id += 1
            self._push(start + cost, "ctl_end", self._round_id, {})
        else:                             # in the wait after it
            self._enter_idle(start + cost, wait)

    def _submit(self, wid: int) -> None:
        w = self.workers[wid]
        entry, pbytes = None, 0
        if w.outbox:
            entry = w.outbox[0]
            if (not entry["sent"] and self._rides(entry)
                    and (entry["arrival"].step >= self._step or self._late_usable)):
                entry["sent"] = True
                pbytes = entry["bytes"]
        self._submitted[wid] = (entry, pbytes)

    def _start_round(self, t: float) -> None:
        sizes = [self._row_bytes] * self.n
        for wid, (_, pbytes) in self._submitted.items():
            sizes[wid] += pbytes
        cost = self.comm.allgather(self.n, sizes)
        self._received(allgather=sizes)
        self._phase = "collective"
        self._round_id += 1
        self._rounds += 1
        self._push(t + cost, "ctl_end", self._round_id, self._submitted)
        self._submitted = {}

    def _received(self, allgather=None, each: float = 0.0) -> None:
        """Count the bytes every rank receives in a collective: an allgather of ``sizes`` (each
        rank receives all but its own), or ``each`` bytes per rank (allreduce)."""
        if allgather is not None:
            total = sum(allgather)
            self._recv += total - np.asarray(allgather, dtype=float)
            self.total_bytes += int(total - min(allgather))
        else:
            self._recv += each
            self.total_bytes += int(each)

    def _enter_idle(self, end: float, wait: float) -> None:
        """After a collective that did not fire: ranks wait ``wait`` (or not, if woken)."""
        self._phase = "idle"
        self._last_end = end
        self._wait = wait
        self._round_id += 1
        self._submitted = {}
        for wid in sorted(self._woke):
            self._submit(wid)
        self._woke.clear()
        if len(self._submitted) == self.n:
            self._start_round(end)
            return
        if not self._submitted and not self._outbox_ranks:
            self._phase = "dormant"
            self._dormant = (end, wait, self._empty_round)
            return
        self._push(end + wait, "ctl_deadline", self._round_id)

    def _deadline(self, t: float) -> None:
        """The others' wait ends: every rank has submitted (ranks with nothing to show need no
        entry in ``_submitted``)."""
        for wid in self._outbox_ranks:
            if wid not in self._submitted:
                self._submit(wid)
        self._start_round(t)

    def _control_end(self, t: float, rows: dict, rnd):
        """Offer the round's rows in (ready time, rank) order; the decision or None."""
        arrivals = []
        for wid, (entry, pbytes) in rows.items():
            if entry is None:
                continue
            if pbytes:
                self._cached.add((wid, entry["arrival"].step))
            arrivals.append((entry["ready"], wid, entry))
        arrivals.sort(key=lambda x: (x[0], x[1]))
        decision = None
        for _, wid, entry in arrivals:
            arrival = entry["arrival"]
            box = self.workers[wid].outbox
            box.remove(entry)
            if not box:
                self._outbox_ranks.discard(wid)
            self.arrival_log.append((t, wid, arrival.step))
            self.store[(wid, arrival.step)] = entry
            w0 = _time.thread_time()
            decision = rnd.offer(arrival)
            self._decide_seconds = _time.thread_time() - w0
            if decision is not None:
                break
        if decision is None:
            decision = rnd.poll()
        return decision

    def _data_phase(self, decision) -> float:
        """Seconds from the deciding control round's end to the update on every rank."""
        cm: CollectiveModel = self.comm
        n, d4 = self.n, self.model_bytes
        uses = [(u.worker, u.step) for u in decision.uses]
        used_bytes = sum(self.store[key]["bytes"] for key in uses)
        sparse = self.kappa is not None
        missing = [0] * n        # bytes of each rank's used messages not every rank holds
        for key in uses:
            if key not in self._cached:
                missing[key[0]] += self.store[key]["bytes"]
        if cm.plane in ("allgather", "allgather-2phase"):
            # the planes before issue 13: allgather what is missing, then every rank decodes
            # sum a_u m_u from the messages
            seconds = cm.local(used_bytes + d4)
            if any(missing):
                seconds += cm.allgather(n, missing)
                self._received(allgather=missing)
        else:
            # issue 13's plane, with the runtime's own rule (pgc_hvd.compress.transport)
            needed = sum(1 for key in uses if key not in self._cached)
            width = max(1, self.store[uses[0]]["bytes"] // 4) if uses else 1
            kind = choose_collective(sparse=sparse, n=n, d=self.d, width=width, needed=needed)
            cached = sum(self.store[key]["bytes"] for key in uses if key in self._cached)
            if kind == "cached":
                seconds = cm.local(used_bytes + d4)
            elif kind == "allgather":      # the chosen (values, indices) rows
                seconds = cm.allgather(n, missing) + cm.local(used_bytes + d4)
                self._received(allgather=missing)
            else:                          # each rank's sum a_u m_u, ONE allreduce
                seconds = (cm.local(max(missing) + d4) + cm.allreduce(n, d4)
                           + (cm.local(cached + d4) if cached else 0.0))
                self._received(each=allreduce_bytes(n, self.d) * self.element_size / 4)
        self._cached = {k for k in self._cached if k[1] > decision.step
                        or (self._late_usable and k[1] >= decision.step - self.scheme.lookback)}
        return seconds

    def _run_collective(self) -> list[StepRecord]:
        cfg = self.cfg
        self._bytes_at_last_fire = 0
        for w in self.workers:
            self._push(0.0, "model", w.id, 0)
        self._step = 0
        rnd = self.scheme.open_round(0)
        self._decide_seconds = 0.0
        clock = _Progress(cfg, self.scheme.name)
        self._start_round(0.0)        # every agent's loop begins with a control round
        while self._step < cfg.steps:
            if not self.events:
                raise RuntimeError(f"{self.scheme.name}: no events left but step {self._step} never fired")
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            if kind == "model":
                self._on_model(t, *payload)
            elif kind == "done":
                wid, jid = payload
                w = self.workers[wid]
                if w.job is not None and w.job.id == jid:
                    self._finish(w, t)
            elif kind == "ctl_deadline":
                if payload[0] == self._round_id and self._phase == "idle":
                    self._deadline(t)
            elif kind == "ctl_end":
                rid, rows = payload
                if rid != self._round_id:
                    continue
                self._last_end = t
                decision = self._control_end(t, rows, rnd)
                if decision is None:
                    self._enter_idle(t, self.comm.poll_interval / 4 if rnd.arrived
                                     else self.comm.poll_interval)
                else:
                    self._phase = "data"
                    self._data_seconds = self._data_phase(decision)
                    self._round_id += 1
                    self._push(t + self._data_seconds, "data_end", self._round_id, decision)
            elif kind == "data_end":
                rid, decision = payload
                rec = self._fire(rnd, decision, t, self._decide_seconds)
                self._decide_seconds = 0.0
                self._step += 1
                if self._emit(rec, t, clock):
                    break
                rnd = self.scheme.open_round(self._step)
                # the agent's loop goes straight to the next control round: every rank
                # submits now
                self._woke.clear()
                self._submitted = {}
                for wid in self._outbox_ranks:
                    self._submit(wid)
                self._start_round(t)
        clock.close()
        return self.records

    # ------------------------------------------------------------------ run
    def _on_model(self, t: float, wid: int, v: int) -> None:
        w = self.workers[wid]
        if v <= w.latest:
            return
        w.latest = v
        if w.job is None:
            self._start(w, t)
        elif self.cfg.straggler_policy == "cancel":
            job = w.job
            w.intervals.append((job.start, t))
            w.job = None
            self._start(w, t)

    def _non_finite(self, decision) -> bool:
        """Whether a message the decision uses holds Inf or NaN (the model has diverged: the
        runtime stops with an error naming the rank and step; a simulated run ends, marked
        ``diverged``)."""
        for u in decision.uses:
            m = self.store[(u.worker, u.step)]["payload"]
            vals = m[0] if isinstance(m, tuple) else m
            if not bool(torch.isfinite(vals).all()):
                return True
        return False

    def _emit(self, rec: StepRecord, t: float, clock: "_Progress") -> bool:
        """Keep and write a step's record; True when the run stops here."""
        cfg = self.cfg
        self.records.append(rec)
        if self.writer is not None:
            self.writer.write(rec)
        step = len(self.records)
        clock.tick(step, t, rec)
        if step >= cfg.steps:
            return True
        if cfg.stop_at_target and cfg.target_loss is not None and rec.loss is not None \
                and rec.loss <= cfg.target_loss:
            return True
        if cfg.stop_at_target and cfg.target_accuracy is not None and rec.accuracy is not None \
                and rec.accuracy >= cfg.target_accuracy:
            return True
        if cfg.max_time is not None and t >= cfg.max_time:
            return True
        if not bool(torch.isfinite(self.snapshots[self.version]).all()):
            self.diverged = step        # non-finite parameters: every later message would be
            return True
        return False

    def run(self) -> list[StepRecord]:
        if self.collective:
            return self._run_collective()
        cfg = self.cfg
        self._bytes_at_last_fire = 0
        for w in self.workers:
            self._push(0.0, "model", w.id, 0)
        rnd = self.scheme.open_round(0)
        step = 0
        clock = _Progress(cfg, self.scheme.name)
        while step < cfg.steps:
            if not self.events:
                raise RuntimeError(f"{self.scheme.name}: no events left but step {step} never fired")
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            decision = None
            decide_seconds = 0.0
            if kind == "model":
                self._on_model(t, *payload)
            elif kind == "done":
                wid, jid = payload
                w = self.workers[wid]
                if w.job is None or w.job.id != jid:
                    continue  # cancelled
                self._finish(w, t)
            elif kind == "arrive":
                arrival, pl, dense, nbytes = payload
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
                rec = self._fire(rnd, decision, t, decide_seconds)
                decide_seconds = 0.0
                step += 1
                if self._emit(rec, t, clock):
                    step = cfg.steps
                    break
                rnd = self.scheme.open_round(step)
                decision = rnd.poll()
        clock.close()
        return self.records


class _Progress:
    """The progress bar on stderr (``SimConfig.progress``)."""

    def __init__(self, cfg: SimConfig, name: str):
        self.cfg, self.name = cfg, name
        self.wall0 = self.last = _time.perf_counter()

    def tick(self, step: int, t: float, rec: StepRecord) -> None:
        cfg = self.cfg
        if cfg.progress and (_time.perf_counter() - self.last > 0.5 or step == cfg.steps):
            self.last = _time.perf_counter()
            bar = "#" * int(20 * step / cfg.steps)
            print(f"\r{cfg.label or self.name:>24} [{bar:<20}] {step}/{cfg.steps} "
                  f"t={t:9.2f}s loss={rec.loss if rec.loss is not None else float('nan'):.4f} "
                  f"({_time.perf_counter() - self.wall0:.0f}s)", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.cfg.progress:
            print(file=sys.stderr)
