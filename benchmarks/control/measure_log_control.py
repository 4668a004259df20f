"""Measure what ``control="log"`` costs on this machine, for the simulator's model of it.

    python benchmarks/control/measure_log_control.py --out docs/figures/log_control_fit.json
        [--ns 4,16,64,256,1024] [--reps 400] [--fanout 1,2,4,8] [--rows 12000] [--s S]

The model (:class:`pgc_hvd.sim.comm.LogCosts`, used by :mod:`pgc_hvd.sim.log_agents`) needs
four things; each is timed here on the runtime's own code or on a torch ``TCPStore`` as the
runtime opens it (:mod:`pgc_hvd.runtime.control_log`):

* ``rtt``: one store round trip of a client to a server in another process (an ``add``, what an
  append waits for; its ``set`` does not wait for an answer), median over ``--reps``;
* ``beta``: seconds per byte of a ``get``, fitted as ``get(B) = rtt + B beta`` over values of
  B = 616 B .. 2.5 MB (the published outcome at n = 1024 is about 0.63 MB);
* ``fan_op``, ``fan_beta``: the publish's fan-out (the runtime's before it broadcast the outcome;
  now the simulator's ``log-store`` what-if: the runtime broadcasts the outcome, priced by the
  collectives model). k follower processes (as k ranks) block in
  ``get("dec/j")``; the publisher ``set``s a value of B bytes; the time from the set to the
  last follower's answer (``time.monotonic``, one clock on this machine) is fitted as
  ``fan_latency + k (fan_op + B fan_beta)`` (the server answers the waiting gets one after
  another; ``fan_latency``: what every answer pays once, e.g. a waiting process's wake-up),
  over k in ``--fanout`` and B = 616 B .. 631 KB, median of ``FAN_REPS`` repetitions each;
* ``run``, ``row``: the decision body's seconds, ``run(n) + rows * row(n)`` for one run of
  the body on a batch of rows (the decider runs it once per batch of the rows queued since its
  last run; each follower replays the same batches): the runtime's
  :func:`pgc_hvd.runtime.control_log.log_loop` (decider and follower branches, the real
  :class:`~pgc_hvd.runtime.rows.Decider`, ``LogView``, ``ArrivalBook``, the outcome's
  encoding and decoding) on an in-memory channel over rows of ``pgc-cr`` with
  s = max(1, n // 16) (``--s``: one s at every n; each step every rank shows its message, in
  random order; no row of step t + 1 before step t is decided), at each n in ``--ns``, in
  thread CPU seconds, once with batches of one row and once of up to max(4, n // 4): ``run``
  and ``row`` solve ``seconds = runs * run + rows * row`` for the two. A row carries s + 1 slot
  versions (PGC-CR's ring), so with s = n // 16 its own part grows with n through its length
  (76 words at n = 1024, 16 at n = 64); ``--s`` keeps the length fixed.

Everything runs on this machine's cores, shared with whatever else runs: the JSON (format
``pgc_hvd.log_control_fit/1``) records the load average before and after and every sample.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path


FORMAT = "pgc_hvd.log_control_fit/1"


# ----------------------------------------------------------------------------- the store
def _server(port_q, stop_e) -> None:
    import torch.distributed as dist
    srv = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60),
                        wait_for_workers=False)
    port_q.put(srv.port)
    stop_e.wait()


def _client(port: int):
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=60))


def _median_time(fn, reps: int) -> float:
    xs = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def _nnls(X, y) -> tuple:
    """Least squares of y ~ X c on relative residuals with every c >= 0 (the best of the
    unconstrained fits on each subset of columns whose coefficients come out >= 0); returns
    (c, relative RMS residual)."""
    import itertools

    import numpy as np
    X, y = np.asarray(X, float), np.asarray(y, float)
    W = X / y[:, None]
    one = np.ones_like(y)
    best = (np.zeros(X.shape[1]), float(np.sqrt(np.mean(one ** 2))))
    for r in range(1, X.shape[1] + 1):
        for cols in itertools.combinations(range(X.shape[1]), r):
            c_sub, *_ = np.linalg.lstsq(W[:, cols], one, rcond=None)
            if np.any(c_sub < 0):
                continue
            c = np.zeros(X.shape[1])
            c[list(cols)] = c_sub
            res = float(np.sqrt(np.mean((W @ c - one) ** 2)))
            if res < best[1]:
                best = (c, res)
    return [float(v) for v in best[0]], best[1]


def _lstsq2(X, y) -> tuple:
    """Least squares of y ~ X c (two columns) on relative residuals, c >= 0."""
    c, res = _nnls(X, y)
    return c[0], c[1], res


FAN_BYTES = (616, 63_100, 631_000)
FAN_REPS = 25


def _follower(port: int, i: int, keys: list) -> None:
    """One follower process: a blocking ``get`` of each key in turn, noting when each answer
    came (``time.monotonic``, one clock for every process of this machine)."""
    c = _client(port)
    got = []
    for key in keys:
        c.add(f"back/{key}", 1)       # about to wait in the get
        c.get(key)
        got.append(time.monotonic())
    c.set(f"got/{i}", json.dumps(got).encode())


def _fanout(ctx, c, port: int, k: int) -> list:
    """The publish's fan-out to k follower processes (module doc): per value size, the median
    over FAN_REPS of (the last follower's answer - the set)."""
    keys = [f"dec/{k}/{B}/{j}" for B in FAN_BYTES for j in range(FAN_REPS)]
    procs = [ctx.Process(target=_follower, args=(port, i, keys), daemon=True) for i in range(k)]
    for p in procs:
        p.start()
    sent = []
    for key in keys:
        B = int(key.split("/")[2])
        while int(c.add(f"back/{key}", 0)) < k:  # every follower is on its way to the get
            time.sleep(0.002)
        time.sleep(0.02)                         # ... and in it
        t0 = time.monotonic()
        c.set(key, b"y" * B)
        sent.append(t0)
    got = [json.loads(c.get(f"got/{i}")) for i in range(k)]
    for p in procs:
        p.join(30)
    out = []
    for bi, B in enumerate(FAN_BYTES):
        idx = range(bi * FAN_REPS, (bi + 1) * FAN_REPS)
        xs = [max(g[j] for g in got) - sent[j] for j in idx]
        out.append({"k": k, "bytes": B, "seconds": statistics.median(xs)})
    return out


def measure_store(reps: int, fanout: list) -> dict:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_server, args=(q, stop), daemon=True)
    proc.start()
    port = q.get(timeout=60)
    try:
        c = _client(port)
        c.add("warm", 1)
        rtt = _median_time(lambda i: c.add("cnt", 1), reps)
        gets = []
        for B in (616, 10_000, 100_000, 631_000, 2_500_000):
            c.set(f"v{B}", b"x" * B)
            t = _median_time(lambda i: c.get(f"v{B}"), max(20, reps // (1 + B // 50_000)))
            gets.append({"bytes": B, "seconds": t})
        a, beta, res = _lstsq2([[1.0, g["bytes"]] for g in gets], [g["seconds"] for g in gets])
        fans = []
        for k in fanout:
            fans += _fanout(ctx, c, port, k)
        (flat, fop, fbeta), fres = _nnls([[1.0, f["k"], f["k"] * f["bytes"]] for f in fans],
                                         [f["seconds"] for f in fans])
    finally:
        stop.set()
        proc.join(5)
    return {"rtt": rtt, "get_fit": {"rtt": a, "beta": beta, "rel_rms": res}, "beta": beta,
            "gets": gets, "fan_latency": flat, "fan_op": fop, "fan_beta": fbeta,
            "fan_rel_rms": fres, "fanout": fans}


# ----------------------------------------------------------------------------- the decision body
class _Channel:
    """log_loop's channel, in memory: the decider takes the encoded log lines in order, at most
    ``batch`` a time and none of a step after the one it is deciding (as in a run, where no rank
    computes step t + 1 before step t is decided); the followers read what it published."""

    def __init__(self, lines: list, batch: int, published: dict):
        self.lines, self.batch, self.published = lines, int(batch), published
        self.pos, self.length, self.agent = 0, 0, None
        self.slack = self.grace = 0.0

    def next_rows(self, deadline):
        from pgc_hvd.runtime.control_log import decode_rows
        out = []
        while (self.pos < len(self.lines) and len(out) < self.batch
               and (not out or self.lines[self.pos][0] <= self.agent.step)):
            out.extend(decode_rows(self.lines[self.pos][1], self.length))
            self.pos += 1
        return out or None

    def publish(self, step, batches, error=None, wait=None):
        from pgc_hvd.runtime.control_log import encode_batches
        if error is not None:
            raise error
        self.published[step] = encode_batches(batches)

    def decision(self, step):
        from pgc_hvd.runtime.control_log import LogRecord, decode_batches
        return LogRecord(batches=decode_batches(self.published[step], self.length))


def _body(scheme, rank: int, channel):
    """The decision body log_loop runs (a real Decider and ArrivalBook) and its ``fire``
    without the data phase (its cost is the data plane's, modelled apart): (decider, fire,
    the count of fired steps)."""
    from pgc_hvd.runtime.rows import ArrivalBook, Decider, ctrl_len
    dec = Decider(scheme, rank, ArrivalBook(scheme.n, scheme.lookback, 0))
    fired = [0]
    channel.agent, channel.length = dec, ctrl_len(scheme.lookback, 0)

    def fire(decision, ctl):
        fired[0] += 1
        dec.next_round()

    return dec, fire, fired


def log_lines(n: int, lookback: int, steps: int, seed: int) -> list:
    """(step, encoded log line) of a run: per step every rank's message row (ready times in
    random order), then every rank's done row (step ``steps``)."""
    import numpy as np
    import torch
    from pgc_hvd.runtime.agent import Outgoing
    from pgc_hvd.runtime.control_log import encode_rows
    from pgc_hvd.runtime.rows import ctrl_len, pack_row
    rng = np.random.default_rng(seed)
    L = ctrl_len(lookback, 0)
    lines = []
    for t in range(steps):
        ready = t + rng.random(n)
        for w in np.argsort(ready):
            slots = tuple(range(max(0, t - lookback + 1), t + 1))
            out = Outgoing(t, t, torch.zeros(1), float(ready[w]), loss=0.5, slot_versions=slots)
            row = pack_row(torch.empty(L, dtype=torch.float64), out, ring_size=lookback).tolist()
            lines.append((t, encode_rows([(int(w), row)])))
    for w in range(n):
        row = pack_row(torch.empty(L, dtype=torch.float64), None, ring_size=lookback,
                       done=1.0 + steps).tolist()
        lines.append((steps, encode_rows([(w, row)])))
    return lines


def _run_roles(n: int, s: int, lines: list, batch: int) -> dict:
    """Thread seconds, body runs and rows of log_loop's decider, then follower, branches."""
    from pgc_hvd.runtime.control_log import log_loop
    from pgc_hvd.schemes import get_scheme
    published: dict = {}
    out = {}
    for role, rank in (("decider", 0), ("follower", 1)):
        chan = _Channel(lines, batch, published)
        dec, fire, fired = _body(get_scheme("pgc-cr", n, s), rank, chan)
        t0 = time.thread_time()
        log_loop(dec, chan, fire, timeout=3600.0)
        out[role] = {"seconds": time.thread_time() - t0, "runs": dec.control_rounds,
                     "rows": len(lines), "fired": fired[0]}
    return out


def measure_body(n: int, steps: int, seed: int = 0, s: int | None = None) -> dict:
    """The body's cost at this n: log_loop run once with batches of 1 row and once with
    batches of up to K = max(4, n // 4) rows; per role, seconds = runs * run + rows * row,
    solved from the two runs (``row`` >= 0)."""
    from pgc_hvd.schemes import get_scheme
    s = max(1, n // 16) if s is None else int(s)
    lines = log_lines(n, get_scheme("pgc-cr", n, s).lookback, steps, seed)
    K = max(4, n // 4)
    one, many = _run_roles(n, s, lines, 1), _run_roles(n, s, lines, K)
    out = {"n": n, "s": s, "steps": steps, "rows": len(lines), "batch": K,
           "by_row": one, "by_batch": many}
    for role in ("decider", "follower"):
        (r1, m1, t1), (r2, m2, t2) = [(x[role]["runs"], x[role]["rows"], x[role]["seconds"])
                                      for x in (one, many)]
        det = r1 * m2 - r2 * m1
        run = (t1 * m2 - t2 * m1) / det
        row = (r1 * t2 - r2 * t1) / det
        if row < 0 or run < 0:   # noise: one coefficient only, fitted to both runs
            if row < 0:
                row, run = 0.0, (t1 + t2) / (r1 + r2)
            else:
                run, row = 0.0, (t1 + t2) / (m1 + m2)
        out[role] = {"run": run, "row": row, "per_row_by_row": t1 / m1}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--ns", default="4,16,64,256,1024")
    p.add_argument("--reps", type=int, default=400)
    p.add_argument("--fanout", default="1,2,4,8")
    p.add_argument("--rows", type=int, default=12000,
                   help="about this many rows per n for the decision body (at least 3 steps)")
    p.add_argument("--s", type=int, default=None,
                   help="PGC-CR's s at every n for the decision body (default max(1, n // 16), "
                        "the scale model's; a fixed s keeps the row's s + 1 slot words the same "
                        "at every n)")
    args = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    t0 = time.time()
    store = measure_store(args.reps, [int(k) for k in args.fanout.split(",")])
    print(f"[log] store: rtt {store['rtt'] * 1e6:.1f} us, get beta "
          f"{store['beta'] * 1e9:.3f} ns/B, fan-out {store['fan_latency'] * 1e6:.1f} us + "
          f"({store['fan_op'] * 1e6:.1f} us + {store['fan_beta'] * 1e9:.3f} ns/B) per follower "
          f"(rel. RMS {store['fan_rel_rms']:.2f})", file=sys.stderr, flush=True)
    bodies = []
    for n in [int(x) for x in args.ns.split(",")]:
        b = measure_body(n, max(3, args.rows // n), s=args.s)
        bodies.append(b)
        print(f"[log] n={n}: body run + per row: decider {b['decider']['run'] * 1e6:.1f} us + "
              f"{b['decider']['row'] * 1e6:.2f} us, follower {b['follower']['run'] * 1e6:.1f} "
              f"us + {b['follower']['row'] * 1e6:.2f} us ({b['rows']} rows, batches of 1 and "
              f"{b['batch']})", file=sys.stderr, flush=True)
    doc = {"format": FORMAT,
           "command": "python benchmarks/control/measure_log_control.py " + " ".join(
               sys.argv[1:] if argv is None else argv),
           "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "torch": torch.__version__},
           "load_average": {"before": load0, "after": os.getloadavg()},
           "seconds": time.time() - t0,
           "store": store, "body": {"samples": bodies}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
