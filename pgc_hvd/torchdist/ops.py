"""Horovod-shaped collectives on one ``torch.distributed`` process group.

:class:`GroupOps` implements the subset of ``horovod.torch`` that the runtime calls
(``allgather_async``, ``alltoall_async``, ``allreduce_async_``, ``broadcast``, ``poll``,
``synchronize`` and their blocking forms) on one process group. Horovod matches collectives
across ranks by name; torch.distributed matches them by call order on a group, so every group
is used by one thread only and that thread issues the same sequence on every rank
(:mod:`pgc_hvd.torchdist` says which thread owns which group). The ``name`` of a collective is
kept for error messages and, with ``PGC_HVD_TORCH_CHECK_ORDER=1``, checked across ranks.

One rank per GPU under NCCL: a group built with ``gpu_host`` (the host's id; the world sets
it when CUDA tensors go through NCCL) checks, before its first collective on CUDA tensors, that
no two ranks on a host hold the same GPU (one allgather of (host, GPU index) on the CPU), and
refuses with the fix (:func:`shared_gpu_message`) instead of NCCL's failure in that collective.

Handles: an asynchronous collective returns a :class:`Handle`; :meth:`Handle.poll` (torch's
``Work.is_completed()``) never blocks, :meth:`Handle.wait` (``Work.wait()``) does, and
:meth:`Handle.wait_for` blocks up to a deadline (``Work.wait(timeout)``: the thread sleeps in
torch with the GIL released and wakes when the collective ends, where a poll loop's sleep
added up to its nap to every collective; CPU tensors only: a CUDA ``Work.wait`` returns before
the data is there, so CUDA handles are polled). A failed
collective raises :class:`CollectiveError`, naming the ranks whose processes are gone when the
engine can tell (``explain``).

Allgather of rows of different lengths (Horovod concatenates them; the optimistic control rows
carry a payload on some ranks only): one allgather of every rank's header (rows, signature,
bytes) and, in the same fixed-size slot, the rows themselves when they fit in ``SLOT_BYTES``
(2 KiB: a control round's rows, about 160 bytes each): then that one collective is the whole
allgather. When some rank's tensor is larger (a payload riding with its row, a sparse message)
a second collective follows: one ``all_gather_single`` when every rank has the same number of
rows, otherwise one ``all_to_all_single`` with the exact splits (each rank sends its own rows
to every rank), so no large tensor is padded to the longest: its bytes are its own.

May import: the standard library, torch and :mod:`pgc_hvd.torchdist.direct_sum` (the agents'
sums of CPU tensors, ``sum_timeout``).
"""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

from pgc_hvd.torchdist import direct_sum


class CollectiveError(RuntimeError):
    """A collective of the torch engine failed (a rank died, the group was shut down, the
    ranks disagree on the call)."""


class _Op:
    """A reduction op (``Sum``, ``Average``, ...), Horovod's names."""

    def __init__(self, name: str, torch_op):
        self.name, self.torch_op = name, torch_op

    def __repr__(self) -> str:
        return f"pgc_hvd.torch.{self.name}"


Sum = _Op("Sum", dist.ReduceOp.SUM)
Average = _Op("Average", dist.ReduceOp.SUM)     # summed, then divided by the size
Min = _Op("Min", dist.ReduceOp.MIN)
Max = _Op("Max", dist.ReduceOp.MAX)
Product = _Op("Product", dist.ReduceOp.PRODUCT)
Adasum = _Op("Adasum", None)                    # named so that pgc_hvd can refuse it by name

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
CHECK_ORDER = os.environ.get("PGC_HVD_TORCH_CHECK_ORDER", "") not in ("", "0")
HEADER_BYTES = 24       # allgather: (rows, dtype-and-shape signature, bytes), three int64
SLOT_BYTES = 2048       # allgather: a tensor up to this size rides with its header


def shared_gpus(rows) -> list:
    """The groups of ranks that hold the same GPU on the same host: ``rows[r] = (host id, cuda
    index)`` of rank r; each group a list of ranks (2 or more), in rank order."""
    holders: dict = {}
    for r, (host, index) in enumerate(rows):
        holders.setdefault((int(host), int(index)), []).append(r)
    return [ranks for ranks in holders.values() if len(ranks) > 1]


def shared_gpu_message(groups, rows) -> str:
    """The refusal when ``groups`` (:func:`shared_gpus`) share GPUs under NCCL, with the fix."""
    said = "; ".join(f"ranks {', '.join(map(str, g))} all hold cuda:{int(rows[g[0]][1])} on "
                     f"one host" for g in groups)
    return (f"pgc_hvd (torch engine): {said}. NCCL, the engine's backend for CUDA tensors, runs "
            f"one rank per GPU and would fail at the first collective. Give each rank its own "
            f"GPU (torch.cuda.set_device(hvd.local_rank()) and the model on that device; at most "
            f"torch.cuda.device_count() ranks per host), or let ranks share a GPU through gloo: "
            f"set PGC_HVD_TORCH_BACKEND=gloo (or call pgc_hvd.torch.init(backend='gloo')).")


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


class Stage:
    """The next stage of a multi-stage collective: its Work and what to do when it is done (an
    ``issue`` callable of :meth:`GroupOps._start` returns one; a test's own collective may)."""

    def __init__(self, work, then: Callable):
        self.work, self.then = work, then


class _Done:
    """A Work that has already completed (a stage that needed no collective)."""

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True


class Handle:
    """An asynchronous collective in flight (Horovod's handle): one or more torch ``Work``
    objects in sequence; the result when the last one is done."""

    _PENDING = object()

    def __init__(self, ops: "GroupOps", name: str, work, then: Callable, cpu: bool = True):
        self.ops, self.name = ops, name
        self.work, self.then = work, then
        self.result = Handle._PENDING
        self.error: Optional[BaseException] = None
        #: CPU tensors: :meth:`wait_for` may block in ``Work.wait(timeout)`` (module doc)
        self.cpu = bool(cpu)

    @property
    def done(self) -> bool:
        return self.result is not Handle._PENDING or self.error is not None

    def _advance(self) -> None:
        """The current stage is complete (or wait() blocks on it): run what follows it."""
        try:
            self.work.wait()
            nxt = self.then()
        except Exception as err:         # noqa: BLE001 -- re-raised by wait() with the rank
            self.error = err
            return
        if isinstance(nxt, Stage):
            self.work, self.then = nxt.work, nxt.then
        else:
            self.result = nxt

    def poll(self) -> bool:
        """Whether the collective has completed (or failed); never blocks."""
        while not self.done:
            if not self.work.is_completed():
                return False
            self._advance()
        return True

    def wait_for(self, seconds: float) -> bool:
        """Whether the collective has completed (or failed), blocking up to ``seconds`` for it
        (CPU tensors; a CUDA handle is polled, with sleeps of 0.1 ms growing to 1 ms: module
        doc). A stage still running after ``seconds`` goes on; call again."""
        deadline = time.monotonic() + float(seconds)
        nap = 0.0001
        while not self.cpu and not self.poll():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(nap, left))
            nap = min(nap * 1.5, 0.001)
        while not self.done:
            if not self.work.is_completed():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:   # whole milliseconds, at least 1: torch reads 0 ms as "no timeout"
                    self.work.wait(timedelta(milliseconds=max(1, int(left * 1000))))
                except Exception:        # noqa: BLE001 -- a timeout, or the failure _advance keeps
                    if not self.work.is_completed():
                        return False     # timed out: the collective goes on
            self._advance()
        return True

    def wait(self):
        """The result; blocks until the collective completes; CollectiveError if it failed."""
        while not self.done:
            self._advance()
        if self.error is not None:
            err = self.error
            if isinstance(err, CollectiveError):
                raise err
            raise CollectiveError(self.ops.failure(self.name, err)) from err
        return self.result


class GroupOps:
    """Horovod's collective API on one process group (module doc). ``rank``, ``size``: this
    process's rank and the world size (every group spans the world); ``explain()``: a sentence
    naming the ranks whose processes are gone ("" when none is known)."""

    Sum, Average, Min, Max, Product, Adasum = Sum, Average, Min, Max, Product, Adasum

    def __init__(self, group, label: str, rank: int, size: int,
                 explain: Callable[[], str] = lambda: "", gpu_host: Optional[int] = None,
                 sum_timeout: Optional[float] = None):
        self.group, self.label = group, label
        #: seconds: sums of CPU tensors go by :mod:`~pgc_hvd.torchdist.direct_sum` (an agent's data
        #: group, whose allreduces one thread waits with this deadline); None: gloo's
        self.sum_timeout = None if sum_timeout is None else float(sum_timeout)
        self._scratch: dict = {}          # dtype -> direct_sum's receive buffer, recycled
        self._rank, self._size = int(rank), int(size)
        self.explain = explain
        self.calls = 0
        self._gpu_host = gpu_host          # set: CUDA tensors go through NCCL (module doc)
        self._gpu_checked = gpu_host is None

    def check_gpu(self, device: torch.device) -> None:
        """Before this group's first collective on CUDA tensors under NCCL: every rank's (host,
        GPU index) gathered on the CPU, and a ValueError naming the ranks that share a GPU and
        the fix (:func:`shared_gpu_message`). A collective: every rank reaches it at the same
        point (its first CUDA collective on this group); afterwards free."""
        if self._gpu_checked or device.type != "cuda":
            return
        self._gpu_checked = True
        index = torch.cuda.current_device() if device.index is None else int(device.index)
        mine = torch.tensor([int(self._gpu_host), index], dtype=torch.int64)
        rows = [mine.tolist()]
        if self._size > 1:
            got = torch.empty(2 * self._size, dtype=torch.int64)
            try:
                _all_gather(got, mine, group=self.group)
            except Exception as err:
                raise CollectiveError(self.failure(f"{self.label}.gpus", err)) from err
            rows = got.view(self._size, 2).tolist()
        groups = shared_gpus(rows)
        if groups:
            raise ValueError(shared_gpu_message(groups, rows))

    # -- the world ----------------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def failure(self, name: str, err: BaseException) -> str:
        why = self.explain()
        return (f"collective {name!r} (#{self.calls} on process group {self.label!r}) failed"
                f"{': ' + why if why else ''} ({type(err).__name__}: {err})")

    def _start(self, name: Optional[str], issue: Callable[[], "Stage | object"],
               device: Optional[torch.device] = None) -> Handle:
        """Issue a collective on tensors on ``device`` (``issue`` returns its first stage), with
        the one-GPU-per-rank check before the group's first CUDA one (:meth:`check_gpu`) and
        the order check first when ``PGC_HVD_TORCH_CHECK_ORDER`` is set."""
        if not self._gpu_checked and device is not None:
            self.check_gpu(device)
        self.calls += 1
        name = name or f"{self.label}.{self.calls}"
        cpu = device is None or torch.device(device).type == "cpu"   # may block: wait_for
        try:
            if CHECK_ORDER and self._size > 1:
                mine = torch.tensor([_digest(name)], dtype=torch.int64)
                got = torch.empty(self._size, dtype=torch.int64)
                work = _all_gather(got, mine, group=self.group, async_op=True)

                def check():
                    bad = [r for r, v in enumerate(got.tolist()) if v != int(mine)]
                    if bad:
                        raise CollectiveError(
                            f"collective {name!r} (#{self.calls} on process group "
                            f"{self.label!r}): ranks {bad} issued a different collective at this "
                            f"point: the ranks' call orders differ")
                    return issue()
                return Handle(self, name, work, check, cpu)
            first = issue()
        except CollectiveError:
            raise
        except Exception as err:
            raise CollectiveError(self.failure(name, err)) from err
        if isinstance(first, Stage):
            return Handle(self, name, first.work, first.then, cpu)
        return Handle(self, name, _Done(), lambda: first, cpu)

    @staticmethod
    def poll(handle: Handle) -> bool:
        return handle.poll()

    @staticmethod
    def wait_for(handle: Handle, seconds: float) -> bool:
        """Whether ``handle`` completed, blocking up to ``seconds`` (:meth:`Handle.wait_for`)."""
        return handle.wait_for(seconds)

    @staticmethod
    def synchronize(handle: Handle):
        return handle.wait()

    # -- allgather ----------------------------------------------------------------------------
    def allgather_async(self, tensor: torch.Tensor, name: Optional[str] = None) -> Handle:
        """Every rank's ``tensor`` concatenated along dim 0 in rank order (first dimensions may
        differ, the others and the dtype must agree). One collective when every rank's tensor
        fits in ``SLOT_BYTES`` (the control rows), two otherwise (module doc)."""
        if tensor.dim() == 0:
            raise ValueError("allgather needs a tensor of at least one dimension")
        t = tensor.contiguous()
        n, k, rest = self._size, int(t.shape[0]), tuple(t.shape[1:])
        sig = _digest(f"{t.dtype} {rest}")
        nbytes = t.numel() * t.element_size()
        width = HEADER_BYTES + SLOT_BYTES
        mine = torch.zeros(width, dtype=torch.uint8, device=t.device)
        mine[:HEADER_BYTES] = torch.tensor([k, sig, nbytes], dtype=torch.int64).view(
            torch.uint8).to(t.device)
        if 0 < nbytes <= SLOT_BYTES:
            mine[HEADER_BYTES:HEADER_BYTES + nbytes] = t.reshape(-1).view(torch.uint8)
        slots = torch.empty(n * width, dtype=torch.uint8, device=t.device)

        def gathered():
            table = slots.view(n, width)
            heads = table[:, :HEADER_BYTES].cpu().contiguous().view(torch.int64).tolist()
            sizes, sigs, lens = ([h[0] for h in heads], [h[1] for h in heads],
                                 [h[2] for h in heads])
            if len(set(sigs)) != 1:
                raise CollectiveError(
                    f"allgather {name!r}: the ranks' tensors differ in dtype or trailing shape "
                    f"(this rank: {t.dtype} {rest})")
            shape = (sum(sizes),) + rest
            if max(lens) <= SLOT_BYTES:     # every tensor rode in its slot: done
                if not sum(lens):
                    return torch.empty(shape, dtype=t.dtype, device=t.device)
                data = torch.cat([table[i, HEADER_BYTES:HEADER_BYTES + lens[i]]
                                  for i in range(n)])
                return data.view(t.dtype).reshape(shape)
            out = torch.empty(shape, dtype=t.dtype, device=t.device)
            if len(set(sizes)) == 1:
                return Stage(_all_gather(out, t, group=self.group, async_op=True), lambda: out)
            # rows of different lengths: exact splits, no padding (module doc)
            send = t.repeat((n,) + (1,) * len(rest)) if k else t
            work = dist.all_to_all_single(out, send, output_split_sizes=sizes,
                                          input_split_sizes=[k] * n, group=self.group,
                                          async_op=True)
            return Stage(work, lambda: out)

        def issue():
            if n == 1:
                return t.clone()
            return Stage(_all_gather(slots, mine, group=self.group, async_op=True), gathered)
        return self._start(name, issue, t.device)

    def allgather(self, tensor: torch.Tensor, name: Optional[str] = None) -> torch.Tensor:
        return self.allgather_async(tensor, name=name).wait()

    # -- allreduce ----------------------------------------------------------------------------
    def allreduce_async_(self, tensor: torch.Tensor, average=None, name: Optional[str] = None,
                         op=None, prescale_factor: float = 1.0,
                         postscale_factor: float = 1.0) -> Handle:
        """In place: ``tensor`` becomes the reduction over ranks (``op``: ``Average`` by
        default, ``Sum``, ``Min``, ``Max``, ``Product``). Every rank ends with the same bits
        (gloo's and NCCL's allreduce hand every rank the reduced chunks)."""
        op = _resolve_op(op, average)
        if not tensor.is_contiguous():
            raise ValueError("allreduce_async_ needs a contiguous tensor")

        def finish():
            if op is Average:
                if tensor.is_floating_point() or tensor.is_complex():
                    tensor.div_(self._size)
                else:
                    tensor.floor_divide_(self._size)
            if postscale_factor != 1.0:
                tensor.mul_(postscale_factor)
            return tensor

        def issue():
            if prescale_factor != 1.0:
                tensor.mul_(prescale_factor)
            if self._size == 1:
                return finish()
            if (self.sum_timeout is not None and op in (Sum, Average)
                    and direct_sum.applies(tensor, self._size)):
                return direct_sum.allreduce_sum(tensor, self.group, self._rank, self._size,
                                             self.sum_timeout, lambda k: self.scratch(
                                                 k, tensor.dtype), finish, Stage)
            return Stage(dist.all_reduce(tensor, op=op.torch_op, group=self.group,
                                         async_op=True), finish)
        return self._start(name, issue, tensor.device)

    def scratch(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A recycled CPU buffer of at least ``numel`` elements of ``dtype`` (direct_sum's
        received spans: a fresh one of tens of MB is page-faulted at its first write)."""
        buf = self._scratch.get(dtype)
        if buf is None or buf.numel() < numel:
            buf = self._scratch[dtype] = torch.empty(numel, dtype=dtype)
        return buf

    def allreduce_async(self, tensor: torch.Tensor, average=None, name: Optional[str] = None,
                        op=None, **scale) -> Handle:
        return self.allreduce_async_(tensor.detach().clone(), average, name, op, **scale)

    def allreduce_(self, tensor, average=None, name=None, op=None, **scale) -> torch.Tensor:
        return self.allreduce_async_(tensor, average, name, op, **scale).wait()

    def allreduce(self, tensor, average=None, name=None, op=None, **scale) -> torch.Tensor:
        return self.allreduce_async(tensor, average, name, op, **scale).wait()

    # -- alltoall -----------------------------------------------------------------------------
    def alltoall_async(self, tensor: torch.Tensor, splits=None,
                       name: Optional[str] = None) -> Handle:
        """Equal splits (``splits`` None): rank j receives the j-th of n equal chunks (along
        dim 0) of every rank's ``tensor``, in rank order."""
        if splits is not None:
            raise NotImplementedError("alltoall with explicit splits is not used by pgc_hvd")
        t = tensor.contiguous()
        if t.shape[0] % self._size:
            raise ValueError(f"alltoall: dim 0 ({t.shape[0]}) is not a multiple of the size "
                             f"{self._size}")
        out = torch.empty_like(t)

        def issue():
            if self._size == 1:
                return t.clone()
            return Stage(dist.all_to_all_single(out, t, group=self.group, async_op=True),
                         lambda: out)
        return self._start(name, issue, t.device)

    def alltoall(self, tensor, splits=None, name=None) -> torch.Tensor:
        return self.alltoall_async(tensor, splits, name).wait()

    # -- broadcast ----------------------------------------------------------------------------
    def broadcast_async_(self, tensor: torch.Tensor, root_rank: int,
                         name: Optional[str] = None) -> Handle:
        """In place: ``tensor`` becomes rank ``root_rank``'s (every group spans the world, so
        the root's group rank is its global rank)."""
        def issue():
            if self._size == 1:
                return tensor
            return Stage(dist.broadcast(tensor, src=int(root_rank), group=self.group,
                                        async_op=True), lambda: tensor)
        return self._start(name, issue, tensor.device)

    def broadcast_(self, tensor, root_rank, name=None) -> torch.Tensor:
        return self.broadcast_async_(tensor, root_rank, name).wait()

    def broadcast_async(self, tensor, root_rank, name=None) -> Handle:
        return self.broadcast_async_(tensor.detach().clone().contiguous(), root_rank, name)

    def broadcast(self, tensor, root_rank, name=None) -> torch.Tensor:
        return self.broadcast_async(tensor, root_rank, name).wait()

    def barrier(self, name: Optional[str] = None) -> None:
        self.allreduce(torch.zeros(1), name=name or "barrier", op=Sum)


def _resolve_op(op, average):
    if op is None:
        if average is None:
            return Average
        return Average if average else Sum
    if op is Adasum or not isinstance(op, _Op):
        raise ValueError(f"op must be one of Sum, Average, Min, Max, Product of "
                         f"pgc_hvd.torch, got {op!r}")
    return op
