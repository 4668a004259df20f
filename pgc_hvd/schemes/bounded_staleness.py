"""Pipelined bounded-staleness gradient coding (docs/control.md).

n shards D_0..D_{n-1}, r replicas of each: worker j holds shards
{j, j+1, ..., j+r-1} mod n and, at its step t, evaluates one of them,
shard (j + t mod r) mod n -- so each step every shard is evaluated by exactly
one worker. The master keeps a table of the newest gradient of every shard i
and the model version v_i it was computed at (an arrival replaces an entry only
if its version is newer). Step t fires as soon as every shard has an entry
with age 0 <= t - v_i < c; the update is the mean of the table,

    g^(t) = sum_i w_i g_i^{(v_i)},   w_i = 1/n, or w_i = |D_i| / sum_k |D_k| (``shard_sizes``).

Late arrivals (from earlier steps) still refresh the table. Without staleness
(every shard fresh) the update is the exact average gradient.

Replays and the remedy (``replay``, ``min_fresh``; docs/control.md "Bounded staleness: each
gradient counted once"). The note's rule above applies the whole table at every step, so an
entry that is not refreshed enters up to c consecutive updates: a *replay*, and nothing limits
how many steps fire from one table (after a step the next round is polled and fires at once
while every entry is younger than c). The gradient g_i^{(v)} then enters sum_t w_i = u_i w_i
in total, u_i <= c its number of uses -- an lr amplified by up to c on the slow workers'
shards (measured: 1.45 / 2.42 / 4.73 uses per gradient at c = 2 / 4 / 8 under the note's
delays, 5% / 44% / 73% of the steps pure replays), which with the user's momentum 0.9 does not
learn (docs/experiments.md section 5). ``replay="once"`` counts every gradient once, at its
first use, and lets a step fire only on enough new gradients:

    g^(t) = sum_{i in F_t} w_i rho^{a_i} g_i^{(v_i)},   F_t = the entries no earlier step used,

and step t fires when every shard has an entry of age a_i = t - v_i < c (the note's coverage
rule, unchanged) *and* |F_t| >= m (``min_fresh``, default n - s: the update never waits for
the s slowest workers, and a late gradient of theirs still enters the next one). Each
gradient's total weight over its uses is w_i rho^a <= w_i (rho = ``decay``, default 1: w_i
exactly): the update is asynchronous SGD whose delays are bounded by c - 1, with every shard's
newest gradient at most c - 1 versions old at every step. Why m = n - s: with m = 1 (a step per
new gradient) the versions advance at every arrival, so a gradient is applied a_i ~ 1.2 / 2.6
versions late at c = 4 / 8 and at the user's gain lr / (1 - beta) that delay alone still fails
(0.22 / 0.10 accuracy against DGD's 0.30); waiting for n - s new ones keeps the mean age at
0.02 and reaches 0.39 at every c (``benchmarks/control/staleness_mechanism.py``).

Firing on the current model, the mean of the new entries (``fire``, ``normalize``; what both
engines build by default since issue 35's second pass). With ``fire="new"`` (the constructor's
default) the m new entries may include late gradients of the previous models, so after one late
arrival the next step fires on fewer gradients of its own model, leaving more of them late:
the steps cascade into mean age 0.3-0.4 and, at n = 4, 1.3-1.6x DGD's steps (digits CNN,
``benchmarks/control/long_straggler_pgc.py``). ``fire="current"`` counts only the entries of age 0
towards m (the step waits for n - s gradients of the model it updates, never for the s
slowest) and still folds in the late ones, once; ``normalize=True`` divides the step's weights
by their sum, so the update is the mean of its new gradients (a step of full length, as sync
SGD's, where the plain sum carries |F_t| / n <= 1 of it). Both: 111 / 106 steps against DGD's
106 (log-normal + long stragglers / exponential, median of 3 seeds, n = 4). The records then
carry ``n_current`` (entries of age 0) and ``fresh_share`` (sum of w_i over F_t).

``replay="mean"`` (the constructor's default) is the note's rule (every entry, every step;
``min_fresh`` and ``decay`` then do nothing). Both engines build the scheme through
:func:`pgc_hvd.control.momentum.remedy_scheme_options`, which passes ``replay="once"``,
``fire="current"`` and ``normalize=True`` (the remedy, on by default;
``momentum_correction=False`` or an explicit ``replay`` is the off switch). The note's replays
win only on the convex softmax of docs/experiments.md section 3
(plain SGD: the table mean is SAG-like there); on MNIST-1D they fail with momentum 0.9 and
with plain SGD alike. Weightings kept for the comparison that chose the default:
``"age"`` (w_i / (1 + a_i) on every entry at every step: staleness-aware lr, eta / tau),
``"split"`` (w_i / c on every entry at every step: an entry's weight spread over the c uses it
can have, so its total is at most w_i) and ``"once-age"`` (counted once, weight
w_i / (1 + a_i)).

Options: ``r`` (replicas, default s+1, 1 <= r <= n), ``c`` (staleness bound,
default s+1, c >= 1), ``shard_sizes`` (n positive numbers), ``replay`` ("mean" default: the
note's; "once": the remedy, what both engines pass by default; "age", "split", "once-age"),
``min_fresh`` (m, default n - s), ``decay`` (rho in [0, 1], default 1), ``fire`` ("new"
default: m unused entries of any age; "current": m of age 0, the engines' default),
``normalize`` (False default: weights w_i; True: scaled to sum 1, the engines' default).
"""

from __future__ import annotations

import math
from typing import Optional

from .protocol import Arrival, Decision, Round, Scheme, Use
from .validation import check_positive_int


class _TableRound(Round):
    def _on_arrival(self, arrival: Arrival) -> Optional[Decision]:
        self.scheme._update_table(arrival)
        return self._check()

    def _on_late(self, arrival: Arrival) -> Optional[Decision]:
        self.scheme._update_table(arrival)
        return self._check()

    def _check(self) -> Optional[Decision]:
        sch = self.scheme
        t = self.step
        table = sch.table
        c = sch.staleness_bound
        if any(e is None or not 0 <= t - e[2] < c for e in table):
            return None
        ages = [t - e[2] for e in table]
        mode = sch.replay
        if mode == "mean":      # the design note's rule: every entry, every step
            uses = tuple(Use(e[0], e[1], e[2], sch.shard_weights[i]) for i, e in enumerate(table))
            return self.decide({}, {"table_max_age": max(ages)}, uses=uses)
        fresh = [i for i, e in enumerate(table) if (e[0], e[1]) not in sch.used]
        if mode in ("once", "once-age"):
            current = [i for i in fresh if ages[i] == 0]    # new gradients of this model
            # the entries this step counts toward min_fresh: those of the current model
            # (fire="current") or every entry not used yet (fire="new")
            counted = current if sch.fire == "current" else fresh
            if len(counted) < sch.min_fresh:
                return None         # wait for new gradients (never a pure replay)
            rho = sch.decay
            scale = (lambda a: rho ** a) if mode == "once" else (lambda a: 1.0 / (1.0 + a))
            weights = [sch.shard_weights[i] * scale(ages[i]) for i in fresh]
            share = sum(sch.shard_weights[i] for i in fresh)
            if sch.normalize:       # the mean of the new gradients: a step of full length
                total = sum(weights)
                weights = [w / total for w in weights] if total > 0 else weights
            uses = tuple(Use(table[i][0], table[i][1], table[i][2], w)
                         for i, w in zip(fresh, weights))
        elif mode == "age":
            uses = tuple(Use(e[0], e[1], e[2], sch.shard_weights[i] / (1.0 + ages[i]))
                         for i, e in enumerate(table))
        else:                   # "split"
            uses = tuple(Use(e[0], e[1], e[2], sch.shard_weights[i] / c)
                         for i, e in enumerate(table))
        sch.used.update((e[0], e[1]) for e in table)
        info = {"table_max_age": max(ages), "n_fresh": len(fresh),
                "replayed": len(table) - len(fresh),
                "weight_sum": float(sum(u.weight for u in uses))}
        if mode in ("once", "once-age") and (sch.normalize or sch.fire == "current"):
            info["n_current"] = len(current)    # new gradients of the model being updated
            info["fresh_share"] = float(share)  # sum of w_i over F_t (before normalizing)
        return self.decide({}, info, uses=uses)

    def _message_store(self):
        return self.scheme.table_messages


class BoundedStalenessScheme(Scheme):
    name = "bounded-staleness"
    exact = True
    pipelined = False
    late_usable = True                  # late arrivals refresh the table
    staleness_bound_adjustable = True   # the control rule may lower c between steps
    uses_stale_gradients = True         # table entries of age < c
    round_type = _TableRound

    REPLAY_MODES = ("once", "mean", "age", "split", "once-age")

    def __init__(self, n: int, s: int, r: Optional[int] = None, c: Optional[int] = None,
                 shard_sizes=None, replay: str = "mean", decay: Optional[float] = None,
                 min_fresh: Optional[int] = None, normalize: bool = False,
                 fire: str = "new"):
        super().__init__(n, s)        # checks s against n (check_stragglers)
        n, s = self.n, self.s
        self.r = check_positive_int(self.name, "r", s + 1 if r is None else r, 1, n,
                                    hint=f"use r in [1, {n}] replicas per shard, e.g. r=2")
        self.staleness_bound = check_positive_int(self.name, "c", s + 1 if c is None else c, 1,
                                          hint="c is the staleness bound t - v_i < c, e.g. c=2")
        if shard_sizes is None:
            self.shard_weights = [1.0 / n] * n
        else:
            if isinstance(shard_sizes, (str, bytes)):  # "1234" is not [1, 2, 3, 4]
                raise ValueError(f"{self.name}: shard_sizes needs {n} numbers, got the string "
                                 f"{shard_sizes!r}")
            sizes = [float(x) for x in shard_sizes]
            if len(sizes) != n or not all(math.isfinite(x) and x > 0 for x in sizes):
                raise ValueError(
                    f"{self.name}: shard_sizes needs {n} positive numbers (|D_i|), got {shard_sizes!r}; "
                    f"e.g. shard_sizes=[1]*{n}"
                )
            total = sum(sizes)
            self.shard_weights = [x / total for x in sizes]
        mode = str(replay).strip().lower()
        if mode in ("off", "table", "note"):
            mode = "mean"
        if mode not in self.REPLAY_MODES:
            raise ValueError(f"{self.name}: replay={replay!r}; use 'mean' (default: the design "
                             "note's table mean at every step), 'once' (each gradient counted "
                             "once, the engines' default), 'age', 'split' or 'once-age'")
        self.replay = mode
        rho = 1.0 if decay is None else float(decay)
        if not (math.isfinite(rho) and 0.0 <= rho <= 1.0):
            raise ValueError(f"{self.name}: decay={decay!r}; use a number in [0, 1] (the weight "
                             "rho^age of an entry at its one use; 1: none)")
        self.decay = rho
        if isinstance(normalize, str):
            key = normalize.strip().lower()
            if key not in ("true", "false", "1", "0", "on", "off"):
                raise ValueError(f"{self.name}: normalize={normalize!r}; use true (a step is the "
                                 "mean of its new gradients) or false (each weighs w_i)")
            normalize = key in ("true", "1", "on")
        if not isinstance(normalize, (bool, int)) or normalize not in (0, 1):
            raise ValueError(f"{self.name}: normalize={normalize!r}; use True or False")
        self.normalize = bool(normalize)
        self.fire = str(fire).strip().lower()
        if self.fire not in ("new", "current"):
            raise ValueError(f"{self.name}: fire={fire!r}; use 'current' (a step waits for "
                             "min_fresh gradients of the current model) or 'new' (for min_fresh "
                             "unused entries of any age)")
        self.min_fresh = check_positive_int(self.name, "min_fresh", max(1, n - s) if min_fresh
                                            is None else min_fresh, 1, n,
                                            hint=f"min_fresh in [1, {n}] new gradients per step")
        self._supports = [[(j + l) % n for l in range(self.r)] for j in range(n)]
        self.code = None
        # table[i] = (worker, step, version) of the newest gradient of shard i
        self.table: list = [None] * n
        self.table_messages: dict = {}
        # (worker, step) of the table entries an update has used (replay != "mean"); an entry
        # leaves this set when a newer gradient of its shard replaces it
        self.used: set = set()

    def supports(self):
        return self._supports

    @property
    def ring_depth(self) -> int:
        """One slot: a worker evaluates one shard per step and sends it."""
        return 1

    def plan_key(self, worker: int, step: int):
        """The shard (worker + t mod r) mod n depends on t through t mod r."""
        return (worker, step % self.r)

    def retained(self) -> set:
        """The table's messages: a later step may still use them."""
        return {(e[0], e[1]) for e in self.table if e is not None}

    def shard_of(self, worker: int, step: int) -> int:
        return (worker + step % self.r) % self.n

    def work_plan(self, worker, step):
        from .protocol import WorkPlan

        shard = self.shard_of(worker, step)
        return WorkPlan(worker, int(step), ((shard, 0),), ((0, 1.0),), (shard,))

    def _update_table(self, arrival: Arrival) -> None:
        shard = self.shard_of(arrival.worker, arrival.step)
        v = arrival.model_version
        old = self.table[shard]
        if old is not None and old[2] >= v:
            return
        if old is not None:
            self.table_messages.pop((old[0], old[1]), None)
            self.used.discard((old[0], old[1]))
        self.table[shard] = (arrival.worker, arrival.step, v)
        if arrival.message is not None:
            self.table_messages[(arrival.worker, arrival.step)] = arrival.message
