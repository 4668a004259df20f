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

Replays and the remedy (``replay``; docs/control.md "Bounded staleness: count each gradient
once"). The note's rule above applies the whole table at every step, so an entry that is not
refreshed enters up to c consecutive updates: a *replay*, and nothing limits how many steps
fire from one table (after a step the next round is polled and fires at once while every
entry is younger than c). The gradient g_i^{(v)} then enters sum_t w_i = u_i w_i in total,
u_i <= c its number of uses -- an lr amplified by up to c on the slow workers' shards, which
with the user's momentum 0.9 diverges (docs/experiments.md section 5). ``replay="once"`` (the
default) counts every gradient once, at its first use:

    g^(t) = sum_{i in F_t} w_i g_i^{(v_i)},   F_t = the entries no earlier step has used,

and step t fires when every shard has an entry of age t - v_i < c (as before) *and* F_t is not
empty, so no step is a pure replay. Each gradient's total weight over its uses is w_i (1/n):
the update is asynchronous SGD with delays bounded by c - 1 (and every shard's newest gradient
at most c - 1 versions old at every step). ``replay="mean"`` is the note's rule (every entry,
every step; the off switch). Two more weightings are kept for the comparison that chose
"once": ``"age"`` (staleness-aware lr, w_i / (1 + a_i) on every entry at every step, a_i =
t - v_i), ``"once-age"`` (counted once, with weight w_i / (1 + a_i)) and ``"split"`` (w_i / c on every entry at every step: an entry's weight spread over
the c uses it can have, so its total is at most w_i).

Options: ``r`` (replicas, default s+1, 1 <= r <= n), ``c`` (staleness bound,
default s+1, c >= 1), ``shard_sizes`` (n positive numbers), ``replay`` ("once" default,
"mean", "age", "split").
"""

from __future__ import annotations

import math
from typing import Optional

from .protocol import Arrival, Decision, Round, Scheme, Use
from .validation import check_positive_int, check_scheme_n_s


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
            if not fresh:       # every entry has been applied already: wait for a new one
                return None
            scale = (lambda a: 1.0) if mode == "once" else (lambda a: 1.0 / (1.0 + a))
            uses = tuple(Use(table[i][0], table[i][1], table[i][2],
                             sch.shard_weights[i] * scale(ages[i])) for i in fresh)
        elif mode == "age":
            uses = tuple(Use(e[0], e[1], e[2], sch.shard_weights[i] / (1.0 + ages[i]))
                         for i, e in enumerate(table))
        else:                   # "split"
            uses = tuple(Use(e[0], e[1], e[2], sch.shard_weights[i] / c)
                         for i, e in enumerate(table))
        sch.used.update((e[0], e[1]) for e in table)
        return self.decide({}, {"table_max_age": max(ages), "n_fresh": len(fresh),
                                "replayed": len(table) - len(fresh),
                                "weight_sum": float(sum(u.weight for u in uses))},
                           uses=uses)

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
                 shard_sizes=None, replay: str = "once"):
        n, s = check_scheme_n_s(self.name, n, s)
        super().__init__(n, s)
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
            raise ValueError(f"{self.name}: replay={replay!r}; use 'once' (default: each "
                             "gradient counted once, at its first use), 'mean' (the design "
                             "note's table mean at every step, the remedy off), 'age' or 'split'")
        self.replay = mode
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
