"""The control rule in the Horovod runtime, through its public hooks only.

    ctl = AdaptiveController(model, task.loss, (x_val, y_val), ControlConfig(every=5), max_age=1,
                             writer=RecordWriter(out / "records.jsonl"))
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(...), model.named_parameters(),
                                       scheme="pgc-cr", stragglers=1, records=None,
                                       on_update=ctl.on_update, on_record=ctl.on_record)
    ctl.attach(opt)

* ``on_update(step, g_hat)`` runs on every rank's training thread before the update is applied
  (model = beta_t): the controller keeps the last ``max_age + 1`` parameter vectors, and every K
  steps computes ||g_hat||^2, the displacement ||beta_t - beta_{t-a}||^2 to the oldest version a
  step may use (a = ``max_age``: c - 1 for PGC and bounded staleness; the runtime's on_update
  does not pass the decision's versions, so the bound is used), the stale/current correlation
  and L_hat on a fixed validation batch (gradients through ``torch.func.functional_call`` on
  copies, so the optimizer's gradient hooks never see them), and feeds rho to the rule; a change
  sets ``param_groups[*]["lr"]``. Every rank computes the same numbers from the same parameters
  (the runtime keeps them identical), so every rank takes the same decision without a collective.
* ``on_record(rec)`` (rank 0) adds the diagnostics and actions computed since the last record to
  ``rec.extra`` (``diag``, ``control``, ``control_level``, ``lr``) and writes it with ``writer``:
  pass ``records=None`` to the optimizer so the records are written once, with these fields.

Knob: lr only. Lowering c at run time needs a rebuild of the optimizer with another
``scheme_options={"c": ...}`` (bounded staleness), which the runtime has no hook for yet.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Optional

import torch

from .rule import ControlConfig, ControlRule, LrActuator

EPS = 1e-12


class AdaptiveController:
    def __init__(self, model: torch.nn.Module, loss_fn: Callable, val_batch, config: Optional[ControlConfig] = None,
                 max_age: int = 1, writer=None, on_record: Optional[Callable] = None):
        self.model, self.loss_fn = model, loss_fn
        self.val_batch = val_batch
        self.cfg = config or ControlConfig()
        self.rule = ControlRule(self.cfg)
        self.max_age = max(1, int(max_age))
        self.writer, self.chain = writer, on_record
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.snaps: deque = deque(maxlen=self.max_age + 1)
        self.pending: list[dict] = []
        self.lock = threading.Lock()
        self.actuator: Optional[LrActuator] = None
        self.diag_seconds = 0.0

    def attach(self, optimizer) -> "AdaptiveController":
        self.actuator = LrActuator(optimizer, self.cfg.factor)
        return self

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for n, p in self.model.named_parameters()
                          if p.requires_grad]).clone()

    def _val_grad(self, flat: torch.Tensor) -> torch.Tensor:
        params, off = {}, 0
        for n, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            k = p.numel()
            params[n] = flat[off:off + k].view_as(p).clone().requires_grad_(True)
            off += k
        x, y = self.val_batch
        out = torch.func.functional_call(self.model, params, (x,))
        grads = torch.autograd.grad(self.loss_fn(out, y), list(params.values()))
        return torch.cat([g.reshape(-1) for g in grads])

    def on_update(self, step: int, g_hat: torch.Tensor) -> None:
        beta = self._flat()
        self.snaps.append((step, beta))
        if step % max(1, self.cfg.every) or len(self.snaps) <= self.max_age:
            return
        t0 = time.thread_time()
        _, old = self.snaps[0]
        gsq = float(g_hat.double().pow(2).sum())
        db = beta - old
        dn = float(db.double().norm())
        gv_t, gv_o = self._val_grad(beta), self._val_grad(old)
        den = float(gv_t.double().norm() * gv_o.double().norm())
        lhat = float((gv_t - gv_o).double().norm()) / (dn + EPS)
        ratio = lhat ** 2 * dn ** 2 / max(gsq, EPS)
        diag = {"step": step, "g_hat_sq": gsq, "disp_max": dn ** 2, "L_hat_max": lhat,
                "corr_min": float(gv_t.double() @ gv_o.double()) / den if den > 0 else 1.0,
                "lhat_ratio": ratio, "age_bound": self.max_age}
        act = self.rule.observe(step, ratio)
        if act is not None and self.actuator is not None:
            act.knob = "lr"
            act.old, act.new = self.actuator.set_level(self.rule.level)
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
        if self.actuator is not None:
            rec.extra["lr"] = self.actuator.value()
        if self.writer is not None:
            self.writer.write(rec)
        if self.chain is not None:
            self.chain(rec)
