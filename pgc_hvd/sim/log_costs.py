"""What one step of ``control="log"`` costs: the constants and the formulas of its parts.

The runtime's ordered control log (:mod:`pgc_hvd.runtime.control_log`) exchanges, per step t:

* **append** (every rank w > 0 whose message is ready at r_w): ``add`` on rank 0's TCPStore
  (one round trip, ``rtt``) then ``set`` of its log line (one way, no answer), and rank 0's
  reader thread, blocked in ``get`` of that index, is answered (one way on rank 0's own
  machine): the row reaches the decider at

      r_w + a,    a = rtt + rtt / 2 + local_rtt / 2          (rank 0's own rows: a = 0)

  and the reader takes one row per ``local_rtt`` at most (a backlog drains at that rate);
* **decide** (rank 0's agent, one thread): the decision body runs once per row it takes, at
  q_dec(n) seconds a row, in log order. The body reads all n rows of its view
  (:class:`~pgc_hvd.runtime.control_log.LogView`, ``ArrivalBook``, the failed / done scans), so
  q grows like n: it is measured at several n (``decider``: ``((n, seconds), ...)``) and read
  piecewise-linearly between them, linearly extended beyond; it is busy in the data phase after each decision, so rows that land meanwhile
  queue;
* **publish** the m rows taken since the previous outcome, B = m * ``line_bytes`` bytes
  (``line_bytes`` = 8 (1 + ctrl_len), ctrl_len = 11 + h + k words): ``set`` into its own store,
  B ``get_beta`` seconds;
* **follow** (every rank > 0 waits in one ``get`` of the outcome). Two deliveries:

  - ``"log"`` (what the runtime does): rank 0's one store answers the n - 1 waiting ``get``\\ s
    one after another; the k-th follower holds the outcome after
    ``fan_latency + k (fan_op + B fan_beta)`` -- the last one after (n - 1) (fan_op +
    B fan_beta): (n - 1) m line_bytes ~ n^2 line_bytes bytes leave one server per step;
  - ``"log-bcast"`` (a fix, not built): one binomial-tree broadcast of the outcome,
    ceil(log2 n) alpha + B beta on the link (the brief's log-depth delivery);

  then each follower runs the body on the m rows, m q_fol(n) seconds (``follower``), and joins
  the data collective, which starts when the last rank joins.

So rank 0's store serves 2 (n - 1) appends + (n - 1) reader gets + 1 publish + (n - 1)
follower gets per step (about 4n operations) and, with ``"log"``, O(n^2) bytes; a rank > 0
issues 3 operations per step (add, set, get) and rank 0 about m (its reader's gets) + 1.
Both the decider's and each follower's body cost m q(n) = O(n^2) seconds per step (m ~ n).

The constants are measured by ``benchmarks/measure_log_control.py`` (JSON format
:data:`FORMAT`, read by :func:`load_log_fit`); :meth:`LogCosts.on_link` moves the network
parts to a stated link (alpha, beta), keeping the measured CPU parts (the store server's
per-answer cost, the decision body). :meth:`LogCosts.free` is every cost 0: the bound no control
plane can beat; :meth:`LogCosts.constant_body` a what-if (the body's per-row cost held at its
smallest-n value: an incremental body, not built).

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
#: (``pgc_hvd.runtime.wire.CTRL_FIXED``; the log line adds one word, the rank)
ROW_FIXED = 11


def _nonneg(owner: str, name: str, value) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{owner}: {name} = {value!r}; give a finite number >= 0")
    return float(value)


@dataclasses.dataclass(frozen=True)
class LogCosts:
    """The constants of the log path (module doc), seconds and seconds per byte."""

    rtt: float                      # a client's round trip to rank 0's store (an add)
    local_rtt: float                # rank 0's reader thread to its own store
    get_beta: float                 # seconds per byte of a value set or read on the store
    fan_op: float                   # the store answering one more waiting get of the outcome
    fan_beta: float                 # ... per byte of that answer
    decider: tuple = ()             # q_dec(n): ((n, seconds per row), ...) measured
    follower: tuple = ()            # q_fol(n): the same for a follower's body
    fan_latency: float = 0.0        # one-way transit of the answers (in fan_op when measured)
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("rtt", "local_rtt", "get_beta", "fan_op", "fan_beta", "fan_latency"):
            _nonneg("LogCosts", f, getattr(self, f))
        for f in ("decider", "follower"):
            v = getattr(self, f)
            ok = isinstance(v, tuple) and all(
                isinstance(p, tuple) and len(p) == 2 and p[0] >= 1 for p in v)
            if not ok or len({p[0] for p in v}) != len(v):
                raise ValueError(f"LogCosts: {f} = {v!r}; give ((n, seconds per row), ...) at "
                                 "distinct n >= 1")
            for p in v:
                _nonneg("LogCosts", f, p[1])
            object.__setattr__(self, f, tuple(sorted((int(a), float(b)) for a, b in v)))

    # -- the parts of a step --------------------------------------------------------------
    def append_delay(self, rank: int) -> float:
        """Seconds from a message ready on ``rank`` to its row in the decider's hands."""
        if rank == 0:
            return 0.0
        return 1.5 * self.rtt + 0.5 * self.local_rtt

    def row_seconds(self, role: str, n: int) -> float:
        """The decision body's seconds per row at n ranks (``role``: decider, follower): the
        measured points joined by straight lines, the end segments extended (one point: that
        value; none: 0), never below 0."""
        pts = self.decider if role == "decider" else self.follower
        if not pts:
            return 0.0
        if len(pts) == 1:
            return pts[0][1]
        i = 1
        while i < len(pts) - 1 and pts[i][0] < n:
            i += 1
        (n0, q0), (n1, q1) = pts[i - 1], pts[i]
        return max(0.0, q0 + (q1 - q0) * (n - n0) / (n1 - n0))

    def fanout(self, k: int, nbytes: float) -> float:
        """Seconds until the k-th waiting follower holds an outcome of ``nbytes``."""
        return self.fan_latency + k * (self.fan_op + float(nbytes) * self.fan_beta)

    def publish(self, nbytes: float) -> float:
        """The decider's ``set`` of the outcome into its own store."""
        return float(nbytes) * self.get_beta

    # -- other links --------------------------------------------------------------------
    def on_link(self, alpha: float, beta: float, source: str = "") -> "LogCosts":
        """These costs with the followers on a link of ``alpha`` s one way and ``beta`` s/B:
        the round trip gains 2 alpha, the answers alpha and beta per byte (the measured
        per-answer cost and latency stay: the server's and the followers' CPU); the decision
        body and rank 0's local reads stay."""
        return dataclasses.replace(self, rtt=self.rtt + 2 * alpha,
                                   fan_latency=self.fan_latency + alpha, fan_beta=beta,
                                   source=source or f"{self.source} on link")

    def constant_body(self) -> "LogCosts":
        """A what-if: these costs with the decision body's per-row cost held at its value at
        the smallest n measured, whatever n (an incremental body that reads only the new row,
        not built)."""
        pick = lambda pts: ((pts[0][0], pts[0][1]),) if pts else ()   # noqa: E731
        return dataclasses.replace(self, decider=pick(self.decider),
                                   follower=pick(self.follower),
                                   source=f"{self.source}, body constant")

    @classmethod
    def free(cls) -> "LogCosts":
        """No control cost at all: a step's data phase starts when its deciding row is ready."""
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, source="free")


def line_bytes(lookback: int, metrics: int = 0) -> int:
    """Bytes of one log line: [rank | control row], 8 (1 + 11 + h + k)."""
    return 8 * (1 + ROW_FIXED + int(lookback) + int(metrics))


def tree_depth(n: int) -> int:
    """ceil(log2 n): rounds of a binomial-tree broadcast among n ranks."""
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def load_log_fit(path: os.PathLike) -> LogCosts:
    """:class:`LogCosts` from a JSON of ``benchmarks/measure_log_control.py``."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"log control costs {str(p)!r}: no such file; measure them with "
                         f"`python benchmarks/measure_log_control.py --out {p}`") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"log control costs {str(p)!r} are not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"log control costs {str(p)!r}: not a {FORMAT} file (written by "
                         "benchmarks/measure_log_control.py)")
    try:
        st, body = doc["store"], doc["body"]
        pts = {role: tuple((int(x["n"]), float(x[role]["per_row"])) for x in body["samples"])
               for role in ("decider", "follower")}
        return LogCosts(rtt=float(st["rtt"]), local_rtt=float(st["rtt"]),
                        get_beta=float(st["beta"]), fan_op=float(st["fan_op"]),
                        fan_beta=float(st["fan_beta"]),
                        fan_latency=float(st.get("fan_latency", 0.0)),
                        decider=pts["decider"], follower=pts["follower"],
                        source=f"log-fitted:{p.name}")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"log control costs {str(p)!r}: damaged ({type(err).__name__}: "
                         f"{err})") from None


__all__ = ["FORMAT", "LogCosts", "line_bytes", "load_log_fit", "tree_depth"]
