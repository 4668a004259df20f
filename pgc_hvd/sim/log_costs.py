"""What one step of ``control="log"`` costs: the constants and the formulas of its parts.

The runtime's ordered control log (:mod:`pgc_hvd.runtime.control_log`) exchanges, per step t:

* **append** (every rank w > 0 whose message is ready at r_w): ``queue_push`` of its log line
  onto the log, a queue on rank 0's TCPStore (one way, no answer), and rank 0's reader thread,
  blocked in ``queue_pop``, is answered (one way on rank 0's own machine): the row reaches the
  decider at

      r_w + a,    a = rtt / 2 + local_rtt / 2          (rank 0's own rows: a = 0)

  (until 2026-12-06 the row took an ``add`` of a counter, one round trip, before its ``set``:
  a = rtt + rtt / 2 + local_rtt / 2, and a delete once taken);

  and the reader takes one row per ``local_rtt`` at most (a backlog drains at that rate);
* **decide** (rank 0's agent, one thread): the decision body runs once per *batch*, every row
  queued since its previous run (at least one), taking

      run_dec(n) + k row_dec(n)   seconds for a batch of k rows.

  ``run`` stays about constant in n since issue 38 (the body reads only the rows that
  changed: :class:`~pgc_hvd.runtime.control_log.LogView` refreshes them,
  :class:`~pgc_hvd.runtime.rows.RowState` keeps the failed / done / non-finite counts);
  ``row`` is each row's own part (decoding, the view, the offer). While a run lasts the next
  rows queue, so batches grow with the load (self-balancing). Both are measured at several n
  (``decider``: ``((n, run, row), ...)``) and read piecewise-linearly between the points,
  linearly extended beyond. The decider is in the data phase after each decision (rows that
  land meanwhile queue), then runs the body once more (``run``) before the next batch;
* **deliver** the m rows taken since the previous outcome, in b batches: B = (m + b - 1)
  ``line_bytes`` bytes (``line_bytes`` = 8 (1 + ctrl_len), ctrl_len = 11 + h + k words, one
  separator line between two batches). Two deliveries:

  - ``"log"`` (what the runtime does since issue 38): one broadcast from rank 0 on the agent
    threads, of a buffer of 16 + max(B, (2n + 8) line_bytes) bytes (:func:`bcast_bytes`), by
    Gloo's binomial tree: ceil(log2 n) (alpha + B_bcast beta) on the link, for the decider
    (the root) and the last follower alike;
  - ``"log-store"`` (a what-if, the runtime before issue 38): a ``set`` into rank 0's store (B
    ``get_beta`` s) and the delete of an old outcome (one ``local_rtt``), then the store
    answers the n - 1 waiting ``get`` calls one after another; the k-th follower holds the
    outcome after ``fan_latency + k (fan_op + B fan_beta)``: (n - 1) B ~ n^2 line_bytes bytes
    leave one server per step;

  then each follower replays the body on the same batches, (1 + b) run_fol(n) + m row_fol(n) seconds (``follower``; the first run is the one
  the decider made after the previous outcome; O(1) a row like the decider's), and joins the
  data collective, which starts when the last rank joins.

So a rank > 0 issues 2 control operations per step (the push, the broadcast) and rank 0 about m
(its reader's pops) + 1 (the broadcast); rank 0's store serves about 2n operations a step, O(n)
bytes. (The ``"log-store"`` what-if keeps the runtime of its time: add + set, the get, a delete.)

The constants are measured by ``benchmarks/control/measure_log_control.py`` (JSON format
:data:`FORMAT`, read by :func:`load_log_fit`); :meth:`LogCosts.on_link` moves the network
parts to a stated link (alpha, beta), keeping the measured CPU parts (the store's per-answer
cost, the decision body); the broadcast's alpha and beta are the collectives model's
(:meth:`pgc_hvd.sim.comm.CollectiveModel.log_bcast`). :meth:`LogCosts.free` is every cost 0:
the bound no control plane can beat.

May import: nothing of pgc_hvd (pure arithmetic).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

FORMAT = "pgc_hvd.log_control_fit/1"
#: the float64 words of a control row before its h slot versions and k metrics
#: (``pgc_hvd.runtime.rows.CTRL_FIXED``; the log line adds one word, the rank)
ROW_FIXED = 11
ROLES = ("decider", "follower")


def _nonneg(owner: str, name: str, value) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{owner}: {name} = {value!r}; give a finite number >= 0")
    return float(value)


def _at(points: tuple, n: int, col: int) -> float:
    """Column ``col`` of measured ``points`` ((n, ...), sorted by n) at n: straight lines
    between them, the end segments extended (one point: its value; none: 0), never below 0."""
    if not points:
        return 0.0
    if len(points) == 1:
        return points[0][col]
    i = 1
    while i < len(points) - 1 and points[i][0] < n:
        i += 1
    a, b = points[i - 1], points[i]
    return max(0.0, a[col] + (b[col] - a[col]) * (n - a[0]) / (b[0] - a[0]))


@dataclasses.dataclass(frozen=True)
class LogCosts:
    """The constants of the log path (module doc), seconds and seconds per byte."""

    rtt: float                      # a client's round trip to rank 0's store (an add)
    local_rtt: float                # rank 0's reader thread to its own store
    get_beta: float                 # seconds per byte of a value set or read on the store
    fan_op: float                   # the store answering one more waiting get of the outcome
    fan_beta: float                 # ... per byte of that answer
    decider: tuple = ()             # ((n, seconds per body run, per row of it), ...) measured
    follower: tuple = ()            # the same for a follower's replay
    fan_latency: float = 0.0        # what every answer of the fan-out pays once
    source: str = ""
    #: whether the outcome's broadcast costs its time on the link (False: :meth:`free`)
    broadcast: bool = True

    def __post_init__(self) -> None:
        for f in ("rtt", "local_rtt", "get_beta", "fan_op", "fan_beta", "fan_latency"):
            _nonneg("LogCosts", f, getattr(self, f))
        for f in ROLES:
            v = getattr(self, f)
            ok = isinstance(v, tuple) and all(
                isinstance(p, tuple) and len(p) == 3 and p[0] >= 1 for p in v)
            if not ok or len({p[0] for p in v}) != len(v):
                raise ValueError(f"LogCosts: {f} = {v!r}; give ((n, seconds per body run, "
                                 "seconds per row), ...) at distinct n >= 1")
            for p in v:
                _nonneg("LogCosts", f, p[1])
                _nonneg("LogCosts", f, p[2])
            object.__setattr__(self, f, tuple(sorted((int(a), float(b), float(c))
                                                     for a, b, c in v)))

    # -- the parts of a step --------------------------------------------------------------
    def append_delay(self, rank: int) -> float:
        """Seconds from a message ready on ``rank`` to its row in the decider's hands."""
        if rank == 0:
            return 0.0
        return 0.5 * self.rtt + 0.5 * self.local_rtt

    def run_seconds(self, role: str, n: int) -> float:
        """One run of the decision body at n ranks, beside its rows (``role``: decider,
        follower)."""
        return _at(getattr(self, role), n, 1)

    def row_seconds(self, role: str, n: int) -> float:
        """What a run of the body spends on each row of its batch, at n ranks."""
        return _at(getattr(self, role), n, 2)

    def body_seconds(self, role: str, n: int, runs: int, rows: int) -> float:
        """``runs`` runs of the body on ``rows`` rows in all."""
        return runs * self.run_seconds(role, n) + rows * self.row_seconds(role, n)

    def fanout(self, k: int, nbytes: float) -> float:
        """Seconds until the k-th waiting follower holds an outcome of ``nbytes``."""
        return self.fan_latency + k * (self.fan_op + float(nbytes) * self.fan_beta)

    def publish(self, nbytes: float) -> float:
        """The decider's ``set`` of the outcome into its own store."""
        return float(nbytes) * self.get_beta

    # -- other links and what-ifs ----------------------------------------------------------
    def on_link(self, alpha: float, beta: float, source: str = "") -> "LogCosts":
        """These costs with the followers on a link of ``alpha`` s one way and ``beta`` s/B:
        the round trip gains 2 alpha, the fan-out alpha once and the link's beta per byte (the
        measured per-answer cost and latency stay: the store's and the followers' CPU); the
        decision body and rank 0's local reads stay."""
        return dataclasses.replace(self, rtt=self.rtt + 2 * alpha,
                                   fan_latency=self.fan_latency + alpha, fan_beta=beta,
                                   source=source or f"{self.source} on link")

    @classmethod
    def free(cls) -> "LogCosts":
        """No control cost at all: a step's data phase starts when its deciding row is ready."""
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, source="free", broadcast=False)


def line_bytes(lookback: int, metrics: int = 0) -> int:
    """Bytes of one log line: [rank | control row], 8 (1 + 11 + h + k)."""
    return 8 * (1 + ROW_FIXED + int(lookback) + int(metrics))


def bcast_bytes(n: int, nbytes: float, lookback: int, metrics: int = 0) -> float:
    """Bytes of the runtime's outcome broadcast (:func:`pgc_hvd.runtime.control_log.
    outcome_capacity`): a 16-byte header and a buffer of 2n + 8 log lines, or the outcome's
    ``nbytes`` when longer (a second broadcast carries the rest; counted here as one)."""
    return 16.0 + max(float(nbytes), (2 * int(n) + 8) * line_bytes(lookback, metrics))


def tree_depth(n: int) -> int:
    """ceil(log2 n): rounds of a binomial-tree broadcast among n ranks."""
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def read_fit_file(path: os.PathLike, what: str, fmt: str, writer: str,
                  measure: str) -> tuple[Path, dict]:
    """The JSON document of a fitted-constants file (``format`` == ``fmt``) written by the
    benchmark ``writer``, and its path; ValueError naming ``what`` when it is missing (with
    ``measure``, the sentence saying how to make one; ``{p}`` is the path), not JSON or of
    another format. Used for the collectives' fit (:func:`pgc_hvd.sim.comm.load_fit`) and the
    log control's (:func:`load_log_fit`)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"{what} {str(p)!r}: no such file; "
                         + measure.format(p=p)) from None
    except json.JSONDecodeError as err:
        verb = "are" if what.endswith("s") else "is"
        raise ValueError(f"{what} {str(p)!r} {verb} not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ValueError(f"{what} {str(p)!r}: not a {fmt} file (written by {writer})")
    return p, doc


def load_log_fit(path: os.PathLike) -> LogCosts:
    """:class:`LogCosts` from a JSON of ``benchmarks/control/measure_log_control.py``."""
    p, doc = read_fit_file(path, "log control costs", FORMAT,
                           "benchmarks/control/measure_log_control.py",
                           "measure them with `python benchmarks/control/measure_log_control.py "
                           "--out {p}`")
    try:
        st, body = doc["store"], doc["body"]
        pts = {role: tuple((int(x["n"]), float(x[role]["run"]), float(x[role]["row"]))
                           for x in body["samples"]) for role in ROLES}
        return LogCosts(rtt=float(st["rtt"]), local_rtt=float(st["rtt"]),
                        get_beta=float(st["beta"]), fan_op=float(st["fan_op"]),
                        fan_beta=float(st["fan_beta"]),
                        fan_latency=float(st.get("fan_latency", 0.0)),
                        decider=pts["decider"], follower=pts["follower"],
                        source=f"log-fitted:{p.name}")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"log control costs {str(p)!r}: damaged ({type(err).__name__}: "
                         f"{err})") from None


__all__ = ["FORMAT", "LogCosts", "bcast_bytes", "line_bytes", "load_log_fit", "read_fit_file",
           "tree_depth"]
