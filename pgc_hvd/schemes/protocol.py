"""The scheme protocol: the contract between a scheme and the engines that drive it.

A *scheme* decides, for n workers, n data partitions D_0..D_{n-1} and a
straggler budget s, (1) what every worker computes at step t and how it
encodes it, and (2) when step t may fire and with which weights the received
messages are combined. It knows nothing about time or transport. Two engines
drive the same scheme objects: the single-process simulator (virtual time) and
the Horovod runtime (one worker per rank).

Worker side: :meth:`Scheme.work_plan` ``(worker, step) -> WorkPlan``
----------------------------------------------------------------------
Every worker keeps a *ring* of ``plan.ring_size`` gradient slots (one flat
buffer each). At step t it

1. evaluates the gradient of partition ``p`` at the current model into slot
   ``slot`` for every ``(p, slot)`` in ``plan.evaluate`` (one pair for pipelined
   schemes at t >= 1; every slot at warm-up step 0 and for plain GC);
2. forms its coded message ``sum(coef * ring[slot] for slot, coef in plan.combine)``
   (coefficients are python floats, or complex for ``rs``);
3. sends ``Arrival(worker, step=t, version=<model version used>, message=...)``.

``plan.message_partitions`` lists the (partition, coefficient) pairs the
message stands for, ``plan.slot_partitions[slot]`` the partition a slot holds.
Pipelined schemes (PGC): worker j rotates through its support; at step t >= 1
it evaluates partition ``support[(t-1) mod L_j]`` into slot ``(t-1) mod L_j``,
so slot l always holds the newest evaluation of ``support[l]`` (a straggler
that skipped steps simply leaves older evaluations in its ring).

Master side: :meth:`Scheme.open_round` ``(step) -> Round``
-----------------------------------------------------------
For every step the engine opens one :class:`Round` and offers arrivals to it
in the order they arrived (order matters: first n-s, first complete class).
``Round.offer(arrival)`` returns ``None`` ("keep waiting") or, exactly once, a
:class:`Decision` ("fire now with these weights"). ``Round.poll()`` asks the
same without a new arrival (bounded staleness may fire from its table alone).

* The decision is a deterministic function of the *sequence* of arrivals'
  ``(worker, step, version, error_norm, slot_versions)``; it never looks at
  message contents. The Horovod runtime can therefore agree on the ready
  ranks in its control phase (messages may be ``None`` there), let every rank
  compute the same decision, then move only the chosen messages.
* Arrivals for an older step (late stragglers) may be offered to a later
  round: exact and pipelined schemes ignore them, bounded staleness updates
  its table with them. Arrivals for a future step raise ``ValueError``.
* Schemes are state machines: bounded staleness keeps its table across
  rounds, so every rank must own one scheme object and feed it the same
  sequence. Open rounds in increasing step order.

:class:`Decision` (:mod:`pgc_hvd.schemes.decision`: frozen, JSON-serialisable) holds ``uses``,
one :class:`Use` ``(worker, step, version, weight)`` per message used, and ``info``, a flat dict
for the step record; ``Decision.combine(messages)`` returns the estimate of the average
gradient, and ``Round.combine(decision)`` does the same from the messages the round (and, for
bounded staleness, the table) has seen.

One step, in an engine::

    scheme = get_scheme("pgc-cr", n=12, s=2)
    rnd = scheme.open_round(t)
    for worker in arrival_order:                    # whatever the engine's clock says
        plan = scheme.work_plan(worker, t)          # what that worker computed
        decision = rnd.offer(Arrival(worker, t, version=t, message=msg[worker]))
        if decision is not None:
            update = decision.combine(rnd.messages)  # or after an allgather
            break

The round type shared by several schemes: :class:`FirstKRound` (at the end of this module)
waits for the first k arrivals; the first-complete-group round of the binary class codes is
:mod:`pgc_hvd.schemes.coded`'s. The checks asked before or at construction (the straggler
budget s, the minimum-error decoder's precondition) are :class:`~pgc_hvd.schemes.validation.
SchemeChecks`', the base class of :class:`Scheme`.

The worker side (at the very end): one worker's ring of gradient slots, as every engine keeps
it (:class:`Ring`). Slot l holds the newest evaluation of ``plan.slot_partitions[l]`` and the
model version v_l it was evaluated at (-1: never); the message's entries have ages t - v_l
(:meth:`Ring.message_versions`, ``Arrival.slot_versions``). Unfilled-slot rule: a slot the
message needs but that was never filled (a cancelled warm-up, a ring emptied by
:meth:`Ring.reset`) is evaluated at the current step with the plan's own pairs, so a message
never sums an empty slot. Plans are cached by :meth:`Scheme.plan_key` (the scheme says which
steps share a plan), and so are the message's coefficients (:class:`MessageForm`). The
simulator stores gradient rows in :attr:`Ring.slots`, the scheme tests vectors; the Horovod
runtime keeps its own flat buffers and uses the ring for versions and plans only.

May import: numpy, ``codes``, ``schemes.decision``, ``schemes.validation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from pgc_hvd.schemes.decision import Decision, Use
from pgc_hvd.schemes.validation import SchemeChecks


@dataclass(frozen=True)
class Arrival:
    """A message from ``worker`` produced by its work plan for ``step``.

    version:       model version (number of updates applied) it was computed at;
                   defaults to ``step``.
    message:       the coded message (numpy array, torch tensor, or None when only
                   deciding, e.g. in the runtime's control phase).
    error_norm:    ||C(g^_i) - g^_i||, the compression error (minimum-error decoder).
    slot_versions: model versions of the ring slots (pipelined schemes), for ages.
    """

    worker: int
    step: int
    version: Optional[int] = None
    message: Any = None
    error_norm: Optional[float] = None
    slot_versions: Optional[tuple[int, ...]] = None

    @property
    def model_version(self) -> int:
        return self.step if self.version is None else int(self.version)


@dataclass(frozen=True)
class WorkPlan:
    """What ``worker`` computes at ``step`` and how it forms its message.

    evaluate:        ((partition, slot), ...) gradients to evaluate now, into ring slots.
    combine:         ((slot, coefficient), ...): message = sum coefficient * ring[slot].
    slot_partitions: partition held by each slot (len = ring_size).
    """

    worker: int
    step: int
    evaluate: tuple[tuple[int, int], ...]
    combine: tuple[tuple[int, Any], ...]
    slot_partitions: tuple[int, ...]

    @property
    def ring_size(self) -> int:
        return len(self.slot_partitions)

    @property
    def partitions(self) -> tuple[int, ...]:
        """Partitions whose gradients are evaluated at this step."""
        return tuple(p for p, _ in self.evaluate)

    @property
    def message_partitions(self) -> tuple[tuple[int, Any], ...]:
        """(partition, coefficient) pairs the coded message stands for."""
        return tuple((self.slot_partitions[slot], coef) for slot, coef in self.combine)


def _scalar(x):
    """numpy scalar -> python float/complex (python scalars multiply torch tensors cleanly)."""
    real = isinstance(x, float) or not (isinstance(x, complex) or np.iscomplexobj(x))
    return float(x) if real else complex(x)   # a float asks no more (the usual weight)


class Round:
    """Decides one step from the arrivals offered to it (see module docstring).

    Subclasses implement :meth:`_on_arrival` (called once per new current-step
    worker) and optionally :meth:`_on_late` / :meth:`_check`.
    """

    def __init__(self, scheme: "Scheme", step: int):
        self.scheme = scheme
        self.step = int(step)
        self.arrived: list[int] = []
        self.arrivals: dict[int, Arrival] = {}
        self.messages: dict[tuple[int, int], Any] = {}
        self.decision: Optional[Decision] = None

    # -- engine API ---------------------------------------------------------
    def offer(self, arrival: Arrival) -> Optional[Decision]:
        if self.decision is not None:
            if arrival.step < self.step or arrival.worker in self.arrivals:
                return None
            # a message that arrived after the step fired: record it, decide nothing
            self._record(arrival)
            return None
        if arrival.step > self.step:
            raise ValueError(
                f"arrival for step {arrival.step} offered to the round of step {self.step}; "
                f"open round {arrival.step} first"
            )
        if not 0 <= arrival.worker < self.scheme.n:
            raise ValueError(f"worker {arrival.worker} not in [0, {self.scheme.n - 1}]")
        if arrival.step < self.step:
            return self._finish(self._on_late(arrival))
        if arrival.worker in self.arrivals:
            return None
        self._record(arrival)
        return self._finish(self._on_arrival(arrival))

    def poll(self) -> Optional[Decision]:
        if self.decision is not None:
            return None
        return self._finish(self._check())

    def combine(self, decision: Optional[Decision] = None):
        """Decoded update from the messages this round has seen."""
        decision = decision or self.decision
        if decision is None:
            raise ValueError("the round has not fired yet")
        return decision.combine(self._message_store())

    # -- subclass hooks -----------------------------------------------------
    def _on_arrival(self, arrival: Arrival) -> Optional[Decision]:  # pragma: no cover
        raise NotImplementedError

    def _on_late(self, arrival: Arrival) -> Optional[Decision]:
        return None

    def _check(self) -> Optional[Decision]:
        return None

    def _message_store(self) -> Mapping:
        return self.messages

    # -- helpers ------------------------------------------------------------
    def _record(self, arrival: Arrival) -> None:
        self.arrived.append(arrival.worker)
        self.arrivals[arrival.worker] = arrival
        if arrival.message is not None:
            self.messages[(arrival.worker, arrival.step)] = arrival.message

    def _finish(self, decision: Optional[Decision]) -> Optional[Decision]:
        if decision is not None:
            self.decision = decision
        return decision

    def decide(self, weights: Mapping[int, Any], extra: Optional[dict] = None,
               versions: Optional[Mapping[tuple[int, int], int]] = None,
               uses: Optional[Sequence[Use]] = None) -> Decision:
        """Build the Decision for current-step workers -> weights (or explicit ``uses``)."""
        sch = self.scheme
        if uses is None:
            uses = tuple(
                Use(w, self.step, self.arrivals[w].model_version, _scalar(x)) for w, x in weights.items()
            )
        info = dict(sch.effective_coefficients(uses))
        info.update(_ages(self.step, uses, self.arrivals, sch))
        info["n_used"] = len(uses)
        info["n_arrived"] = len(self.arrived)
        if extra:
            info.update(extra)
        return Decision(
            scheme=sch.name, step=self.step, uses=tuple(uses), arrived=tuple(self.arrived),
            real_part=sch.complex_messages, info=info,
        )


def _ages(step: int, uses: Sequence[Use], arrivals: Mapping[int, Arrival],
          scheme: Optional["Scheme"] = None) -> dict:
    """max and mean age of the entries the decision uses; the mean weighted by each entry's
    |coefficient| in its message when the scheme's coefficients depend on age
    (``Scheme.age_weighted``: PGC-CR with decay < 1), so that it is the mean age of the update."""
    ages, wts = [], []
    weighted = scheme is not None and scheme.age_weighted
    for u in uses:
        arr = arrivals.get(u.worker)
        if arr is not None and arr.step == u.step and arr.slot_versions:
            ages.extend(step - v for v in arr.slot_versions)
            if weighted:
                wts.extend(abs(c) for _, c in scheme.work_plan(u.worker, u.step).combine)
            else:
                wts.extend([1.0] * len(arr.slot_versions))
        else:
            ages.append(step - u.version)
            wts.append(1.0)
    if not ages:
        return {"max_age": 0, "mean_age": 0.0}
    tot = float(sum(wts))
    mean = sum(a * w for a, w in zip(ages, wts)) / tot if tot > 0 else 0.0
    return {"max_age": int(max(ages)), "mean_age": float(mean)}


class Scheme(SchemeChecks):
    """Base class of all schemes. Subclasses set the placement and the round type.

    What the engines (the simulator, the Horovod runtime) and the control rule ask a scheme is
    declared here, with the answer of a scheme that does not say otherwise:

    * ``name``, ``n``, ``s``; ``code`` (the :class:`~pgc_hvd.codes.GradientCode` behind the
      placement, if any); ``exact`` (decodes sum_k g_k exactly when nothing is stale);
      ``pipelined`` (one partition per step into a ring of evaluations, PGC); ``complex_messages``.
    * worker side: :meth:`work_plan`, :meth:`plan_key` (steps with equal keys have equal plans:
      the cache key of :class:`~pgc_hvd.schemes.protocol.Ring`), :attr:`ring_depth`.
    * late messages: :attr:`late_usable` (a message for a step that has fired may still be
      used by a later decision) and :meth:`retained` (the messages a later decision may use:
      an engine keeps those and may drop the rest).
    * staleness: :attr:`staleness_bound` (the bound c on the age t - v of the entries a
      decision uses, None when the scheme has none), :attr:`staleness_bound_adjustable`
      (whether it may be lowered during training: the control rule's knob "c"),
      ``uses_stale_gradients`` (a class attribute: whether decisions can use gradients of an
      older model than their step's -- the pipelined schemes' rings, bounded staleness' table;
      the control rule runs only then), :attr:`lookback`.
    * decoding: :attr:`needs_error_norms` (the decoder reads every arrival's compression error
      ||C(g^_i) - g^_i||) and its precondition, :meth:`check_error_norms`; :meth:`can_fire`
      (whether an open round can still fire); a decision's diagnostics
      (:meth:`effective_coefficients`) read each used message's nonzero coefficients,
      :meth:`message_entries`, cached per :meth:`message_key`.
    * the straggler budget s, before a scheme is built (class methods): its default,
      :meth:`default_stragglers`, and its check, :meth:`check_stragglers` (``waits_for_all``:
      every step waits for all n workers, so s = 0 only); :meth:`setting_stragglers`, the s a
      scheme runs with in an experiment setting of budget s.

    The papers' ``c`` is one of three things here, each under its own name: the ring depth
    (PGC, c = s + 1), the staleness bound (bounded staleness) and IS-GC's partitions per worker
    (its option ``c``, the length of every support).
    """

    name = "scheme"
    exact = True
    pipelined = False
    complex_messages = False
    late_usable = False
    staleness_bound: Optional[int] = None
    staleness_bound_adjustable = False
    uses_stale_gradients = False
    age_weighted = False
    round_type: type = Round
    #: every step waits for all n workers, so the scheme tolerates no straggler: s = 0 only
    waits_for_all = False

    def __init__(self, n: int, s: int):
        self.s = self.check_stragglers(s, n)    # the one check of s (and n), at construction
        self.n = int(n)
        self._entry_cache: dict = {}   # message_key -> message_entries
        self._entries: dict = {}       # the distinct message_entries
        self._coef_cache: dict = {}    # (entries, weight) per use -> effective_coefficients

    @property
    def wait_for(self) -> int:
        """n - s: how many ranks' messages a step waits for (n for dgd, whose s is 0), the one
        place it is written."""
        return self.n - self.s

    # -- worker side --------------------------------------------------------
    def supports(self) -> list[list[int]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def slot_coefficients(self, worker: int) -> tuple:
        """Coefficient of every ring slot in the coded message (default 1)."""
        return (1.0,) * len(self.supports()[worker])

    def work_plan(self, worker: int, step: int) -> WorkPlan:
        S = self.supports()[worker]
        L = len(S)
        if self.pipelined and step > 0:
            slot = (step - 1) % L
            evaluate = ((S[slot], slot),)
        else:
            evaluate = tuple((p, l) for l, p in enumerate(S))
        coefs = self.slot_coefficients(worker)
        return WorkPlan(worker, int(step), evaluate, tuple(enumerate(coefs)), tuple(S))

    def plan_key(self, worker: int, step: int):
        """A key such that ``work_plan(worker, t)`` and ``work_plan(worker, t')`` differ only in
        their step when ``plan_key(worker, t) == plan_key(worker, t')``. This class's plan
        depends on t only through t = 0 (warm-up: every slot) and, when pipelined, the slot
        (t - 1) mod L_j it rotates to; a subclass that overrides :meth:`work_plan` overrides
        this too."""
        if step == 0 or not self.pipelined:
            return (worker, 0)
        return (worker, 1 + (step - 1) % len(self.supports()[worker]))

    def message_key(self, worker: int, step: int):
        """Equal keys at steps t, t' mean equal ``work_plan(worker, .).message_partitions``: the
        worker for this class's plan (its ring's sum, whatever the step), else the plan key (a
        subclass that overrides :meth:`work_plan` overrides this when it knows better)."""
        if type(self).work_plan is Scheme.work_plan:
            return worker
        return self.plan_key(worker, step)

    @property
    def ring_depth(self) -> int:
        """L = max_j L_j, the most ring slots a worker keeps (``work_plan(j, t).ring_size``):
        |S_j| for the coded schemes, c = s + 1 for PGC."""
        return max(len(S) for S in self.supports())

    # -- late messages and staleness ------------------------------------------
    def retained(self) -> set:
        """(worker, step) of every message a later decision may still use (none here; bounded
        staleness: the messages in its table). Engines keep these and may drop the others once
        their step has fired."""
        return set()

    @property
    def lookback(self) -> int:
        """h = max(:attr:`ring_depth`, :attr:`staleness_bound`): how many steps back a
        message's entries reach (ring slots refreshed every ring_depth steps; table entries of
        age < staleness_bound). The engines size a control row's slot versions by h at
        construction and keep a message for h steps."""
        return max(self.ring_depth, self.staleness_bound or 1)

    def can_fire(self, rnd: "Round", pending) -> bool:
        """Whether ``rnd``, open and not fired, can still fire when the workers in ``pending``
        are the only ones that may still send a message for its step (the others arrived, sent
        a non-finite message or finished): here, while anyone is pending."""
        return bool(pending)

    # -- master side --------------------------------------------------------
    def open_round(self, step: int) -> Round:
        return self.round_type(self, step)

    def decide(self, step: int, arrivals: Sequence[Arrival]) -> Optional[Decision]:
        """Feed ``arrivals`` in order to a fresh round; the decision, or None."""
        rnd = self.open_round(step)
        for arr in arrivals:
            d = rnd.offer(arr)
            if d is not None:
                return d
        return rnd.poll()

    def full_round_weights(self) -> Optional[dict]:
        """worker -> weight of the decision that every step takes when it waits for all n
        workers (``wait_for == n``, no late message usable) and uses each one's message of
        the step, whatever their order: known before any arrival (the runtime's s = 0 path
        sums with it, ``runtime/sum_rows.py``); None for any other scheme."""
        if self.wait_for != self.n or self.late_usable:
            return None
        full = [(w, 1) for w in range(self.n)]
        got = [self.decide(1, [Arrival(w, 1, error_norm=0.0) for w in ws])
               for ws in (range(self.n), range(self.n - 1, -1, -1))]
        if any(g is None or sorted((u.worker, u.step) for u in g.uses) != full for g in got):
            return None
        weights = [{u.worker: u.weight for u in g.uses} for g in got]
        return weights[0] if weights[0] == weights[1] else None

    # -- diagnostics --------------------------------------------------------
    def message_row(self, worker: int, step: int) -> np.ndarray:
        """Row of coefficients (over partitions) of worker's message at step: its
        :meth:`message_entries` over all n partitions (a new array; zero elsewhere)."""
        parts, vals = self.message_entries(worker, step)
        row = np.zeros(self.n, dtype=vals.dtype)
        row[parts] = vals
        return row

    def message_entries(self, worker: int, step: int) -> tuple:
        """The nonzero entries of :meth:`message_row`, ``(partitions, coefficients)`` arrays in
        partition order: O(L_j) to build and keep, not O(n) (cached per :meth:`message_key`;
        messages with the same entries share them)."""
        key = self.message_key(worker, step)
        got = self._entry_cache.get(key)
        if got is None:
            mp = self.work_plan(worker, step).message_partitions
            parts = sorted({p for p, _ in mp})
            at = {p: i for i, p in enumerate(parts)}
            vals = np.zeros(len(parts), dtype=complex if self.complex_messages else float)
            for p, coef in mp:         # a partition named twice: its coefficients summed
                vals[at[p]] += coef
            keep = vals != 0
            got = (np.array(parts, dtype=np.int64)[keep], vals[keep])
            got = self._entry_cache[key] = self._entries.setdefault(
                (got[0].tobytes(), got[1].tobytes()), got)
        return got

    def effective_coefficients(self, uses: Sequence[Use]) -> dict:
        """alpha_{m,k} = n * weight_m * coef_{m,k} and per-partition sums (module doc), from the
        messages' nonzero coefficients (:meth:`message_entries`), cached by entries and weights
        (a decision's diagnostics cost a lookup while the uses repeat: every step of dgd)."""
        if not uses:
            return {}
        entries = [self.message_entries(u.worker, u.step) for u in uses]
        key = tuple((id(e), u.weight) for e, u in zip(entries, uses))   # entries are kept
        if key not in self._coef_cache:
            if len(self._coef_cache) >= 1024:
                self._coef_cache.clear()
            self._coef_cache[key] = self._coefficients(uses, entries)
        return dict(self._coef_cache[key])

    def _coefficients(self, uses: Sequence[Use], entries: list) -> dict:
        w = np.array([u.weight for u in uses])
        parts = np.concatenate([p for p, _ in entries])
        coefs = np.concatenate([c for _, c in entries])
        owner = np.repeat(np.arange(len(uses)), [len(p) for p, _ in entries])
        alpha = (self.n * w)[owner] * coefs
        alpha_r = alpha.real if np.iscomplexobj(alpha) else alpha
        per_partition = np.zeros(self.n, dtype=alpha_r.dtype)
        np.add.at(per_partition, parts, alpha_r)
        wr = w.real if np.iscomplexobj(w) else w
        return {
            "weight_min": float(wr.min()), "weight_max": float(wr.max()),
            "alpha_min": float(alpha_r.min()) if alpha.size else 0.0,
            "alpha_max": float(alpha_r.max()) if alpha.size else 0.0,
            "alpha_absmax": float(np.abs(alpha).max()) if alpha.size else 0.0,
            "partition_weight_min": float(per_partition.min()),
            "partition_weight_max": float(per_partition.max()),
            "decode_norm1": float(self.n * np.abs(w).sum()),
        }

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name} n={self.n} s={self.s} "
                f"ring_depth={self.ring_depth}>")


# ---- the round types shared by several schemes ------------------------------------------

class FirstKRound(Round):
    """Fires at the k-th distinct current-step arrival (k = ``scheme.wait_for``);
    the weights come from ``scheme.weights_for(first_k_workers, round)``."""

    def _on_arrival(self, arrival: Arrival) -> Optional[Decision]:
        if len(self.arrived) < self.scheme.wait_for:
            return None
        weights, extra = self.scheme.weights_for(list(self.arrived), self)
        return self.decide(weights, extra)


# ---- the worker side: one worker's ring of gradient slots ---------------------------------


@dataclass(frozen=True)
class MessageForm:
    """How the coded message is formed from the ring: ``sum(coefs[i] * ring[slots[i]])``.

    ``complex``: some coefficient is complex (RS); ``float_coefs``: the coefficients as python
    floats when none is (what the compiled kernels take), else None."""

    slots: tuple[int, ...]
    coefs: tuple[Any, ...]
    complex: bool
    float_coefs: Optional[tuple[float, ...]]

    @classmethod
    def of(cls, plan: WorkPlan) -> "MessageForm":
        coefs = tuple(c for _, c in plan.combine)
        cplx = any(isinstance(c, complex) for c in coefs)
        return cls(tuple(slot for slot, _ in plan.combine), coefs, cplx,
                   None if cplx else tuple(float(c) for c in coefs))


class Ring:
    """Worker ``worker``'s ring for ``scheme`` (module doc): :attr:`slots`, :attr:`versions`,
    :attr:`size`, whether its message is :attr:`complex`."""

    def __init__(self, scheme: Scheme, worker: int):
        self.scheme = scheme
        self.worker = int(worker)
        plan0 = scheme.work_plan(self.worker, 0)
        self.size = plan0.ring_size
        self.complex = MessageForm.of(plan0).complex
        self.slots: list = [None] * self.size
        self.versions: list[int] = [-1] * self.size
        self.unfilled = self.size           # slots never filled (version -1)
        self._plans: dict = {}
        self._forms: dict = {}

    def plan(self, step: int) -> WorkPlan:
        """The scheme's work plan for this worker at ``step``, with every unfilled slot the
        message needs added to ``evaluate`` (module doc)."""
        key = self.scheme.plan_key(self.worker, step)
        hit = self._plans.get(key)
        if hit is None:
            p = self.scheme.work_plan(self.worker, step)
            hit = (p.evaluate, p.combine, p.slot_partitions)
            self._plans[key] = hit
        evaluate, combine, slot_partitions = hit
        if self.unfilled:
            done = {slot for _, slot in evaluate}
            extra = []
            for slot, _ in combine:
                if self.versions[slot] < 0 and slot not in done:
                    extra.append((slot_partitions[slot], slot))
                    done.add(slot)
            if extra:
                evaluate = evaluate + tuple(extra)
        return WorkPlan(self.worker, int(step), evaluate, combine, slot_partitions)

    def form(self, plan: WorkPlan) -> MessageForm:
        """The coefficients of ``plan``'s message (cached)."""
        form = self._forms.get(plan.combine)
        if form is None:
            form = self._forms[plan.combine] = MessageForm.of(plan)
        return form

    def fill(self, slot: int, version: int, value: Any = None) -> None:
        """Slot ``slot`` now holds an evaluation at model ``version`` (``value``: its content,
        for engines that keep it here)."""
        if self.versions[slot] < 0:
            self.unfilled -= 1
        self.versions[slot] = int(version)
        self.slots[slot] = value

    def message_versions(self, plan: WorkPlan) -> tuple[int, ...]:
        """Model versions of the slots ``plan``'s message sums (``Arrival.slot_versions``)."""
        return tuple(self.versions[slot] for slot, _ in plan.combine)

    def reset(self) -> None:
        """Empty every slot: each is evaluated afresh at its first use."""
        self.restore([-1] * self.size)
        self.slots = [None] * self.size

    def restore(self, versions) -> None:
        """Set the slot versions (a restored checkpoint's)."""
        versions = [int(v) for v in versions]
        if len(versions) != self.size:
            raise ValueError(f"{len(versions)} slot versions for a ring of {self.size} slots")
        self.versions = versions
        self.unfilled = sum(1 for v in versions if v < 0)
