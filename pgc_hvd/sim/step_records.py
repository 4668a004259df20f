"""What a simulated step records: busy seconds, staleness diagnostics and the error split.

Owns the pure parts of a step's :class:`~pgc_hvd.metrics.records.StepRecord` that the engine
(:mod:`pgc_hvd.sim.engine`) fills in when a step fires: :func:`busy_seconds` (each worker's
compute in the interval since the last update, trimming the intervals it has counted) and
:func:`diagnostics` (:mod:`pgc_hvd.metrics.diagnostics` of the update: staleness over the
versions of every ring slot of every message used, and the error decomposition). They read
the engine's store of messages and its model snapshots, passed in; they keep no state.

May import: ``metrics``, ``schemes`` (layers 1-2); never the engine.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from pgc_hvd.metrics.diagnostics import error_decomposition, staleness_diagnostics


def busy_seconds(workers, since: float, t: float) -> list[float]:
    """Busy seconds of each worker in (since, t]; intervals that ended by t are dropped."""
    busy = []
    for w in workers:
        ivs = list(w.intervals)
        if w.job is not None:
            ivs.append((w.job.start, w.job.end))
        busy.append(sum(max(0.0, min(e, t) - max(s, since)) for s, e in ivs))
        w.intervals = [(s, e) for s, e in w.intervals if e > t]
    return busy


def diagnostics(decision, g_hat: torch.Tensor, store: Mapping, scheme, snapshots: Mapping,
                val_grad: Callable, grads_at: Callable) -> dict:
    """:mod:`pgc_hvd.metrics.diagnostics` of this step's update ``g_hat``: staleness over the
    versions of every ring slot of every message used (``store[(worker, step)]["arrival"]``),
    and the error decomposition against the partition gradients ``grads_at(step)``."""
    versions: list[int] = []
    for u in decision.uses:
        arr = store[(u.worker, u.step)]["arrival"]
        versions.extend(arr.slot_versions or (u.version,))
    out: dict = {"g_hat_sq": float(g_hat.double().pow(2).sum())}
    out.update(staleness_diagnostics(decision.step, versions, snapshots, val_grad,
                                     out["g_hat_sq"]))
    rows = np.stack([scheme.message_row(u.worker, u.step) for u in decision.uses])
    out.update(error_decomposition(
        g_hat, grads_at(decision.step), rows, [u.weight for u in decision.uses],
        [store[(u.worker, u.step)]["dense"] for u in decision.uses]))
    return out
