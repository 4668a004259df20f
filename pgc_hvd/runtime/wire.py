"""The control row: what every rank tells the others each control round (float64 words).

Owns the row's layout, its packing (:func:`pack_row`) and parsing, and what is read back from
the rows alone (:func:`used_metrics`, :func:`not_decided_message`). May import: torch.

========================  ==========================================================================
field                     meaning
========================  ==========================================================================
``CTRL_READY_STEP``       step of the oldest message not yet offered, -1 when none
``CTRL_VERSION``          model version that message was computed at
``CTRL_READY_TIME``       ``time.time()`` when it became ready (orders arrivals across ranks)
``CTRL_LOSS``             training loss reported with it (nan when none)
``CTRL_BUSY``             cumulative busy seconds of the rank's training thread
``CTRL_BAD_STEP``         newest step whose message held NaN/Inf, -1 when none
``CTRL_DONE``             1 when the rank's training loop has finished
``CTRL_FAILED``           1 when the rank's training thread raised
``CTRL_PAYLOAD``          1 when the message's payload follows this row in the same allgather
``CTRL_STALENESS_BOUND``  rank 0 only: the staleness bound c requested for the scheme, -1 = none
``CTRL_ERROR``            ||C(u) - u||, the message's compression error (nan when not sent)
``CTRL_FIXED`` + i        version of ring slot i of the message (``ring_size`` entries, -1 padded)
``metrics_at(r)`` + j     user metric j reported with the message (``metrics`` = k entries, fixed
                          when the agent is built, default 0; nan when none), :func:`metric_values`
========================  ==========================================================================

A row is ``ctrl_len(ring_size, metrics)`` = 11 + ring_size + k float64 words, 8 (11 + L + k)
bytes per rank per control round.

Packed form (optimistic one-collective rounds, :class:`~pgc_hvd.runtime.channel.AllgatherChannel`):
one 1-D float32 tensor per rank, the row's float64 words bit-cast to 2 ``ctrl_len`` float32
words, followed by the payload row when ``CTRL_PAYLOAD`` is set; :func:`parse_packed` splits the
allgathered concatenation back into rows and payloads.
"""

from __future__ import annotations

import math

import torch

CTRL_READY_STEP = 0
CTRL_VERSION = 1
CTRL_READY_TIME = 2
CTRL_LOSS = 3
CTRL_BUSY = 4
CTRL_BAD_STEP = 5
CTRL_DONE = 6
CTRL_FAILED = 7
CTRL_PAYLOAD = 8
CTRL_STALENESS_BOUND = 9
CTRL_ERROR = 10
CTRL_FIXED = 11


def ctrl_len(ring_size: int, metrics: int = 0) -> int:
    """float64 words of one control row: the fixed fields, ``ring_size`` slot versions, then
    ``metrics`` user metric slots."""
    return CTRL_FIXED + int(ring_size) + int(metrics)


def metrics_at(ring_size: int) -> int:
    """Index of the first user metric slot of a row with ``ring_size`` slot versions."""
    return CTRL_FIXED + int(ring_size)


def slot_versions(row, ring_size: int | None = None) -> tuple:
    """The ring slot versions a control row carries (the -1 padding removed); give
    ``ring_size`` when the row also carries metrics (they follow the slot versions)."""
    end = None if ring_size is None else CTRL_FIXED + int(ring_size)
    return tuple(int(v) for v in row[CTRL_FIXED:end] if v >= 0)


def metric_values(row, ring_size: int, metrics: int) -> tuple:
    """The ``metrics`` user metric values a control row carries (nan: not reported)."""
    start = metrics_at(ring_size)
    return tuple(float(v) for v in row[start: start + int(metrics)])


def pack_row(row: torch.Tensor, out=None, *, ring_size: int, metrics: int = 0, busy: float = 0.0,
             bad_step: int = -1, done: float = 0.0, failed: bool = False,
             payload: bool = False, c_request=None) -> torch.Tensor:
    """Write one control row into ``row`` (float64, ``ctrl_len(ring_size, metrics)`` words):
    the message ``out`` (an :class:`~pgc_hvd.runtime.agent.Outgoing`: step, version, ready
    time, loss, compression error, slot versions, user metrics; None: no message, -1 and nan)
    and the rank's state (busy seconds, newest non-finite step, done = 1 + the version its loop
    ended at or 0, failed, payload follows, rank 0's requested staleness bound or None)."""
    row.fill_(-1.0)
    at = metrics_at(ring_size)
    if out is not None:
        row[CTRL_READY_STEP] = out.step
        row[CTRL_VERSION] = out.version
        row[CTRL_READY_TIME] = out.ready_time
        row[CTRL_LOSS] = out.loss
        row[CTRL_ERROR] = out.error_norm
        for i, v in enumerate(out.slot_versions[: ring_size]):
            row[CTRL_FIXED + i] = v
        for j in range(metrics):
            row[at + j] = float(out.metrics[j]) if out.metrics else math.nan
    else:
        row[CTRL_LOSS] = math.nan
        row[at: at + metrics] = math.nan
    row[CTRL_BUSY] = busy
    row[CTRL_BAD_STEP] = bad_step
    row[CTRL_DONE] = done
    row[CTRL_FAILED] = 1.0 if failed else 0.0
    row[CTRL_PAYLOAD] = 1.0 if payload else 0.0
    if c_request is not None:
        row[CTRL_STALENESS_BOUND] = c_request
    return row


class WireError(RuntimeError):
    """An allgathered control tensor does not parse: ranks disagree on the layout."""


def parse_packed(got: torch.Tensor, n: int, length: int, width: int) -> tuple[list, dict]:
    """Split an allgather of n packed rows ([2 ``length`` float32 words of the row | payload of
    ``width`` words when its CTRL_PAYLOAD is set], rank after rank) into (rows as lists of
    floats, ``{(rank, step): payload view}``)."""
    rows, payloads, off = [], {}, 0
    words = 2 * length
    for w in range(n):
        if off + words > got.numel():
            raise WireError(f"control allgather of {got.numel()} words ends inside rank {w}'s "
                            f"row: ranks disagree on the message layout")
        r = got[off: off + words].clone().view(torch.float64).tolist()
        off += words
        rows.append(r)
        if r[CTRL_PAYLOAD] > 0:
            payloads[(w, int(r[CTRL_READY_STEP]))] = got[off: off + width]
            off += width
    if off != got.numel():
        raise WireError(f"control allgather of {got.numel()} words does not parse ({off} "
                        f"expected): ranks disagree on the message layout")
    return rows, payloads


def used_metrics(uses, metric_meta: dict, k: int) -> dict:
    """The user metrics of the messages a decision used, from their control rows (the same
    rows on every rank, so every rank gets the same values; ``metric_meta``: (worker, step) ->
    its k values): ``metrics`` = per slot j, the mean of the finite values x_{u,j} over the used
    messages u (NaN where none was finite), ``metrics_count`` = how many were averaged per
    slot, ``metrics_from`` = the used messages ``(worker, step)`` in that order."""
    sums, counts = [0.0] * k, [0] * k
    for u in uses:
        vals = metric_meta.get((u.worker, u.step))
        if vals is None:
            continue
        for j, x in enumerate(vals):
            if math.isfinite(x):
                sums[j] += x
                counts[j] += 1
    return {"metrics": tuple(sm / c if c else math.nan for sm, c in zip(sums, counts)),
            "metrics_count": tuple(counts),
            "metrics_from": tuple((u.worker, u.step) for u in uses)}


def not_decided_message(rank: int, step: int, limit: float, *, rows, n: int, quiet: float,
                        ended_at, open_step: int, arrived: set, poll_interval: float) -> str:
    """Why ``step`` is not decided after ``limit`` seconds, from what the last control rows
    showed (``rows``, ``quiet`` seconds ago): a rank's loop ended (``ended_at``), no round
    completes (a rank died or hung), or the open round waits for named ranks."""
    head = f"rank {rank}: step {step} was not decided within {limit:.0f}s (timeout)"
    if ended_at is not None and step >= ended_at:
        return (f"{head}: a rank's training loop ended at version {ended_at}, and no "
                f"step from there on is decided. Every rank must run the same number of "
                f"updates: give every rank's loop the same number of step() calls (each "
                f"applies one update), e.g. `for i in range(steps)` or `while "
                f"optimizer.version < steps`, not a loop that ends on time or on local "
                f"data")
    if rows is None or quiet > min(limit / 2, 5.0 + 10 * poll_interval):
        return (f"{head}: no control round has completed for {quiet:.0f}s, so a rank has "
                f"died or hung (its process is frozen; the allgather cannot tell which rank, "
                f"control='store' names it)")
    waiting = [w for w in range(n) if w not in arrived and rows[w][CTRL_DONE] <= 0]
    return (f"{head}: the open round (step {open_step}) waits for ranks {waiting}, which are "
            f"alive (their control rows keep coming) but have not delivered a message: they "
            f"are slower than the timeout (raise timeout=) or their training loop hung")
