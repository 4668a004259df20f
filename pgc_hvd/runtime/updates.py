"""Update application: a decided update into ``p.grad``, in each parameter's dtype.

Owns what turns the agent's decoded update g_hat (an fp32 d-vector) into the gradient the
user's optimizer rule applies: the ``on_update`` callback (two or three arguments, decided once
from its signature), Horovod's ``op`` factor (``hvd.Sum``: n g_hat), the per-parameter buffers
of fp16/bf16/fp64 parameters, the user's rule applied to it (:meth:`UpdateApplier.apply`: a
GradScaler's ``grad_scale`` / ``found_inf`` kept away from it, the staleness-aware momentum
correction around it) and the running digest of the hyper-parameters each update was applied
with (compared across ranks at ``close()``). The step and the update are arguments.

Runs on the training thread. May import: ``flat_layout``, ``control.momentum``,
``runtime.config`` and torch.
"""

from __future__ import annotations

import zlib

import torch

from pgc_hvd.control.momentum import compensated
from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime.config import takes_three


def hyper_digest(param_groups, prev: int) -> int:
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


class UpdateApplier:
    """Puts decided updates into ``p.grad`` (module doc)."""

    def __init__(self, layout: FlatLayout, *, op_scale: float = 1.0, on_update=None):
        self.layout = layout
        self.op_scale = float(op_scale)
        self.on_update = on_update
        # on_update(step, flat) (original form) or on_update(step, flat, decision): decided once
        self._with_decision = on_update is not None and takes_three(on_update)
        self._bufs: dict = {}          # param id -> update buffer in the parameter's dtype
        #: running digest of the hyper-parameters of every applied update (:func:`hyper_digest`)
        self.hyper_digest = 0
        #: the last update loaded (its decision and info), None before the first
        self.last = None

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

    def load(self, step: int, update) -> None:
        """Put ``update`` (an :class:`~pgc_hvd.runtime.agent.Update`, step ``step``) into
        ``p.grad``: fp32 parameters get views of the decoded vector, others (fp16, bf16, fp64) a
        cast copy in a buffer kept per parameter; ``op=hvd.Sum`` multiplies it by n.
        ``on_update`` sees it first."""
        self.last = update
        flat = update.flat
        if self.on_update is not None:
            if self._with_decision:
                self.on_update(step, flat, update.decision)
            else:
                self.on_update(step, flat)
        if self.op_scale != 1.0:
            flat.mul_(self.op_scale)
        bufs = self._bufs
        for p, v in self.layout.views(flat):
            if p.dtype != v.dtype:
                buf = bufs.get(id(p))
                if buf is None:
                    buf = bufs[id(p)] = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                buf.copy_(v)
                v = buf
            p.grad = v

    def apply(self, rule, param_groups, owner: dict, *, correct_momentum: bool) -> None:
        """The user's rule (``rule()``, the wrapped class's ``step``) on the loaded update, then
        :meth:`applied`. A GradScaler's ``grad_scale`` / ``found_inf`` in ``owner`` (the
        optimizer's ``__dict__``) are this optimizer's (the ring was unscaled), not the rule's:
        torch's SGD/Adam would apply them to the decoded update, so they are set aside while it
        runs. With ``correct_momentum`` the rule runs with the user's momentum less the stale
        gradients' implicit momentum (:mod:`pgc_hvd.control.momentum`)."""
        amp = {k: owner.pop(k) for k in ("grad_scale", "found_inf") if k in owner}
        last = self.last
        mean_age = last.decision.info.get("mean_age") if last is not None else None
        try:
            with compensated(param_groups, mean_age, correct_momentum):
                rule()
        finally:
            owner.update(amp)
        self.applied(param_groups)

    def applied(self, param_groups) -> None:
        """An update was applied with these hyper-parameters: clear p.grad, extend the digest."""
        for p in self.layout.params:
            p.grad = None
        self.hyper_digest = hyper_digest(param_groups, self.hyper_digest)
