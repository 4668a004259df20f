"""A round's answer: the :class:`Decision` ("fire now: these messages, with these weights").

:class:`Decision` (frozen, JSON-serialisable through ``to_dict``) holds
``uses`` -- one :class:`Use` ``(worker, step, version, weight)`` per message
used, weights already including the 1/n of the average -- and ``info``, a
flat dict for the step record: ``n_used``, ``weight_min/max``, effective decode
coefficients ``alpha_min/max`` (alpha_{m,k} = n * weight_m * coef_{m,k}, the
weight with which partition k's gradient in message m enters the estimate
of sum_k g_k), per-partition totals ``partition_weight_min/max``
(sum_m alpha_{m,k}: 1 for exact schemes), ``decode_norm1`` (sum_m n|weight_m|),
gradient ages (``max_age``, ``mean_age``), and scheme-specific entries
(``group``, ``residual``).

``Decision.combine(messages)`` returns sum_m weight_m * message_m, the estimate
of the average gradient (1/n) sum_k g_k; ``messages`` maps ``(worker, step)``
(or just ``worker``) to numpy arrays or torch tensors -- the scheme only
multiplies them by python scalars and adds them, and keeps the real part for
complex codes. ``Round.combine(decision)`` does the same from the messages the
round (and, for bounded staleness, the table) has seen.

Decisions are built by :meth:`pgc_hvd.schemes.protocol.Round.decide` (the dataclasses'
generated constructors: no function of this module runs in a runtime step) and read by every
engine: the runtime's data plane takes ``uses``, the records take ``info`` (``to_dict``), the
simulator and the scheme tests ``combine`` the messages they hold. Here since issue 46 (from
``protocol.py``).

May import: numpy, ``dataclasses``, ``typing``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class Use:
    """One message used by a decision, with its weight in the averaged update."""

    worker: int
    step: int
    version: int
    weight: Any  # float, or complex for complex codes


def weighted_sum(terms, real_part: bool = False):
    """sum weight * message over (weight, message) pairs, for numpy arrays or torch tensors."""
    acc = None
    for w, m in terms:
        term = m * w
        acc = term if acc is None else acc + term
    if acc is not None and real_part:
        acc = acc.real
    return acc


@dataclass(frozen=True)
class Decision:
    """The scheme's answer "fire now": which messages, with which weights."""

    scheme: str
    step: int
    uses: tuple[Use, ...]
    arrived: tuple[int, ...]
    real_part: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(u.worker for u in self.uses)

    @property
    def weights(self) -> dict[int, Any]:
        """worker -> weight (uses of the current step only; bounded staleness may
        use older messages, see ``uses``)."""
        return {u.worker: u.weight for u in self.uses if u.step == self.step}

    def combine(self, messages: Mapping):
        """sum_m weight_m * message_m; ``messages`` keyed by (worker, step) or by worker."""
        def get(u: Use):
            key = (u.worker, u.step)
            if key in messages:
                return messages[key]
            return messages[u.worker]
        return weighted_sum(((u.weight, get(u)) for u in self.uses), self.real_part)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["uses"] = [
            {**asdict(u), "weight": _json_scalar(u.weight)} for u in self.uses
        ]
        d["info"] = {k: _json_scalar(v) for k, v in self.info.items()}
        d["arrived"] = list(self.arrived)
        return d


def _json_scalar(v):
    if isinstance(v, complex):
        return [v.real, v.imag]
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v


__all__ = ["Decision", "Use", "weighted_sum"]
