"""The data plane: one decision in, one update out (GRACE's communicator).

Owns how the decided update g_hat = Re sum_{u in uses} a_u D(p_u) reaches every rank once the
control rows have decided a step (:mod:`pgc_hvd.runtime.agent`'s module doc has the protocol):
the payloads cached from control rounds (optimistic rounds), the choice of collective
(:func:`pgc_hvd.compress.codecs.choose_collective`, the same on every rank), this rank's
weighted contribution sum_{u owned} a_u D(p_u), the allreduce (fp32, or fp16 with its
``narrow_reduce`` and the fp32 repeat on overflow) or the allgather of the chosen rows, the
decode in (worker, step) order, the bytes received, and the recycled buffers
(:class:`BufferPool`). This rank's own messages are read through ``own(step)``
(the agent's outbox: the handoff is the agent's). With the overlap (:mod:`pgc_hvd.runtime.
overlap`) a dense fp32 sum moves bucket by bucket (:meth:`Communicator.bucketed`), and a
message still being formed by the training thread is a :class:`Stream` (which of its buckets
are ready: the one object both threads touch for it, through its condition variable).

fp16 messages (``codec.wire_dtype`` float16: ``Fp16Codec``, ``Fp16SparseCodec``): payload rows
hold fp16 entries, riding payloads and the data allgather move half the bytes, and the sum of
contributions moves in fp16 (``narrow_reduce``), widened back to fp32; a sum that overflows
fp16 (seen identically on every rank) is repeated in fp32 for that step, never applied
(``info["fp16_fallback"]``). ``Update.info["bytes"]`` counts what really moved.

The collectives it runs on (:class:`Collectives`): asynchronous engine ops waited for with a
deadline (:func:`wait_for_handle`; a dead or hung rank raises :class:`~pgc_hvd.runtime.errors.
AgentError` instead of hanging), under stable names (``{name}.{kind}``, one op per kind in
flight), into recycled outputs through Horovod's private ``mpi_ops`` entry points where they
exist. The control channels (:mod:`pgc_hvd.runtime.channel`) run on the same object. The
user's unnamed Horovod ops are named from a count of their own (:func:`name_unnamed_ops`), so
pgc_hvd's collectives, issued by the agent thread at no fixed point of the user's program,
never shift their names. Which engine runs them is :mod:`pgc_hvd.runtime.engine`'s.

Threads: the agent thread; :func:`name_unnamed_ops`: the training thread, once, at the
optimizer's construction (its wrapper: whichever thread calls an op); :meth:`Stream.mark`:
the training thread.
May import: ``compress`` (codecs, encoder), ``runtime.errors``, torch and the standard
library.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
import time
import weakref
from typing import Callable, Optional

import torch

from pgc_hvd.compress.codecs import Codec, DenseCodec
from pgc_hvd.compress.encoder import fp16_finite
from pgc_hvd.compress.codecs import (all_finite, allreduce_bytes, alltoall_reduce_bytes,
                                     choose_collective)
from pgc_hvd.runtime.errors import AgentError

log = logging.getLogger("pgc_hvd.runtime")

#: how a sum of fp16 contributions moves (module doc, :meth:`Communicator._allreduce_narrow`)
NARROW_REDUCE = ("auto", "alltoall", "allreduce")


# ---- the collectives: deadlines, stable names, the user's unnamed ops named ------------------


#: the longest slice of a blocking wait between looks at its deadline and ``abort()``
BLOCK_SLICE = 0.05


def poll_until(ready, timeout: float, abort=None, nap=None) -> bool:
    """The runtime's one poll loop: call ``ready()`` until it returns true (True) or
    ``timeout`` seconds pass (False), or ``abort()`` (when given) says to give up (False).
    Short sleeps first, then at most 1 ms between polls. ``nap(seconds)``: the sleep
    between polls (default ``time.sleep``; one that returns early lets ``abort()`` serve an
    event at once). The cross-rank checks poll through it too (``runtime.agreement``)."""
    deadline = time.monotonic() + timeout
    sleep = 0.0001
    nap = time.sleep if nap is None else nap
    while not ready():
        if time.monotonic() > deadline or (abort is not None and abort()):
            return False
        nap(sleep)
        sleep = min(sleep * 1.5, 0.001)
    return True


def wait_for_handle(hvd, handle, timeout: float, abort=None, nap=None) -> bool:
    """Wait for an engine handle until it completes (True), ``timeout`` seconds pass or
    ``abort()`` says to give up (False). The torch engine (CPU tensors) blocks on it in slices
    of :data:`BLOCK_SLICE` (``wait_for``), so the agent wakes when the collective ends (a poll's
    sleep, up to 1 ms, was added to each of a step's collectives). A wait with a ``nap`` (a
    sleep that an event ends early: the control log's follower, which also writes the rows its
    training thread appends) and Horovod's handles are polled (:func:`poll_until`)."""
    block = getattr(hvd, "wait_for", None) if nap is None else None
    if block is not None:
        deadline = time.monotonic() + timeout
        while not block(handle, max(0.0, min(BLOCK_SLICE, deadline - time.monotonic()))):
            if time.monotonic() > deadline or (abort is not None and abort()):
                return False
        return True
    return poll_until(lambda: hvd.poll(handle), timeout, abort, nap)


class Collectives:
    """Horovod allgather / alltoall / in-place allreduce (sum) with a deadline, for one
    agent."""

    def __init__(self, hvd, rank: int, name: str, timeout: float, device=None):
        # an engine that matches collectives by call order (pgc_hvd.torchdist) gives each
        # agent its own process groups, never shared with the training thread (``device``: the
        # data plane's, which that engine checks against its backend)
        groups = getattr(hvd, "agent_ops", None)
        hvd = groups(name, timeout, device=device) if callable(groups) else hvd
        self.hvd, self.rank, self.name, self.timeout = hvd, int(rank), name, float(timeout)
        self.engine = getattr(hvd, "ENGINE", "Horovod")
        self.ops = 0
        self.step = 0          # the round being decided (for error messages)
        self._into = _output_entry_points(hvd)

    def cut_off(self) -> None:
        """Every later collective fails with AgentError (an abandoned world's agent that still
        runs must never take part in the next world's collectives)."""
        self.hvd = _Gone()
        self._into = None

    def _run(self, kind: str, start, timeout: Optional[float] = None, abort=None, nap=None):
        self.ops += 1
        name = f"{self.name}.{kind}"
        limit = self.timeout if timeout is None else float(timeout)
        try:
            handle = start(name)
            if not wait_for_handle(self.hvd, handle, limit, abort, nap):
                if abort is not None and abort():
                    raise AgentError(f"rank {self.rank}: collective {name} #{self.ops} (step "
                                     f"{self.step}) given up: another rank's collective "
                                     f"failed", broken_world=True)
                raise AgentError(
                    f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) got no "
                    f"answer within {limit:.0f}s: a rank has died or hung{self._who()}; "
                    f"stopping instead of hanging")
            return self.hvd.synchronize(handle)
        except AgentError:
            raise
        except Exception as err:
            raise AgentError(
                f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) failed: a "
                f"rank has died or shut down {self.engine}; stopping ({type(err).__name__}: "
                f"{err})", broken_world=True) from err

    def _who(self) -> str:
        """The engine's note on which ranks are gone (the torch engine's; Horovod has none)."""
        explain = getattr(self.hvd, "explain_failure", None)
        why = explain() if callable(explain) else ""
        return f" ({why})" if why else ""

    def allgather(self, tensor: torch.Tensor, kind: str,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The concatenation of every rank's ``tensor``; into ``out`` (a recycled buffer of the
        result's size: a fresh one of tens of MB is page-faulted at every step, 25-35% of the
        collective's time at 23 MB here) when given and this Horovod has the entry point."""
        if out is not None and self._into is not None:
            into, ps = self._into["allgather"], self._into["process_set"]
            return self._run(kind, lambda nm: into(tensor, out, nm, ps))
        return self._run(kind, lambda nm: self.hvd.allgather_async(tensor, name=nm))

    def alltoall(self, tensor: torch.Tensor, kind: str,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Equal splits: rank j receives the j-th of n equal chunks of every rank's ``tensor``,
        in rank order (``tensor.numel()`` must be a multiple of n); into ``out`` as
        :meth:`allgather`."""
        if out is not None and self._into is not None:
            into, ps = self._into["alltoall"], self._into["process_set"]
            splits = torch.empty(0, dtype=torch.int32)
            received = torch.empty(int(self.hvd.size()), dtype=torch.int32)
            got = self._run(kind, lambda nm: into(tensor, splits, out, received, nm, ps))
        else:
            got = self._run(kind, lambda nm: self.hvd.alltoall_async(tensor, name=nm))
        return got[0] if isinstance(got, (tuple, list)) else got

    def broadcast_(self, tensor: torch.Tensor, root: int, kind: str,
                   timeout: Optional[float] = None, abort=None, nap=None) -> torch.Tensor:
        """In place: every rank's ``tensor`` (same shape and dtype everywhere) becomes rank
        ``root``'s; waits up to ``timeout`` seconds (default: the agent's), or until
        ``abort()`` says to give up (AgentError, ``broken_world``); ``nap``: the sleep between
        polls (:func:`wait_for_handle`)."""
        hvd = self.hvd
        return self._run(kind, lambda nm: hvd.broadcast_async_(tensor, int(root), name=nm),
                         timeout, abort, nap)

    def allreduce_sum_(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """In-place sum over ranks: every rank ends with the same bits (the ring's allgather
        phase hands every rank the reduced chunks)."""
        hvd = self.hvd
        return self._run(kind, lambda nm: hvd.allreduce_async_(tensor, name=nm, op=hvd.Sum))


def _output_entry_points(hvd) -> Optional[dict]:
    """Horovod's allgather / alltoall entry points that take the output tensor (horovod.torch's
    ``mpi_ops._allgather_async(tensor, output, name, process_set)`` and ``_alltoall_async(tensor,
    splits, output, output_received_splits, name, process_set)``, what its public
    ``allgather_async`` / ``alltoall_async`` call with a fresh output), when they exist with
    exactly these parameters; None otherwise (the public calls are used)."""
    ops = getattr(hvd, "mpi_ops", None)
    ag, a2a = getattr(ops, "_allgather_async", None), getattr(ops, "_alltoall_async", None)
    ps = getattr(ops, "global_process_set", None)
    try:
        if (ag is None or a2a is None or ps is None
                or list(inspect.signature(ag).parameters) != ["tensor", "output", "name",
                                                              "process_set"]
                or list(inspect.signature(a2a).parameters) != [
                    "tensor", "splits", "output", "output_received_splits", "name",
                    "process_set"]):
            return None
    except (TypeError, ValueError):
        return None
    return {"allgather": ag, "alltoall": a2a, "process_set": ps}


class _Gone:
    """Stands in for Horovod in an abandoned agent: every collective fails."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise AgentError("pgc_hvd elastic: this agent's world was abandoned")
        return refuse


#: horovod.torch.mpi_ops' entry points that every public collective goes through, each with a
#: ``name`` parameter (None: Horovod names the op from its per-process handle counter)
_NAMED_ENTRY_POINTS = ("_allreduce_async", "_grouped_allreduce_async", "_allgather_async",
                       "_grouped_allgather_async", "_broadcast_async", "_alltoall_async",
                       "_reducescatter_async", "_grouped_reducescatter_async")


class _UserNames:
    """Names for the user's unnamed Horovod collectives from a count of those ops alone.

    Horovod names an unnamed op ``<op>.noname.<handle>``, the handle taken from a per-process
    counter that *every* op advances, pgc_hvd's own included. pgc_hvd's agent thread issues
    its (named) data collective when a step is decided, which is not at the same point of the
    user's program on every rank (a straggler's agent joins a step its training thread has not
    reached), so a user's unnamed op held across ``step()`` (``allreduce_async`` ... ``step()``
    ... ``synchronize``) could get a different handle, hence name, on each rank, and every rank
    would wait forever for a partner that never comes. Here an unnamed op is named
    ``<op>.user.<k>`` with k counting the unnamed ops alone: the user's program issues the same
    sequence on every rank, so the names match whatever pgc_hvd does between them."""

    def __init__(self):
        self._count = itertools.count()
        self._lock = threading.Lock()

    def next(self, kind: str) -> str:
        with self._lock:
            return f"{kind}.user.{next(self._count)}"

    def wrap(self, fn, kind: str, at: int):
        def named(*args, **kwargs):
            if "name" in kwargs:
                if kwargs["name"] is None:
                    kwargs["name"] = self.next(kind)
            elif len(args) > at and args[at] is None:
                args = args[:at] + (self.next(kind),) + args[at + 1:]
            return fn(*args, **kwargs)
        named.__wrapped__ = fn
        named._pgc_user_names = True
        return named


def name_unnamed_ops(hvd) -> bool:
    """Install :class:`_UserNames` on Horovod's entry points (once per process; idempotent).
    True when installed or already there; False for an engine without them (the torch
    engine matches collectives by call order per process group, and pgc_hvd's agent has
    groups of its own: nothing to do) or a Horovod whose entry points differ from 0.28's
    (checked by signature; then nothing is changed and the log control plane's guarantee is
    what holds: docs/architecture.md)."""
    ops = getattr(hvd, "mpi_ops", None)
    if ops is None:
        return False
    found = {}
    for attr in _NAMED_ENTRY_POINTS:
        fn = getattr(ops, attr, None)
        if fn is None:
            continue
        if getattr(fn, "_pgc_user_names", False):
            return True
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return False
        if "name" not in params:
            return False
        found[attr] = (fn, params.index("name"))
    if "_allreduce_async" not in found or "_allgather_async" not in found:
        return False
    names = _UserNames()
    for attr, (fn, at) in found.items():
        kind = attr.strip("_").replace("_async", "")
        setattr(ops, attr, names.wrap(fn, kind, at))
    return True


# ---- the data plane ----------------------------------------------------------------------


class BufferPool:
    """Recycles flat float32 buffers of one size per size. A fresh buffer of tens of MB is
    mmap'ed by the allocator and page-faulted (zeroed by the kernel) at its first write, every
    step, which cost as much as a pass over it; the payload rows and decoded updates therefore
    come from here and go back when the agent is done with them. At most ``keep`` free
    buffers of each size are held, so memory stays bounded."""

    def __init__(self, device, keep: int = 4):
        self.device, self.keep = device, int(keep)
        self._free: dict[tuple, list] = {}   # (numel, dtype) -> free buffers
        self._lent = weakref.WeakValueDictionary()   # id -> every buffer it made, while alive
        self._lock = threading.Lock()

    def get(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        with self._lock:
            free = self._free.get((int(numel), dtype))
            if free:
                return free.pop()
        buf = torch.empty(int(numel), dtype=dtype, device=self.device)
        self._lent[id(buf)] = buf
        return buf

    @property
    def free_buffers(self) -> int:
        """Buffers held for reuse (all sizes)."""
        with self._lock:
            return sum(len(v) for v in self._free.values())

    def put(self, buf: Optional[torch.Tensor]) -> None:
        if (buf is not None and buf._base is not None and buf.storage_offset() == 0
                and self._lent.get(id(buf._base)) is buf._base):
            buf = buf._base   # the head of one it lent (the s = 0 path's update: [d | rows])
        if buf is None or buf._base is not None or not buf.is_contiguous():
            return   # views are not ours to recycle
        with self._lock:
            free = self._free.setdefault((buf.numel(), buf.dtype), [])
            if len(free) < self.keep:
                free.append(buf)



class Stream:
    """Which buckets of one message the training thread has formed (module doc). The training
    thread calls :meth:`mark` (and :meth:`close` if it gives up); the agent calls :meth:`wait`
    before it reads bucket k of the payload."""

    def __init__(self, nbuckets: int):
        self.ready = [False] * int(nbuckets)
        self.closed = False
        self._cond = threading.Condition()

    def mark(self, k: int) -> None:
        with self._cond:
            self.ready[k] = True
            self._cond.notify_all()

    def close(self) -> None:
        """The training thread will form no more buckets (it failed): waiters stop."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    @property
    def complete(self) -> bool:
        return all(self.ready)

    def wait(self, k: int, timeout: float, *, rank: int, step: int,
             stop: Optional[Callable[[], bool]] = None) -> None:
        """Block until bucket ``k`` is formed; :class:`AgentError` if the training thread closed
        the stream, ``stop()`` turns true, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + float(timeout)
        with self._cond:
            while not self.ready[k]:
                if self.closed or (stop is not None and stop()):
                    raise AgentError(f"rank {rank}: its training thread stopped during the "
                                     f"backward of step {step} (bucket {k} of its message "
                                     f"never formed)")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(
                        f"rank {rank}: step {step} was decided with this rank's message, but "
                        f"its training thread formed no bucket {k} of it within {timeout:.0f}s "
                        f"(a backward that never ended, or optimizer.step() never called after "
                        f"it)")
                self._cond.wait(min(left, 0.5))


class Communicator:
    """One decision in, one update out (module doc). ``coll``: the agent's
    :class:`~pgc_hvd.runtime.communicator.Collectives`; ``own(step)``: this rank's message of
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
        self.nonfinite_sum = False     # the last bucketed sum held NaN/Inf
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
        self.nonfinite_sum = False
        if kind == "allreduce":
            mine = [u for u in missing if u.worker == self.rank]
            if self.buckets is not None and codec.wire_dtype == torch.float32:
                flat = self.bucketed(mine)
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

    def bucketed(self, mine: list, tail: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The sum of the contributions bucket by bucket (:mod:`pgc_hvd.runtime.overlap`): one
        allreduce per bucket in bucket order, this rank's bucket k = sum_{u owned} a_u times
        bucket k of its message, waited for while the training thread still forms it (a
        streamed message), zeros when it owns no use. ``tail`` (the s = 0 path's row slots,
        :mod:`pgc_hvd.runtime.sum_rows`) follows the d-vector and rides with the bucket that
        ends it."""
        d = self.d
        flat = self.pool.get(d + (0 if tail is None else tail.numel()))
        outs = [self._own(u.step) for u in mine]
        weights = [u.weight for u in mine]
        for k, (lo, hi) in enumerate(self.buckets.ranges):
            for u, out in zip(mine, outs):
                if out.stream is not None:
                    out.stream.wait(k, self.coll.timeout, rank=self.rank, step=u.step,
                                    stop=self.stop)
            seg = self.codec.add_weighted(flat[lo:hi], [out.payload[lo:hi] for out in outs],
                                          weights)
            if hi == d and tail is not None:
                flat[d:].copy_(tail)
                seg = flat[lo:]
            self.coll.allreduce_sum_(seg, "sum")
        # a used message that held NaN/Inf left before its check: the sum shows it, the same
        # bits on every rank (the step then applies nothing: runtime.overlap)
        self.nonfinite_sum = not all_finite(flat[:d])
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
        ``wire_dtype`` (fp16), c_r = this rank's sum_{u owned} a_u D(p_u) rounded once to fp16
        (``Fp16Codec.add_weighted_narrow``). Two ways, both 2 (n-1)/n * 2d bytes received:
        ``"alltoall"`` (default on CPU, where Horovod's fp16 allreduce over Gloo measured 3x
        slower than fp32, benchmarks/data_plane/fp16_bytes.py): chunks of m = ceil(d/n), an
        alltoall hands rank j the j-th chunk of every rank, summed in fp32 in rank order and
        rounded once, an allgather of the sums: fp16(sum_r fp16(c_r)), |error| <= 2^-11 (|g| +
        sum_r |c_r|); ``"allreduce"`` (default on GPU, NCCL sums fp16): one fp16 ring
        allreduce, |error| <= about (n + 1) 2^-11 sum_r |c_r|. Returns ``(update, fell_back,
        bytes)``; a summed update that is not finite (past 65504, the same bits on every rank)
        is summed again in fp32 from the outbox, this step only, never applied."""
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
