"""The control row: what every rank tells the others each control round (float64 words).

======================  ==========================================================================
field                   meaning
======================  ==========================================================================
``CTRL_READY_STEP``     step of the oldest message not yet offered, -1 when none
``CTRL_VERSION``        model version that message was computed at
``CTRL_READY_TIME``     ``time.time()`` when it became ready (orders arrivals across ranks)
``CTRL_LOSS``           training loss reported with it (nan when none)
``CTRL_BUSY``           cumulative busy seconds of the rank's training thread
``CTRL_BAD_STEP``       newest step whose message held NaN/Inf, -1 when none
``CTRL_DONE``           1 when the rank's training loop has finished
``CTRL_FAILED``         1 when the rank's training thread raised
``CTRL_PAYLOAD``        1 when the message's payload follows this row in the same allgather
``CTRL_C_BOUND``        rank 0 only: the staleness bound c requested for the scheme, -1 = none
``CTRL_ERROR``          ||C(u) - u||, the message's compression error (nan when not sent)
``CTRL_FIXED`` + i      version of ring slot i of the message (``ring_size`` entries, -1 padded)
``metrics_at(r)`` + j   user metric j reported with the message (``metrics`` = k entries, fixed when
                        the agent is built, default 0; nan when none), :func:`metric_values`
======================  ==========================================================================

A row is ``ctrl_len(ring_size, metrics)`` = 11 + ring_size + k float64 words, 8 (11 + L + k)
bytes per rank per control round.

Packed form (optimistic one-collective rounds, :class:`~pgc_hvd.runtime.channel.AllgatherChannel`):
one 1-D float32 tensor per rank, the row's float64 words bit-cast to 2 ``ctrl_len`` float32
words, followed by the payload row when ``CTRL_PAYLOAD`` is set; :func:`parse_packed` splits the
allgathered concatenation back into rows and payloads.
"""

from __future__ import annotations

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
CTRL_C_BOUND = 9
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
