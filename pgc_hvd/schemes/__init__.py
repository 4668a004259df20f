"""Schemes: what every worker computes at step t, and when and how a step fires.

Protocol (full text in :mod:`pgc_hvd.schemes.protocol`, which engines code against):

* ``scheme = get_scheme(name, n, s, **options)`` for ``dgd, is-sgd, gc-fr, gc-cr,
  is-gc, pgc-fr, pgc-cr, pgc-cr-naive, bcgc, gfrc, gmds, rs, pgc-bcgc,
  bounded-staleness`` (and ``cyclic-mds``).
* Worker side: ``plan = scheme.work_plan(worker, step)`` -> :class:`WorkPlan`:
  ``plan.evaluate`` = ((partition, slot), ...) gradients to evaluate into ring
  slots, ``plan.combine`` = ((slot, coefficient), ...) to form the coded message
  from the ring (``plan.ring_size`` slots; step 0 is the pipeline warm-up). Every engine keeps
  a worker's ring in a :class:`Ring` (:mod:`pgc_hvd.schemes.protocol`: slot versions, the
  unfilled-slot rule, plans cached by ``scheme.plan_key``).
* Master side: ``rnd = scheme.open_round(step)``; offer arrivals in arrival order,
  ``decision = rnd.offer(Arrival(worker, step, version, message))`` -> ``None``
  (keep waiting) or a :class:`Decision` (fire now): ``decision.uses`` =
  (worker, step, version, weight) per message used, ``decision.info`` = record
  fields (ages, decode weight extremes alpha_min/max, ||a||_1, residual, ...),
  ``decision.combine(messages)`` = sum weight * message, the estimate of the
  average gradient (1/n) sum_k g_k. Decisions depend only on the order and
  metadata of the arrivals, never on message contents, so every Horovod rank
  computes the same decision from the same control-phase information.
* What else the engines and the control rule ask a scheme (late messages, staleness bound,
  error norms, whether a round can still fire) is declared on :class:`Scheme`.
"""

from .decision import Decision, Use, weighted_sum
from .protocol import Arrival, MessageForm, Ring, Round, Scheme, WorkPlan
from .registry import (SCHEMES, default_stragglers, get_scheme, scheme_class, setting_stragglers,
                       stragglers_for)

__all__ = ["get_scheme", "default_stragglers", "stragglers_for", "setting_stragglers",
           "scheme_class", "SCHEMES", "Scheme", "Round", "Arrival", "Decision", "Use", "WorkPlan",
           "weighted_sum", "Ring", "MessageForm"]
