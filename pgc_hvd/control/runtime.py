"""The control rule in the Horovod runtime, through its public hooks only.

    ctl = AdaptiveController(model, task.loss, (x_val, y_val), ControlConfig(every=5), max_age=1,
                             writer=RecordWriter(out / "records.jsonl"))
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(...), model.named_parameters(),
                                       scheme="pgc-cr", stragglers=1, records=None,
                                       on_update=ctl.on_update, on_record=ctl.on_record)
    ctl.attach(opt)

* ``on_update(step, g_hat, decision)`` runs on every rank's training thread before the update is
  applied (model = beta_t): the controller keeps the last ``max_age + 1`` parameter vectors, and
  every K steps computes ||g_hat||^2, the displacement ||beta_t - beta_{t-a}||^2 to the oldest
  version the step actually used (a = ``decision.info["max_age"]``, ring slots included, capped
  at ``max_age`` = c - 1 for PGC and bounded staleness; a = ``max_age``, the bound, when called
  with two arguments), the stale/current correlation and L_hat on a fixed validation batch
  (gradients through ``torch.func.functional_call`` on copies, so the optimizer's gradient hooks
  never see them), and feeds rho and the validation-batch loss at beta_t (the rule's loss-trend
  gate, see :mod:`pgc_hvd.control.rule`) to the rule; a change sets ``param_groups[*]["lr"]``.
  A step that used no stale entry (a = 0) is observed with rho = 0. Every rank computes the same numbers from the same parameters
  (the runtime keeps them identical), so every rank takes the same decision without a collective.
* ``on_record(rec)`` (rank 0) adds the diagnostics and actions computed since the last record to
  ``rec.extra`` (``diag``, ``control``, ``control_level``, ``lr``) and writes it with ``writer``:
  pass ``records=None`` to the optimizer so the records are written once, with these fields.

Knob (``ControlConfig.knob``): "lr" sets ``param_groups[*]["lr"]`` on every rank; "c" lowers
the staleness bound of bounded staleness through ``optimizer.set_staleness_bound`` (applied on
every rank at the same control round, see :mod:`pgc_hvd.runtime.agent`); "auto" (default) is c
down to its floor, then lr, where the scheme has a changeable bound, else lr -- as in the
simulator (:func:`pgc_hvd.control.rule.make_actuator`). Records carry ``lr``
and, for bounded staleness, ``c`` (the bound each decision was taken with).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Optional

import torch

from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.metrics.diagnostics import staleness_diagnostics

from .rule import ControlConfig, ControlRule, actuate, make_actuator


class AdaptiveController:
    def __init__(self, model: torch.nn.Module, loss_fn: Callable, val_batch, config: Optional[ControlConfig] = None,
                 max_age: Optional[int] = 1, writer=None, on_record: Optional[Callable] = None):
        self.model, self.loss_fn = model, loss_fn
        self.val_batch = val_batch
        self.cfg = config or ControlConfig()
        self.rule = ControlRule(self.cfg)
        self.writer, self.chain = writer, on_record
        self.layout = FlatLayout.of_module(model)
        self._set_max_age(1 if max_age is None else max_age)
        self._age_from_scheme = max_age is None
        self.pending: list[dict] = []
        self.lock = threading.Lock()
        self.actuator = None
        self.opt = None
        self.diag_seconds = 0.0

    def _set_max_age(self, max_age: int) -> None:
        self.max_age = max(1, int(max_age))
        self.snaps: deque = deque(maxlen=self.max_age + 1)

    def attach(self, optimizer) -> "AdaptiveController":
        """Bind the knob (``config.knob``) to ``optimizer``; with ``max_age=None`` the age bound is
        taken from its scheme (``scheme.lookback`` - 1: the ring depth c - 1 of PGC, the
        bounded-staleness bound c - 1)."""
        self.opt = optimizer
        sch = getattr(optimizer, "scheme", None)
        self.actuator = make_actuator(self.cfg.knob, sch, optimizer, self.cfg.factor, self.cfg.c_min,
                                      apply_c=getattr(optimizer, "set_staleness_bound", None))
        if self._age_from_scheme:
            self._set_max_age((2 if sch is None else int(sch.lookback)) - 1)
        return self

    def _val_grad(self, flat: torch.Tensor, with_loss: bool = False):
        params = {n: v.clone().requires_grad_(True)
                  for n, v in self.layout.unflatten(flat).items()}
        x, y = self.val_batch
        out = torch.func.functional_call(self.model, params, (x,))
        loss = self.loss_fn(out, y)
        grads = torch.autograd.grad(loss, list(params.values()))
        g = torch.cat([g.reshape(-1) for g in grads])
        return (g, float(loss.detach())) if with_loss else g

    def on_update(self, step: int, g_hat: torch.Tensor, decision=None) -> None:
        beta = self.layout.flatten()
        self.snaps.append((step, beta))
        if step % max(1, self.cfg.every):
            return
        if decision is not None:
            info = getattr(decision, "info", None) or {}
            age = info.get("max_age")
            if age is None:
                age = max((step - u.version for u in decision.uses), default=0)
            age = min(int(age), self.max_age)
        else:
            age = self.max_age
        if len(self.snaps) <= age:
            return
        t0 = time.thread_time()
        gsq = float(g_hat.double().pow(2).sum())
        gv_t, vloss = self._val_grad(beta, with_loss=True)
        diag = {"step": step, "g_hat_sq": gsq, "age": age, "age_bound": self.max_age,
                "val_loss": vloss}
        v, old = self.snaps[-1 - age]   # the oldest version the step used (v = step when a = 0)
        st = staleness_diagnostics(step, [v], {step: beta, v: old},
                                   lambda u: gv_t if u == step else self._val_grad(old), gsq)
        diag.update({k: st[k] for k in ("disp_max", "L_hat_max", "corr_min") if k in st})
        ratio = st.get("lhat_ratio", 0.0)
        diag["lhat_ratio"] = ratio
        act = actuate(self.rule, self.actuator, self.rule.observe(step, ratio, vloss))
        self.diag_seconds += time.thread_time() - t0
        diag["diag_seconds"] = self.diag_seconds
        with self.lock:
            self.pending.append({"diag": diag, "action": None if act is None else act.as_dict()})

    def on_record(self, rec) -> None:
        with self.lock:
            pend, self.pending = self.pending, []
        if pend:
            rec.extra["diag"] = [p["diag"] for p in pend]
            acts = [p["action"] for p in pend if p["action"]]
            if acts:
                rec.extra["control"] = acts
        rec.extra["control_level"] = self.rule.level
        if self.opt is not None:
            rec.extra["lr"] = float(self.opt.param_groups[0]["lr"])
        if self.writer is not None:
            self.writer.write(rec)
        if self.chain is not None:
            self.chain(rec)
