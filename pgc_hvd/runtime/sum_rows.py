"""The s = 0 step: the control rows ride in the data allreduce, and no control round runs.

When the scheme in force waits for every rank (``scheme.wait_for == n``: dgd, any scheme built
with s = 0, which is where ``stragglers="auto"`` starts), the decision of step t is known
before any row arrives: every rank's message of step t, with the weights of the scheme's full
round (:meth:`~pgc_hvd.schemes.protocol.Scheme.full_round_weights`). The control plane (a row
appended, rank 0's decision broadcast and replayed) only delays the data collective, which is
the step's barrier anyway, as in DDP. So here, per step t, each rank (the thread that runs
its round, below):

1. waits for its own event of step t: its message submitted, or its message of t non-finite,
   its loop done, its training thread failed (no other rank is waited for here);
2. forms [a_r m_r | n row slots]: its message times its full-round weight a_r (in place: the
   payload buffer has room for the slots, :meth:`~pgc_hvd.runtime.agent.CommAgent.payload_buffer`),
   zeros when it has none; its control row (:func:`~pgc_hvd.runtime.rows.pack_row`, the
   fields every row carries: loss, busy seconds, non-finite step, done, failed, slot
   versions, user metrics) in its own slot, zeros in the others' (:func:`split_rows`: each
   float64 word as three float32 words, which a sum with zeros keeps);
3. joins ONE allreduce (sum) of it (with the overlap, bucket by bucket, the slots with the
   bucket that ends the vector: :meth:`~pgc_hvd.runtime.communicator.Communicator.bucketed`):
   every rank gets the same update and every rank's row (:func:`join_rows`);
4. runs the decision body (:class:`~pgc_hvd.runtime.rows.Decider`, the polled path's, on all
   n rows) on those rows: the scheme's Decision, identical on every rank and checked against
   the weights summed (a bug otherwise), goes to the agent's ``fire`` with the sum as its
   update (``Update``, ``Report``, ``on_decided(update, rows)``: as on the control plane);
   ``END`` when every rank is done; a failed rank, a non-finite message or ranks whose loops
   ended at different versions raise on every rank, as the control plane's body does.

Faults: a dead rank fails the allreduce at once (its peers' connections reset), a hung one
lets it time out (``timeout``); then the census over the control log's store names it, as on
the data-collective failure path of the control plane (the log channel is built as usual and
carries no rows here). Bytes: the allreduce's of d + n (3 ``ctrl_len``) fp32 words. What
cannot take this path keeps the control plane (:meth:`~pgc_hvd.runtime.config.RuntimeConfig.
rows_in_sum`, the one place it is chosen): s >= 1, bounded staleness (late messages),
top-kappa, fp16 wire, optimistic payloads, complex codes, replayed arrivals, the polled planes.

Which thread: without the overlap (``agent.inline``) the training thread runs each round itself
in ``submit`` (:meth:`SumRows.inline`: no hand-off to the agent thread and back), and the agent
thread serves only the rounds after this rank is done or failed (:meth:`SumRows.loop` with
``opened``); with the overlap the agent thread runs them all (:meth:`SumRows.loop`).

Owns :class:`SumRows` (the s = 0 round, its loop and its checks) and the rows as float32 words
(:func:`split_rows`, :func:`join_rows`). Threads: the training thread (built in the agent's
construction; :meth:`SumRows.inline`), the agent thread (:meth:`SumRows.loop`).
May import: numpy, torch, the standard library, ``compress`` (codecs), ``schemes``,
``runtime.errors``, ``runtime.rows``.
"""

from __future__ import annotations

import numpy as np
import torch

from pgc_hvd.compress.codecs import allreduce_bytes
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import CTRL_BAD_STEP, CTRL_DONE, END
from pgc_hvd.schemes import Decision, Use

#: float32 words per float64 word of a row in its slot: hi, mid and lo parts
PIECES = 3


def split_rows(rows) -> np.ndarray:
    """float64 words (a tensor or an array) -> ``PIECES`` float32 words each (``[hi..., mid...,
    lo...]``): x = hi + mid + lo to the last bit for finite x (each part is the float32 rounding
    of what the previous ones left), so a sum with zeros (the other ranks' contribution to a
    slot) gives them back; Inf and NaN keep hi alone. In numpy: a few words cost
    microseconds, where each torch op costs several."""
    x = np.asarray(rows.numpy() if isinstance(rows, torch.Tensor) else rows,
                   dtype=np.float64).reshape(-1)
    out = np.empty(PIECES * x.size, dtype=np.float32)
    hi, mid, lo = out[: x.size], out[x.size: 2 * x.size], out[2 * x.size:]
    big = np.abs(x) > 3e38           # Inf, or beyond float32 (NaN is not > 3e38)
    odd = big.any()
    hi[:] = np.where(big, 0.0, x) if odd else x
    rest = x - hi if not odd else np.where(big, 0.0, x) - hi
    mid[:] = rest
    lo[:] = rest - mid
    if odd:
        hi[big] = np.copysign(np.inf, x[big])
    return out


def join_rows(words, n: int, length: int) -> list:
    """The n rows of ``length`` float64 words from their slots (:func:`split_rows` of each
    rank's row, rank after rank), as lists of floats (what the decision body reads)."""
    if isinstance(words, torch.Tensor):
        words = words.detach().cpu().numpy()
    w = np.asarray(words, dtype=np.float64).reshape(int(n), PIECES, int(length))
    return ((w[:, 0] + w[:, 1]) + w[:, 2]).tolist()


class SumRows:
    """The s = 0 path of one agent (module doc): the scheme's full-round ``weights``, the
    slots' size (``tail`` fp32 words after the d-vector) and the loop."""

    def __init__(self, scheme, rank: int, length: int):
        self.n, self.rank, self.length = int(scheme.n), int(rank), int(length)
        weights = scheme.full_round_weights()
        if weights is None:
            raise ValueError(f"{scheme.name} (n={scheme.n}, s={scheme.s}) does not decide every "
                             f"step from all n messages: its steps need the control plane")
        self.weights = weights
        self.words = PIECES * self.length
        self.tail = self.n * self.words
        self._row = torch.empty(self.length, dtype=torch.float64)

    # -- the agent thread, or the training thread (inline) ----------------------------------
    def loop(self, agent, opened: bool = False) -> None:
        """The agent thread's loop (module doc): each round once this rank's event of its
        step came; ``opened``: the training thread ran the rounds so far (``inline``), the
        thread takes over at the end (this rank done or failed)."""
        if not opened:
            agent.decider.open_round()
        while self.round(agent, self._ready(agent.handoff, agent.decider.step)) is not END:
            pass

    def inline(self, agent, out) -> None:
        """``agent.inline`` (s = 0 without the overlap): this rank's round of the open step,
        run by the training thread itself in its ``submit`` (no hand-off to the agent thread
        and back); what stops it is the agent's error, as on the thread (``agent.stop_on``)."""
        if agent.error is not None:
            return
        try:
            if self.round(agent, out) is END:
                agent.channel.close()
        except BaseException as err:
            agent.stop_on(err)
            if not isinstance(err, Exception):
                raise

    def round(self, agent, out):
        """Step ``t = decider.step`` (module doc, 2.-4.) with this rank's message ``out`` of it
        (None: it has none, its row says why), on the agent's public parts: ``decider``,
        ``handoff``, ``comm``, ``channel`` (the census), ``census``, ``fire``. Returns END
        when every rank is done, else the Decision fired."""
        dec, hand, comm = agent.decider, agent.handoff, agent.comm
        d, t = comm.d, dec.step
        hand.pack(self._row, lambda outbox: (outbox.get(t), False))
        slots = np.zeros(self.tail, dtype=np.float32)
        at = self.rank * self.words
        slots[at: at + self.words] = split_rows(self._row)
        comm.coll.step = t
        try:
            buf = self._sum(comm, out, t, slots)
        except AgentError as err:
            census = getattr(agent.channel, "census", None)
            if census is None or not agent.census:
                raise
            # a dead or frozen rank stops the allreduce: the control store's census names it
            raise census(t, err) from err
        comm.data_rounds += 1
        comm.bytes_since += int(allreduce_bytes(self.n, buf.numel()))
        rows = join_rows(buf[d:], self.n, self.length)
        got = dec.decide(rows)
        if got is END:
            comm.pool.put(buf)
            return END
        if not isinstance(got, Decision):
            comm.pool.put(buf)
            raise AgentError(self._not_decided(t, rows))
        self._check(got, t)
        agent.fire(got, rows, summed=buf[:d])
        return got

    def _ready(self, hand, t: int):
        """Wait for this rank's own event of step ``t`` (module doc); its message, or None."""
        with hand.cond:
            while True:
                out = hand.outbox.get(t)
                if out is not None or hand.bad_step >= t or hand.done or hand.failed:
                    hand.wake = False
                    return out
                hand.cond.wait(1.0)

    def _sum(self, comm, out, t: int, slots: np.ndarray) -> torch.Tensor:
        """[sum_r a_r m_r | every rank's row]: this rank's part formed and allreduced."""
        d, weight = comm.d, self.weights[self.rank]
        comm.nonfinite_sum = False
        if out is not None and out.stream is not None:   # the overlap: bucket by bucket
            return comm.bucketed([Use(self.rank, t, t, weight)], tail=torch.from_numpy(slots))
        packed = out.packed if out is not None else None
        if (packed is not None and packed.numel() == d + self.tail
                and out.payload.data_ptr() == packed.data_ptr() and out.payload.numel() == d):
            buf = packed        # in place: the message's buffer becomes the update
            out.consumed = True
            if weight != 1.0:
                buf[:d].mul_(float(weight))
        else:
            buf = comm.pool.get(d + self.tail)
            comm.codec.add_weighted(buf[:d], [out.payload] if out is not None else [],
                                    [weight] if out is not None else [])
        buf[d:].copy_(torch.from_numpy(slots))
        comm.coll.allreduce_sum_(buf, "sum")
        return buf

    def _check(self, decision, t: int) -> None:
        """The decision must be the full round the allreduce summed (the same on every rank)."""
        uses = decision.uses
        if (len(uses) != self.n or any(u.step != t or self.weights.get(u.worker) != u.weight
                                       for u in uses)):
            raise AgentError(f"rank {self.rank}: step {t}: the scheme decided "
                             f"{[(u.worker, u.step, u.weight) for u in uses]}, not the full round "
                             f"the s = 0 path summed ({self.weights}): a bug")

    def _not_decided(self, t: int, rows: list) -> str:
        """Why step ``t`` cannot be decided from rows that show no failed rank and not every
        rank done: under s = 0 every rank must deliver its message of every step."""
        done = {w: int(r[CTRL_DONE]) - 1 for w, r in enumerate(rows) if r[CTRL_DONE] > 0}
        bad = [w for w, r in enumerate(rows) if int(r[CTRL_BAD_STEP]) == t]
        return (f"rank {self.rank}: step {t} cannot be decided: its scheme waits for every "
                f"rank (s = 0), but ranks {sorted(done)} finished their loop (at versions "
                f"{sorted(set(done.values()))}) and ranks {bad} sent a non-finite message for "
                f"it. Give every rank the same number of step() calls")


__all__ = ["PIECES", "SumRows", "join_rows", "split_rows"]
