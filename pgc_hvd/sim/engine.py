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
per-worker busy seconds) with the seed-002 diagnostics in ``extra`` (see
:mod:`pgc_hvd.metrics.diagnostics`).
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
from pgc_hvd.metrics.records import StepRecord
from pgc_hvd.options import is_count
from pgc_hvd.schemes import Arrival, Scheme

from .comm import CommModel, message_bytes
from .delays import DelayModel, Zero, as_delay_model, check_trace_covers, check_workers
from .gradients import PartitionGradients

# complex (RS) and fp64 messages: the compiled kernels are fp32, so those use the reference
from pgc_hvd.ops.reference import topk_compress_ref as _topk_ref


@dataclasses.dataclass
class SimConfig:
    """Engine settings (see module docstring). ``compress``: fraction kappa/d of entries kept by
    top-kappa (kappa = floor(compress * d)), None for dense messages."""

    steps: int = 100
    delay: Any = None                   # DelayModel | text spec | dict | None
    partition_time: Optional[float] = None  # seconds per partition gradient; None = measured
    comm: CommModel = dataclasses.field(default_factory=CommModel)
    broadcast: bool = True              # charge the model broadcast
    decode_time: Any = 0.0              # seconds, or "measured" (CPU time of decide + decode)
    straggler_policy: str = "continue"  # or "cancel"
    compress: Optional[float] = None
    batch_size: Optional[int] = None    # minibatch of each partition gradient (None: full partition)
    error_feedback: bool = False
    eval_every: int = 1
    diagnostics: bool = True
    diag_batch: int = 128
    diag_every: int = 1                 # diagnostics every K steps
    diag_cost: bool = False             # record their CPU seconds (extra["diag_seconds"]; not
                                        # reproducible, so off by default: replays compare records)
    step_hook: Optional[Callable] = None  # hook(sim, step, decision, g_hat, extra) before the update
                                          # is applied (pgc_hvd.control: control rule, error split)
    target_loss: Optional[float] = None
    stop_at_target: bool = False
    max_time: Optional[float] = None
    lr_rule: Optional[float] = None     # seed 002: halve lr when L_hat^2 disp / ||g||^2 > this
    seed: int = 0
    progress: bool = False
    label: str = ""

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
        if self.error_feedback and self.compress is None:
            bad("error_feedback without compress", "error feedback needs top-kappa compression")


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
    def __init__(self, wid: int):
        self.id = wid
        self.ring: list = []
        self.ring_versions: list = []
        self.job: Optional[_Job] = None
        self.latest: int = -1        # newest model version received
        self.done_version: int = -1  # newest version it has computed a step for
        self.residual: Optional[torch.Tensor] = None
        self.intervals: list = []    # (start, end) of compute since the last fire


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
        self.delay: DelayModel = as_delay_model(config.delay)
        check_workers(self.delay, self.n)
        check_trace_covers(self.delay, self.n, config.steps)
        self.comm = config.comm
        self.writer = writer
        self.model_bytes = self.d * self.X.element_size()
        if config.partition_time is None:
            self.partition_time = self.grads.measure_partition_time(self._flat())
        else:
            self.partition_time = float(config.partition_time)
        self.kappa = None if config.compress is None else max(1, int(math.floor(config.compress * self.d)))
        if getattr(scheme, "decoder", None) == "min-error" and self.kappa is None:
            raise ValueError(f"{scheme.name} with decoder='min-error' picks the class whose "
                             "messages lost least to compression; it needs top-kappa compression "
                             "(SimConfig.compress, pgc-hvd simulate --compress 0.05)")
        rng = np.random.default_rng(config.seed + 7919)
        src = self.test if self.test is not None else (self.X, self.y)
        vb = rng.choice(len(src[0]), size=min(config.diag_batch, len(src[0])), replace=False)
        self.val_batch = (src[0][torch.as_tensor(vb)], src[1][torch.as_tensor(vb)])
        # state
        self.workers = [_Worker(w) for w in range(self.n)]
        from pgc_hvd.schemes.protocol import Scheme as _BaseScheme
        self._plan_cacheable = type(scheme).work_plan is _BaseScheme.work_plan
        self._ring_len = [len(S) for S in scheme.supports()] if self._plan_cacheable else None
        self._plan_cache: dict = {}
        self.events: list = []
        self._seq = 0
        self._job_id = 0
        self.version = 0
        self.snapshots: dict[int, torch.Tensor] = {0: self._flat()}
        self._grad_cache: dict[int, torch.Tensor] = {}
        self._val_grad: dict[int, torch.Tensor] = {}
        self.store: dict[tuple[int, int], dict] = {}
        self.records: list[StepRecord] = []
        self.arrival_log: list[tuple[float, int, int]] = []  # (time, worker, step) at the decoder
        self.delays_seen: list[float] = []
        self.total_evals = 0
        self.total_bytes = 0
        self.busy_total = np.zeros(self.n)
        self.ingress_free = 0.0
        self.last_fire = 0.0
        self.now = 0.0
        self.initial = self._evaluate()

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

    def _evaluate(self) -> dict:
        res = {"train_" + k: v for k, v in self.task.evaluate(self.X, self.y).items()}
        if self.test is not None:
            res.update({"test_" + k: v for k, v in self.task.evaluate(*self.test).items()})
        return res

    # ------------------------------------------------------------------ workers
    def _plan(self, wid: int, v: int):
        """``scheme.work_plan(wid, v)``, cached when the scheme uses the base class's plan (which
        depends on the step only through ``step == 0`` and ``(step - 1) % L`` when pipelined)."""
        if not self._plan_cacheable:
            return self.scheme.work_plan(wid, v), None
        key = (wid, 0 if v == 0 or not self.scheme.pipelined else 1 + (v - 1) % self._ring_len[wid])
        hit = self._plan_cache.get(key)
        if hit is None:
            plan = self.scheme.work_plan(wid, v)
            hit = (plan, self._plan_meta(plan))
            self._plan_cache[key] = hit
        return hit

    @staticmethod
    def _plan_meta(plan) -> dict:
        coefs = [c for _, c in plan.combine]
        return {"slots": [slot for slot, _ in plan.combine], "coefs": coefs,
                "complex": any(isinstance(c, complex) for c in coefs),
                "float_coefs": None if any(isinstance(c, complex) for c in coefs)
                else [float(c) for c in coefs]}

    def _start(self, w: _Worker, t: float) -> None:
        v = w.latest
        plan, meta = self._plan(w.id, v)
        if not w.ring:
            w.ring = [None] * plan.ring_size
            w.ring_versions = [-1] * plan.ring_size
        evaluate = plan.evaluate
        if any(w.ring[slot] is None for slot, _ in plan.combine):
            evaluate = list(evaluate)
            done = {slot for _, slot in evaluate}
            for slot, _ in plan.combine:  # a ring slot never filled (e.g. warm-up cancelled)
                if w.ring[slot] is None and slot not in done:
                    evaluate.append((plan.slot_partitions[slot], slot))
                    done.add(slot)
        G = self.grads_at(v)
        delay = float(self.delay.sample(w.id, v))
        self.delays_seen.append(delay)
        dur = len(evaluate) * self.partition_time + delay
        self._job_id += 1
        # ring entries are (G, partition) pairs: the row G[partition] is read when a message is
        # formed (no per-slot tensor views on the hot path)
        w.job = _Job(self._job_id, v, t, t + dur, (G, evaluate), (plan, meta), delay)
        w.done_version = v
        self.total_evals += len(evaluate)
        self._push(t + dur, "done", w.id, self._job_id)

    def _finish(self, w: _Worker, t: float) -> None:
        job = w.job
        w.job = None
        w.intervals.append((job.start, job.end))
        G, evaluate = job.evaluate
        for p, slot in evaluate:
            w.ring[slot] = (G, p)
            w.ring_versions[slot] = job.step
        plan, meta = job.plan
        payload, dense, err = self._message(w, plan, meta)
        nbytes = message_bytes(payload) + (8 if err is not None else 0)
        self.total_bytes += nbytes
        send = t
        if self.comm.serial_ingress:
            send = max(t, self.ingress_free)
            self.ingress_free = send + self.comm.cost(nbytes)
        arrival = Arrival(w.id, job.step, job.step, None, err,
                          tuple(w.ring_versions[slot] for slot, _ in plan.combine))
        self._push(send + self.comm.cost(nbytes), "arrive", arrival, payload, dense, nbytes)
        if w.latest > w.done_version:
            self._start(w, t)

    def _slot_rows(self, w: _Worker, slots) -> list:
        """The ring slots' gradient rows; rows from one version are gathered in one pass."""
        entries = [w.ring[slot] for slot in slots]
        G0 = entries[0][0]
        if len(entries) > 2 and all(e[0] is G0 for e in entries):
            idx = torch.tensor([e[1] for e in entries], dtype=torch.long)
            return list(G0.index_select(0, idx).unbind(0))
        return [G[p] for G, p in entries]

    def _message(self, w: _Worker, plan, meta=None):
        if meta is None:
            meta = self._plan_meta(plan)
        slots = self._slot_rows(w, meta["slots"])
        coefs = meta["coefs"]
        if meta["complex"]:
            dense = sum(complex(c) * s.to(torch.complex128 if s.dtype == torch.float64 else torch.complex64)
                        for c, s in zip(coefs, slots))
        elif slots[0].dtype == torch.float32:
            dense = ops.coded_accumulate(torch.empty(self.d), slots, meta["float_coefs"])
        else:
            dense = sum(float(c) * s for c, s in zip(coefs, slots))
        if self.kappa is None:
            return dense, dense, None
        if dense.is_complex() or dense.dtype != torch.float32:
            # the compiled kernels are fp32; complex (RS: by modulus) and fp64 use the reference
            if self.cfg.error_feedback:
                raise ValueError("error feedback is implemented for real fp32 messages only")
            vals, idx = _topk_ref(dense, self.kappa)
        elif self.cfg.error_feedback:
            if w.residual is None:
                w.residual = torch.zeros(self.d)
            vals, idx = ops.error_feedback_compress(dense, w.residual, self.kappa, index_dtype=torch.int32)
        else:
            vals, idx = ops.topk_compress(dense, self.kappa, index_dtype=torch.int32)
        err = ops.compression_error_norm(dense, vals, w.residual if self.cfg.error_feedback else None)
        return (vals, idx.to(torch.int32)), dense, err

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

    def _apply(self, g_hat: torch.Tensor) -> None:
        for p, gv in self.layout.views(g_hat):
            p.grad = gv.clone().to(p.dtype)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def _fire(self, rnd, decision, t: float, decide_seconds: float = 0.0) -> StepRecord:
        from pgc_hvd.metrics.diagnostics import step_diagnostics

        step = rnd.step
        w0 = _time.thread_time()
        g_hat = self._decode(decision)
        if self.cfg.decode_time == "measured":
            decode_time = decide_seconds + (_time.thread_time() - w0)
        else:
            decode_time = float(self.cfg.decode_time)
        extra: dict = {}
        if self.cfg.diagnostics and step % max(1, int(self.cfg.diag_every)) == 0:
            d0 = _time.thread_time()
            extra.update(step_diagnostics(self, decision, g_hat))
            if self.cfg.diag_cost:
                extra["diag_seconds"] = _time.thread_time() - d0
        if self.cfg.step_hook is not None:
            self.cfg.step_hook(self, step, decision, g_hat, extra)
        self._apply(g_hat)
        self.version = step + 1
        self.snapshots[self.version] = self._flat()
        for old in [k for k in self.snapshots if k < self.version - 64]:
            del self.snapshots[old]
        if self.cfg.lr_rule is not None and extra.get("lhat_ratio") is not None \
                and extra["lhat_ratio"] > self.cfg.lr_rule:
            for grp in self.opt.param_groups:
                grp["lr"] *= 0.5
            extra["lr_halved"] = True
        extra["lr"] = float(self.opt.param_groups[0]["lr"])
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
        metrics = {}
        if self.cfg.eval_every and (step % self.cfg.eval_every == 0 or step == self.cfg.steps - 1):
            metrics = self._evaluate()
        extra.update({k: v for k, v in metrics.items() if k not in ("train_loss",)})
        extra["grad_evals"] = self.total_evals
        extra["partition_time"] = self.partition_time
        extra["delay_mean"] = float(np.mean(self.delays_seen[-self.n:])) if self.delays_seen else 0.0
        used_bytes = sum(self.store[(u.worker, u.step)]["bytes"] for u in decision.uses)
        extra["bytes_used"] = used_bytes
        extra["n_late"] = sum(1 for u in decision.uses if u.step < step)
        rec = StepRecord.from_decision_info(
            step, t, dict(decision.info), step_time=t - self.last_fire, scheme=self.scheme.name,
            n=self.n, s=self.scheme.s, workers_used=[u.worker for u in decision.uses],
            versions=[u.version for u in decision.uses],
            loss=metrics.get("train_loss"),
            accuracy=metrics.get("test_accuracy", metrics.get("train_accuracy")),
            bytes=self.total_bytes - self._bytes_at_last_fire + (
                self.model_bytes * self.n if self.cfg.broadcast else 0),
            busy=busy, extra=extra)
        self._bytes_at_last_fire = self.total_bytes
        self.last_fire = t
        # broadcast the new model
        arrive = t + decode_time + (self.comm.cost(self.model_bytes) if self.cfg.broadcast else 0.0)
        for w in self.workers:
            self._push(arrive, "model", w.id, self.version)
        keep = self.version - max(self.scheme.c, 1) - 1
        for key in [k for k in self.store if k[1] < keep]:
            del self.store[key]
        return rec

    # ------------------------------------------------------------------ run
    def run(self) -> list[StepRecord]:
        cfg = self.cfg
        self._bytes_at_last_fire = 0
        for w in self.workers:
            self._push(0.0, "model", w.id, 0)
        rnd = self.scheme.open_round(0)
        step = 0
        wall0 = last_print = _time.perf_counter()
        while step < cfg.steps:
            if not self.events:
                raise RuntimeError(f"{self.scheme.name}: no events left but step {step} never fired")
            t, _, kind, payload = heapq.heappop(self.events)
            self.now = t
            decision = None
            decide_seconds = 0.0
            if kind == "model":
                wid, v = payload
                w = self.workers[wid]
                if v <= w.latest:
                    continue
                w.latest = v
                if w.job is None:
                    self._start(w, t)
                elif cfg.straggler_policy == "cancel":
                    job = w.job
                    w.intervals.append((job.start, t))
                    w.job = None
                    self._start(w, t)
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
                rec = self._fire(rnd, decision, t, decide_seconds)
                decide_seconds = 0.0
                self.records.append(rec)
                if self.writer is not None:
                    self.writer.write(rec)
                step += 1
                if cfg.progress and (_time.perf_counter() - last_print > 0.5 or step == cfg.steps):
                    last_print = _time.perf_counter()
                    bar = "#" * int(20 * step / cfg.steps)
                    print(f"\r{cfg.label or self.scheme.name:>24} [{bar:<20}] {step}/{cfg.steps} "
                          f"t={t:9.2f}s loss={rec.loss if rec.loss is not None else float('nan'):.4f} "
                          f"({_time.perf_counter() - wall0:.0f}s)", end="", file=sys.stderr, flush=True)
                if step >= cfg.steps:
                    break
                if cfg.stop_at_target and cfg.target_loss is not None and rec.loss is not None \
                        and rec.loss <= cfg.target_loss:
                    step = cfg.steps
                    break
                if cfg.max_time is not None and t >= cfg.max_time:
                    step = cfg.steps
                    break
                rnd = self.scheme.open_round(step)
                decision = rnd.poll()
        if cfg.progress:
            print(file=sys.stderr)
        return self.records
