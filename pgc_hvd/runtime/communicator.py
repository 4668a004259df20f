"""The data plane: one decision in, one update out (GRACE's communicator).

Owns how the decided update g_hat = Re sum_{u in uses} a_u D(p_u) reaches every rank once the
control rows have decided a step (:mod:`pgc_hvd.runtime.agent`'s module doc has the protocol):
the payloads cached from control rounds (optimistic rounds), the choice of collective
(:func:`pgc_hvd.compress.codecs.choose_collective`, the same on every rank), this rank's
weighted contribution sum_{u owned} a_u D(p_u), the allreduce (fp32, or fp16 with its
``narrow_reduce`` and the fp32 repeat on overflow) or the allgather of the chosen rows, the
decode in (worker, step) order, the bytes received, and the recycled buffers
(:class:`BufferPool`). This rank's own messages are read through ``own(step)``
(the agent's outbox: the handoff is the agent's).

Runs on the agent thread. May import: ``compress`` (codecs, transport), ``runtime.channel``
and torch.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

import torch

from pgc_hvd.compress.codecs import Codec, DenseCodec, fp16_finite
from pgc_hvd.compress.codecs import allreduce_bytes, alltoall_reduce_bytes, choose_collective

log = logging.getLogger("pgc_hvd.runtime")

#: how a sum of fp16 contributions moves (module doc, :meth:`Communicator._allreduce_narrow`)
NARROW_REDUCE = ("auto", "alltoall", "allreduce")


class BufferPool:
    """Recycles flat float32 buffers of one size per size. A fresh buffer of tens of MB is
    mmap'ed by the allocator and page-faulted (zeroed by the kernel) at its first write, every
    step, which cost as much as a pass over it; the payload rows and decoded updates therefore
    come from here and go back when the agent is done with them. At most ``keep`` free
    buffers of each size are held, so memory stays bounded."""

    def __init__(self, device, keep: int = 4):
        self.device, self.keep = device, int(keep)
        self._free: dict[tuple, list] = {}   # (numel, dtype) -> free buffers
        self._lock = threading.Lock()

    def get(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        with self._lock:
            free = self._free.get((int(numel), dtype))
            if free:
                return free.pop()
        return torch.empty(int(numel), dtype=dtype, device=self.device)

    @property
    def free_buffers(self) -> int:
        """Buffers held for reuse (all sizes)."""
        with self._lock:
            return sum(len(v) for v in self._free.values())

    def put(self, buf: Optional[torch.Tensor]) -> None:
        if buf is None or buf._base is not None or not buf.is_contiguous():
            return   # views are not ours to recycle
        with self._lock:
            free = self._free.setdefault((buf.numel(), buf.dtype), [])
            if len(free) < self.keep:
                free.append(buf)



class Communicator:
    """One decision in, one update out (module doc). ``coll``: the agent's
    :class:`~pgc_hvd.runtime.channel.Collectives`; ``own(step)``: this rank's message of
    ``step`` (an :class:`~pgc_hvd.runtime.agent.Outgoing`)."""

    def __init__(self, coll, codec: Codec, *, n: int, d: int, rank: int, device,
                 own: Callable, narrow_reduce: str = "auto"):
        self.coll, self.codec = coll, codec
        self.n, self.d, self.rank, self.device = int(n), int(d), int(rank), device
        self.width = int(codec.width)
        self._own = own
        self.pool = BufferPool(device)
        #: the overlap (:mod:`pgc_hvd.runtime.overlap`): dense fp32 sums move bucket by bucket
        #: (None: in one allreduce); ``stop()`` ends a wait for a streamed bucket (the agent's)
        self.buckets = None
        self.stop: Optional[Callable[[], bool]] = None
        #: (worker, step) -> payload row received with its control row, or kept for reuse
        self.cache: dict = {}
        self.bytes_since = 0          # bytes received since the last update
        self.data_rounds = 0
        self._step = 0
        dev_type = torch.device(device).type if device is not None else "cpu"
        if narrow_reduce not in NARROW_REDUCE:
            raise ValueError(f"narrow_reduce={narrow_reduce!r}: use one of {NARROW_REDUCE} "
                             f"(how an fp16 sum of contributions moves; 'auto' = 'alltoall' "
                             f"on CPU, 'allreduce' on GPU)")
        if narrow_reduce == "auto":
            narrow_reduce = "alltoall" if dev_type == "cpu" else "allreduce"
        self.narrow_reduce = narrow_reduce

    def received(self, payloads: dict) -> None:
        """Payloads that rode with a control round (``{(worker, step): row}``): cached."""
        for key, p in payloads.items():
            self.cache[key] = p
            if key[0] != self.rank:
                self.bytes_since += p.numel() * p.element_size()

    def combine(self, decision, keep: set, offered: set) -> tuple:
        """The decision's update g_hat = Re sum_u a_u D(p_u), through the collective
        :func:`~pgc_hvd.compress.codecs.choose_collective` picks (module doc): payloads
        cached with their control rows are decoded locally by every rank; the missing ones move
        in one allreduce of the owners' weighted contributions or one allgather of their rows.
        ``keep``: what the scheme may use again (kept in the cache); ``offered``: the messages
        already offered. Returns ``(flat, kind, fp16 fallback, uses in (worker, step) order)``."""
        codec = self.codec
        self._step = decision.step
        uses = sorted(decision.uses, key=lambda u: (u.worker, u.step))
        missing = [u for u in uses if (u.worker, u.step) not in self.cache]
        kind = choose_collective(sparse=codec.sparse, n=self.n, d=self.d, width=self.width,
                                 needed=len(missing), itemsize=codec.wire_itemsize)
        received: dict = {}
        fallback = False
        if kind == "allreduce":
            mine = [u for u in missing if u.worker == self.rank]
            if self.buckets is not None and codec.wire_dtype == torch.float32:
                flat = self._bucketed(mine)
                self.bytes_since += int(allreduce_bytes(self.n, self.d))
            elif codec.wire_dtype == torch.float32:
                flat = self._contribution(mine, keep)
                self.coll.allreduce_sum_(flat, "sum")
                self.bytes_since += int(allreduce_bytes(self.n, self.d))
            else:
                flat, fallback, nbytes = self._allreduce_narrow(mine, keep)
                self.bytes_since += nbytes
            self.data_rounds += 1
            cached = [u for u in uses if (u.worker, u.step) in self.cache]
            if cached:
                codec.add_weighted(flat, [self.cache[(u.worker, u.step)] for u in cached],
                                   [u.weight for u in cached], accumulate=True)
        else:
            if kind == "allgather":
                mine = [u for u in missing if u.worker == self.rank]
                rows = [self._own(u.step).payload for u in mine]
                send = (torch.stack(rows) if rows else
                        torch.zeros((0, self.width), dtype=torch.float32, device=self.device))
                got = self.coll.allgather(send, "data")
                self.data_rounds += 1
                self.bytes_since += (got.numel() - send.numel()) * got.element_size()
                for i, u in enumerate(missing):   # rank order = (worker, step) order
                    received[(u.worker, u.step)] = got[i]
            flat = self.pool.get(self.d)
            rows = [self.cache.get((u.worker, u.step), received.get((u.worker, u.step)))
                    for u in uses]
            codec.add_weighted(flat, rows, [u.weight for u in uses])
        # keep only what the scheme may use again and payloads of messages not offered yet
        # (shown in a control row after the decision fired)
        for key, m in received.items():
            if key in keep:
                self.cache[key] = m
        self.cache = {k: v for k, v in self.cache.items()
                      if k in keep or (k not in offered and k[1] >= decision.step)}
        return flat, kind, fallback, uses

    def take_bytes(self) -> int:
        """Bytes received since the last call (reset)."""
        out, self.bytes_since = int(self.bytes_since), 0
        return out

    def _bucketed(self, mine: list) -> torch.Tensor:
        """The sum of the contributions bucket by bucket (:mod:`pgc_hvd.runtime.overlap`): one
        allreduce per bucket in bucket order, this rank's bucket k = sum_{u owned} a_u times
        bucket k of its message, waited for while the training thread still forms it (a
        streamed message), zeros when it owns no use."""
        flat = self.pool.get(self.d)
        outs = [self._own(u.step) for u in mine]
        for k, (lo, hi) in enumerate(self.buckets.ranges):
            seg = flat[lo:hi]
            if not mine:
                seg.zero_()
            for i, (u, out) in enumerate(zip(mine, outs)):
                if out.stream is not None:
                    out.stream.wait(k, self.coll.timeout, rank=self.rank, step=u.step,
                                    stop=self.stop)
                src = out.payload[lo:hi]
                if i == 0:
                    torch.mul(src, float(u.weight), out=seg)
                else:
                    seg.add_(src, alpha=float(u.weight))
            self.coll.allreduce_sum_(seg, "sum")
        return flat

    def _contribution(self, mine: list, keep: set) -> torch.Tensor:
        """This rank's sum_{u owned} a_u D(p_u) as a dense fp32 d-vector (zeros when it owns
        none). A single dense use that no later decision needs is scaled in place, and its
        buffer becomes the update (no copy, no new buffer)."""
        codec = self.codec
        if (len(mine) == 1 and isinstance(codec, DenseCodec)
                and (mine[0].worker, mine[0].step) not in keep):
            out = self._own(mine[0].step)
            if out.packed is not None and out.payload.data_ptr() == out.packed.data_ptr() \
                    and out.packed.numel() == self.d:
                out.consumed = True
                return out.payload.mul_(float(mine[0].weight))
        flat = self.pool.get(self.d)
        codec.add_weighted(flat, [self._own(u.step).payload for u in mine],
                           [u.weight for u in mine])
        return flat

    def _allreduce_narrow(self, mine: list, keep: set) -> tuple[torch.Tensor, bool, int]:
        """The sum over ranks of the contributions with the bytes in the codec's narrow
        ``wire_dtype`` (fp16: half the bytes), c_r = this rank's sum_{u owned} a_u D(p_u),
        rounded once to fp16 (:meth:`~pgc_hvd.compress.codecs.Fp16Codec.add_weighted_narrow`).
        Two ways, both 2 (n-1)/n * 2d bytes received (``narrow_reduce``):

        * ``"alltoall"`` (default on CPU): the n fp16 vectors are cut into n chunks of
          m = ceil(d/n); an alltoall hands rank j the j-th chunk of every rank, rank j sums
          them in fp32 in rank order and rounds once to fp16, and an allgather of the summed
          chunks hands every rank the same fp16 update: fp16(sum_r fp16(c_r)), |error| <=
          2^-11 (|g| + sum_r |c_r|) entrywise. Horovod's fp16 allreduce over Gloo on CPU
          measured 3x slower than its fp32 one at d = 11.7M here (benchmarks/data_plane/fp16_bytes.py):
          the fp16 ring would lose more time than the bytes save; this sums with torch, in
          fp32.
        * ``"allreduce"`` (default on GPU, where NCCL sums fp16 natively): one in-place fp16
          ring allreduce, Horovod's fp16 compression: each partial sum rounded to fp16,
          |error| <= about (n + 1) 2^-11 sum_r |c_r|.

        Returns ``(update, fell_back, bytes)``. When the summed fp16 update is not finite (a sum
        passed 65504) every rank sees it (the same bits everywhere) and every rank repeats the
        sum in fp32 from its contributions (the payloads are still in its outbox): one more
        allreduce, this step only; an overflowed sum is never applied."""
        codec, n, d = self.codec, self.n, self.d
        payloads = [self._own(u.step).payload for u in mine]
        weights = [u.weight for u in mine]
        chunk = -(-d // n) if self.narrow_reduce == "alltoall" else d
        narrow = self.pool.get(chunk * n if self.narrow_reduce == "alltoall" else d,
                               codec.wire_dtype)
        spare: list = []                           # back to the pool once the sum is read
        try:
            scratch = self.pool.get(d) if len(mine) > 1 or codec.sparse else None
            codec.add_weighted_narrow(narrow[:d], payloads, weights, scratch)
            self.pool.put(scratch)
            if self.narrow_reduce == "alltoall":
                narrow[d:].zero_()
                recv = self.pool.get(n * chunk, codec.wire_dtype)
                spare.append(recv)
                got = self.coll.alltoall(narrow, "a2a16", out=recv).view(n, chunk)
                acc = self.pool.get(chunk)
                acc.copy_(got[0])
                for j in range(1, n):
                    acc.add_(got[j])
                mine16 = narrow[:chunk]            # reused: the alltoall's input is done with
                mine16.copy_(acc)
                self.pool.put(acc)
                gathered = self.pool.get(n * chunk, codec.wire_dtype)
                spare.append(gathered)
                summed = self.coll.allgather(mine16, "ag16", out=gathered)[:d]
                self.data_rounds += 1          # two collectives
                nbytes = int(alltoall_reduce_bytes(n, d, codec.wire_itemsize))
            else:
                self.coll.allreduce_sum_(narrow, "sum16")
                summed = narrow
                nbytes = int(allreduce_bytes(n, d, codec.wire_itemsize))
            if fp16_finite(summed):
                flat = self.pool.get(d)
                flat.copy_(summed)
                return flat, False, nbytes
        finally:
            for buf in [narrow] + spare:
                self.pool.put(buf)
        if self.rank == 0:
            log.warning("step %d: the fp16 sum of the contributions overflowed (beyond 65504); "
                        "repeated in fp32 for this step", self._step)
        flat = self._contribution(mine, keep)
        self.coll.allreduce_sum_(flat, "sum")
        self.data_rounds += 1
        return flat, True, nbytes + int(allreduce_bytes(n, d))
