"""Communication models of the simulator.

Two kinds of model, one per kind of cluster:

* :class:`CommModel`, the **master** model of the BCGC paper (Sec. VII): a message of ``bytes``
  costs T = alpha + bytes / b seconds (alpha = 5e-4 s, b = 30 MB/s), dense or sparse alike, on
  every worker's own link to the decoder (``serial_ingress=True``: messages queue at the decoder
  one at a time); the new model is broadcast back the same way. The papers' experiments
  (``pgc-hvd experiment pgc|bcgc|staleness``) use it, and it stays the default.
* :class:`CollectiveModel`, the **decentralised** model of the Horovod runtime
  (:mod:`pgc_hvd.runtime.agent`): every rank takes part in every collective, and a collective of
  n ranks costs, with alpha the latency of one message step and beta the seconds per byte of the
  slowest link (Thakur, Rabenseifner and Gropp 2005, ring algorithms),

  - ring allreduce of ``B`` bytes per rank:  T = 2 (n-1) alpha + 2 (n-1)/n B beta;
  - allgather, rank i contributing B_i bytes (variable sizes, zero allowed):
    T = (n-1) alpha + R beta, R = sum_i B_i - min_i B_i the bytes received by the rank that
    receives most (each rank receives every block but its own).

  alpha and beta come from collectives measured on the machine (``benchmarks/
  measure_collectives.py`` fits them per n and writes JSON, read by :func:`load_fit` and
  ``fitted:PATH``) or are stated (``ring:alpha=10e-6,gbps=25``); :func:`parse_comm_model`
  reads both spellings. The model also carries the runtime's protocol settings the time of a
  step depends on: which **data plane** moves the messages (``plane``), the agent's
  ``poll_interval`` between control rounds and the cost of a local pass over memory
  (``pass_beta``, seconds per byte read or written: decoding, forming the message, applying the
  update). How the engine uses it step by step is in :mod:`pgc_hvd.sim.engine` ("collective
  model").

Data planes (``plane``):

``"allgather"``
    the runtime's CPU default before issue 13 (``optimistic``): a rank's message rides with the
    first control row that shows it ready, in the same allgather, so a control round carries the
    payloads of every rank that became ready since the last one (n-s to n messages of 4d bytes
    per step); a step that fires on that round needs no other collective.
``"allgather-2phase"``
    the runtime's GPU / store path before issue 13: control rounds carry control rows only;
    after the decision one allgather of the chosen ranks' messages (n-s of them).
``"allreduce"``
    issue 13's plane (DESIGN.md, "The data plane"): control rows only; after the decision every
    rank contributes sum_{u owned by it} a_u m_u (zeros when it owns none) to ONE ring allreduce
    of d float32. Sparse top-kappa messages are allgathered as (values, int32 indices) by the
    chosen ranks, or densified and allreduced when that moves fewer bytes (the runtime's rule,
    :func:`pgc_hvd.compress.codecs.choose_collective`). While the n copies of a message a
    rank would receive are at most ``optimistic_below`` bytes (default: the runtime's
    :data:`~pgc_hvd.compress.codecs.OPTIMISTIC_BYTES`), messages ride with the control rows
    as in ``"allgather"`` (:func:`~pgc_hvd.compress.codecs.optimistic_default`).

``message_bytes(payload)`` counts the bytes of a real message: a dense tensor's storage, or a
sparse top-kappa pair (values, indices) as values + indices storage (int32 indices in the
simulator), plus 8 bytes for the compression-error scalar of the minimum-error decoder when
sent.

Control paths (``control``; how a step's decision is reached before the data plane):

``"allgather"``
    the runtime's default: polled control rounds, an allgather of n control rows every
    ``poll_interval`` until the scheme fires (:class:`pgc_hvd.sim.agents.AgentModel`).
``"log"``
    the runtime's ``control="log"`` (its default): rows appended to an ordered log in rank 0's
    TCPStore, one decider whose body reads only the rows that changed, its outcome delivered to
    every rank by one broadcast (Gloo's binomial tree: ceil(log2 n) (alpha + B beta), B the
    broadcast buffer, :meth:`CollectiveModel.log_bcast`) (:class:`pgc_hvd.sim.log_agents.
    LogAgentModel`, costs :class:`~pgc_hvd.sim.log_costs.LogCosts` in ``log``, formulas in
    :mod:`pgc_hvd.sim.log_costs`). ``"log-bcast"``: the same (its name while the broadcast was
    a what-if; kept for old command lines).
``"log-store"``
    a what-if, the path before issue 38: the outcome read by every other rank from rank 0's
    one store (its n - 1 answers one after another, O(n^2) bytes a step).

On ``"log"`` (and ``"log-bcast"``) a scheme that waits for every rank (dgd, any scheme at
s = 0) with dense fp32 messages takes the runtime's s = 0 path: no control round, the rows in
the data allreduce (``rows_in_sum``, :class:`pgc_hvd.sim.log_agents.SumRowsAgentModel`).

Both log paths need the allreduce plane (the runtime's log path carries no payloads).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import torch

from pgc_hvd.compress.codecs import OPTIMISTIC_BYTES
from pgc_hvd.options import split_spec

from .log_costs import LogCosts, bcast_bytes, line_bytes, read_fit_file, tree_depth

PLANES = ("allgather", "allgather-2phase", "allreduce")
CONTROLS = ("allgather", "log", "log-bcast", "log-store")
FIT_FORMAT = "pgc_hvd.comm_fit/1"


@dataclasses.dataclass(frozen=True)
class CommModel:
    """The master model: T = alpha + bytes / bandwidth per message (see module doc)."""

    alpha: float = 5e-4
    bandwidth: float = 30e6  # bytes per second (30 MB/s)
    serial_ingress: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"CommModel: alpha = {self.alpha!r}; the per-message latency must be "
                             "finite seconds >= 0")
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"CommModel: bandwidth = {self.bandwidth!r}; give finite bytes per "
                             "second > 0")

    def cost(self, nbytes: int) -> float:
        return self.alpha + float(nbytes) / self.bandwidth


def _check_seconds(owner: str, name: str, value, positive: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise ValueError(f"{owner}: {name} = {value!r}; give a finite number "
                         f"{'> 0' if positive else '>= 0'}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """One collective's alpha-beta costs (module doc): ``alpha`` seconds per message step,
    ``beta`` seconds per byte."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        _check_seconds("AlphaBeta", "alpha", self.alpha)
        _check_seconds("AlphaBeta", "beta", self.beta)

    def allreduce(self, n: int, nbytes: float) -> float:
        """Ring allreduce of ``nbytes`` per rank: 2 (n-1) alpha + 2 (n-1)/n nbytes beta."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.alpha + 2 * (n - 1) / n * float(nbytes) * self.beta

    def allgather(self, n: int, sizes: Iterable[float]) -> float:
        """Allgather of rank i's ``sizes[i]`` bytes (n entries; zeros allowed):
        (n-1) alpha + (sum - min) beta."""
        if n <= 1:
            return 0.0
        sizes = [float(b) for b in sizes]
        if len(sizes) != n:
            raise ValueError(f"allgather of {len(sizes)} contributions for n = {n} ranks")
        return (n - 1) * self.alpha + (sum(sizes) - min(sizes)) * self.beta


@dataclasses.dataclass(frozen=True)
class Network:
    """alpha-beta of the two collectives the runtime uses (fitted separately: Horovod's
    allreduce and allgather take different code paths, fusion buffer and negotiation)."""

    allreduce: AlphaBeta
    allgather: AlphaBeta

    @classmethod
    def link(cls, alpha: float, beta: float) -> "Network":
        """One link for both collectives (a stated link: ``alpha`` seconds, ``1/beta`` bytes/s)."""
        ab = AlphaBeta(alpha, beta)
        return cls(ab, ab)

    def to_dict(self) -> dict:
        return {"allreduce": dataclasses.asdict(self.allreduce),
                "allgather": dataclasses.asdict(self.allgather)}


@dataclasses.dataclass(frozen=True)
class CollectiveModel:
    """The decentralised model (module doc). ``network`` holds for any n; ``per_n`` overrides it
    at the n it was fitted at (``((n, Network), ...)``)."""

    network: Network
    per_n: tuple = ()
    plane: str = "allreduce"
    poll_interval: float = 0.002
    pass_beta: float = 0.0
    optimistic_below: int = OPTIMISTIC_BYTES
    source: str = ""
    control: str = "allgather"
    log: Optional[LogCosts] = None
    #: the runtime's s = 0 path on the log plane (runtime/sum_rows.py): a scheme that waits for
    #: every rank runs no control round, its rows ride in the data allreduce
    #: (:class:`~pgc_hvd.sim.log_agents.SumRowsAgentModel`); False: the control round at every
    #: s, as the runtime before 2026-12-06
    rows_in_sum: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.network, Network):
            raise ValueError(f"CollectiveModel: network = {self.network!r}; give a Network "
                             "(Network.link(alpha, beta), or load_fit(PATH))")
        if self.plane not in PLANES:
            raise ValueError(f"CollectiveModel: plane = {self.plane!r}; choose one of {PLANES}")
        _check_seconds("CollectiveModel", "poll_interval", self.poll_interval, positive=True)
        _check_seconds("CollectiveModel", "pass_beta", self.pass_beta)
        if not (isinstance(self.optimistic_below, int) and self.optimistic_below >= 0):
            raise ValueError(f"CollectiveModel: optimistic_below = {self.optimistic_below!r}; "
                             "give a byte count >= 0 (0: never)")
        for item in self.per_n:
            if not (len(item) == 2 and isinstance(item[1], Network)):
                raise ValueError("CollectiveModel: per_n must be ((n, Network), ...)")
        if self.control not in CONTROLS:
            raise ValueError(f"CollectiveModel: control = {self.control!r}; choose one of "
                             f"{CONTROLS}")
        if self.control != "allgather":
            if not isinstance(self.log, LogCosts):
                raise ValueError(f"CollectiveModel: control = {self.control!r} needs its costs: "
                                 "log=load_log_fit(PATH) (measured by benchmarks/"
                                 "measure_log_control.py) or LogCosts(...)")
            if self.plane != "allreduce":
                raise ValueError(f"CollectiveModel: control = {self.control!r} carries no "
                                 f"payloads with the rows; use plane='allreduce', not "
                                 f"{self.plane!r}")

    def net(self, n: int) -> Network:
        for k, net in self.per_n:
            if int(k) == int(n):
                return net
        return self.network

    def allreduce(self, n: int, nbytes: float) -> float:
        return self.net(n).allreduce.allreduce(n, nbytes)

    def allgather(self, n: int, sizes: Sequence[float]) -> float:
        return self.net(n).allgather.allgather(n, sizes)

    def local(self, nbytes: float) -> float:
        """Seconds of a local pass that reads or writes ``nbytes`` of memory."""
        return float(nbytes) * self.pass_beta

    # -- the log control path (module doc; formulas in pgc_hvd.sim.log_costs) ---------------
    def log_bcast(self, n: int, nbytes: float) -> float:
        """One binomial-tree broadcast of ``nbytes`` on the allgather's link (Gloo's
        ``gloo::broadcast``, what Horovod's and torch.distributed's Gloo broadcasts run: each
        of ceil(log2 n) rounds forwards the whole buffer): ceil(log2 n) (alpha + nbytes beta)."""
        ab = self.net(n).allgather
        return tree_depth(n) * (ab.alpha + float(nbytes) * ab.beta) if n > 1 else 0.0

    def log_follow(self, n: int, rows: int, batches: int, lookback: int) -> tuple[float, float]:
        """After the decider's run that fired: (seconds until the last follower joins the data
        collective, seconds until the decider does). ``rows``: the m rows taken since the
        previous outcome, in ``batches`` batches: (m + b - 1) line_bytes(h) bytes.
        ``"log"``: one broadcast of the runtime's buffer (:func:`~pgc_hvd.sim.log_costs.
        bcast_bytes`), which the decider is in too; ``"log-store"``: the publish, then the
        store's answers to the n - 1 followers one after another, and the decider's delete of
        an outcome every follower has read, then each follower deletes its taken row (one
        round trip: the runtime of that time). Then each follower replays the body: (1 + b)
        runs on the m rows."""
        lc = self.log
        if n <= 1:
            return 0.0, 0.0
        B = (rows + max(0, batches - 1)) * line_bytes(lookback)
        if self.control == "log-store":
            deliver = lc.publish(B) + lc.fanout(n - 1, B)
            own = lc.publish(B) + lc.local_rtt
        else:
            deliver = own = (self.log_bcast(n, bcast_bytes(n, B, lookback))
                             if lc.broadcast else 0.0)
        delete = lc.rtt if self.control == "log-store" else 0.0   # the log is a queue now
        follow = deliver + delete + lc.body_seconds("follower", n, 1 + batches, rows)
        return follow, own

    def log_ops(self, rows_read: int, appended: int, taken: int) -> tuple[int, int]:
        """Control operations in a step: rank 0 pops ``rows_read`` rows of the others and
        broadcasts the outcome (``"log-store"``: publishes it and deletes an old one); a rank
        > 0 pushes ``appended`` rows and receives the outcome's broadcast (``"log-store"``, the
        runtime of its time: add + set each, a get, a delete of its ``taken`` rows). Returns
        (rank 0's, that rank's)."""
        if self.control == "log-store":
            return rows_read + 2, 2 * appended + 1 + taken
        return rows_read + 1, appended + 1

    def replace(self, **changes) -> "CollectiveModel":
        return dataclasses.replace(self, **changes)

    def describe(self, n: Optional[int] = None) -> str:
        net = self.net(n) if n is not None else self.network
        ar, ag = net.allreduce, net.allgather
        text = (f"{self.source or 'ring'}: allreduce alpha={ar.alpha:.3g}s beta={ar.beta:.3g}s/B, "
                f"allgather alpha={ag.alpha:.3g}s beta={ag.beta:.3g}s/B, plane={self.plane}, "
                f"poll={self.poll_interval:g}s, pass_beta={self.pass_beta:.3g}s/B")
        if self.control != "allgather":
            lc = self.log
            text += (f", control={self.control} ({lc.source}: rtt={lc.rtt:.3g}s, "
                     f"fan-out {lc.fan_op:.3g}s + {lc.fan_beta:.3g}s/B per follower, body "
                     f"{lc.run_seconds('decider', n or 1):.3g}s a run + "
                     f"{lc.row_seconds('decider', n or 1):.3g}s a row at n={n or 1})")
        return text


# ------------------------------------------------------------------------------ fitting
def design_row(kind: str, n: int, nbytes: float) -> tuple[float, float]:
    """Coefficients of (alpha, beta) in the model time of one collective: allreduce of
    ``nbytes`` per rank -> (2(n-1), 2(n-1)/n nbytes); allgather where the rank receiving most
    receives ``nbytes`` -> (n-1, nbytes)."""
    if kind == "allreduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * float(nbytes)
    if kind == "allgather":
        return float(n - 1), float(nbytes)
    raise ValueError(f"unknown collective {kind!r}; use 'allreduce' or 'allgather'")


def fit_alpha_beta(samples: Sequence[tuple[int, float, float]], kind: str) -> dict:
    """Least-squares alpha, beta >= 0 of one collective from ``(n, nbytes, seconds)`` samples
    (``nbytes`` as in :func:`design_row`). Residuals are relative (each row divided by its time),
    so microsecond latencies and second-long transfers weigh alike; a coefficient the fit
    would make negative is pinned at 0 and the other refitted. Returns ``{"alpha", "beta",
    "rel_rms", "samples"}`` (rel_rms: root-mean-square relative residual)."""
    if len(samples) < 2:
        raise ValueError(f"fit_alpha_beta: {len(samples)} sample(s); at least two sizes needed")
    A = np.array([design_row(kind, n, b) for n, b, _ in samples], dtype=float)
    y = np.array([t for _, _, t in samples], dtype=float)
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError("fit_alpha_beta: times must be finite seconds > 0")
    W = A / y[:, None]
    one = np.ones_like(y)
    coef, *_ = np.linalg.lstsq(W, one, rcond=None)
    if coef[0] < 0 or coef[1] < 0:
        # pin the negative coefficient at 0, refit the other (1-D least squares, >= 0)
        j = 1 if coef[0] < 0 else 0
        col = W[:, j]
        best = max(0.0, float(col @ one) / float(col @ col)) if col @ col > 0 else 0.0
        coef = np.zeros(2)
        coef[j] = best
    rel = W @ coef - one
    return {"alpha": float(coef[0]), "beta": float(coef[1]),
            "rel_rms": float(np.sqrt(np.mean(rel ** 2))), "samples": len(samples)}


def fit_network(samples: Mapping[str, Sequence[tuple[int, float, float]]]) -> dict:
    """Fits of both collectives: ``{"allreduce": fit, "allgather": fit}``."""
    return {kind: fit_alpha_beta(samples[kind], kind) for kind in ("allreduce", "allgather")}


def _network(fits: Mapping) -> Network:
    return Network(AlphaBeta(fits["allreduce"]["alpha"], fits["allreduce"]["beta"]),
                   AlphaBeta(fits["allgather"]["alpha"], fits["allgather"]["beta"]))


def load_fit(path: os.PathLike, **options) -> CollectiveModel:
    """The :class:`CollectiveModel` of a JSON file written by ``benchmarks/
    measure_collectives.py``: per-n fits where measured, the fit over every n elsewhere, the
    measured local pass cost; ``options`` (plane, poll_interval, ...) override."""
    p, doc = read_fit_file(path, "comm model", FIT_FORMAT, "benchmarks/data_plane/measure_collectives.py",
                           "measure one with `python benchmarks/data_plane/measure_collectives.py "
                           "--np 2,3,4 --out {p}`")
    try:
        per_n = tuple(sorted((int(k), _network(v)) for k, v in doc["fits"].items()))
        net = _network(doc["all"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"comm model {str(p)!r}: damaged fits ({type(err).__name__}: {err})") \
            from None
    kw = {"pass_beta": float(doc.get("local", {}).get("pass_beta", 0.0)),
          "source": f"fitted:{p.name}"}
    kw.update(options)
    return CollectiveModel(net, per_n, **kw)


def parse_comm_model(spec, **options):
    """A comm model from its text spec:

    * ``master`` or ``master:alpha=5e-4,bandwidth=30e6[,serial=1]`` -> :class:`CommModel`;
    * ``ring:alpha=SECONDS,beta=SECONDS_PER_BYTE`` (or ``bandwidth=BYTES_PER_S`` or
      ``gbps=GBIT_PER_S`` instead of beta; optional ``pass_beta``, ``poll``) -> a
      :class:`CollectiveModel` whose two collectives share that link;
    * ``fitted:PATH`` -> :func:`load_fit`.

    ``options`` (``plane``, ``poll_interval``, ...) apply to collective models only. A model
    object is returned as it is (with ``options`` applied)."""
    if isinstance(spec, CommModel):
        return spec
    if isinstance(spec, CollectiveModel):
        return spec.replace(**options) if options else spec
    text = str(spec).strip()
    kind, rest, parts = split_spec(text)
    kind = kind.lower()
    if kind == "fitted":
        if not rest.strip():
            raise ValueError("comm model 'fitted:' needs a path: fitted:comm.json")
        return load_fit(rest.strip(), **options)
    kv: dict = {}
    for part in parts:
        try:
            if part.key is None:
                raise ValueError
            kv[part.key.lower()] = float(part.value)
        except ValueError:
            raise ValueError(f"comm model {text!r}: {part.text!r} is not KEY=NUMBER; e.g. "
                             "ring:alpha=10e-6,gbps=25") from None
    if kind == "master":
        bad = sorted(set(kv) - {"alpha", "bandwidth", "serial"})
        if bad:
            raise ValueError(f"comm model {text!r}: unknown key(s) {bad}; master takes alpha, "
                             "bandwidth, serial")
        return CommModel(kv.get("alpha", 5e-4), kv.get("bandwidth", 30e6),
                         bool(kv.get("serial", 0)))
    if kind == "ring":
        bad = sorted(set(kv) - {"alpha", "beta", "bandwidth", "gbps", "pass_beta", "poll"})
        if bad:
            raise ValueError(f"comm model {text!r}: unknown key(s) {bad}; ring takes alpha and "
                             "one of beta, bandwidth, gbps (and pass_beta, poll)")
        given = [k for k in ("beta", "bandwidth", "gbps") if k in kv]
        if "alpha" not in kv or len(given) != 1:
            raise ValueError(f"comm model {text!r}: give alpha and exactly one of beta (s/byte), "
                             "bandwidth (bytes/s) or gbps (Gbit/s), e.g. ring:alpha=10e-6,gbps=25")
        if given[0] != "beta" and not kv[given[0]] > 0:
            raise ValueError(f"comm model {text!r}: {given[0]} must be > 0")
        beta = {"beta": lambda x: x, "bandwidth": lambda x: 1.0 / x,
                "gbps": lambda x: 8.0 / (x * 1e9)}[given[0]](kv[given[0]])
        kw = {"source": text}
        if "pass_beta" in kv:
            kw["pass_beta"] = kv["pass_beta"]
        if "poll" in kv:
            kw["poll_interval"] = kv["poll"]
        kw.update(options)
        return CollectiveModel(Network.link(kv["alpha"], beta), **kw)
    raise ValueError(f"unknown comm model {text!r}; use master[:alpha=..,bandwidth=..], "
                     "ring:alpha=..,gbps=.. (or beta=.., bandwidth=..) or fitted:PATH")


def message_bytes(payload) -> int:
    if payload is None:
        return 0
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (tuple, list)):
        return sum(message_bytes(p) for p in payload)
    raise TypeError(f"cannot size a message of type {type(payload).__name__}")
