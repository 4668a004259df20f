"""Agreement across ranks: the few small collectives that every cross-rank check and every
agreement of the runtime is made of, each written once here, and the digest the ranks compare.

* :func:`poll_until` / :func:`wait_for_handle`: poll a condition (an asynchronous handle, a
  store counter) until it holds or a deadline passes: the runtime's one poll loop, the data
  plane's (:mod:`pgc_hvd.runtime.communicator`, on the step's path), re-exported here;
* :func:`finish`: a handle's result, or :class:`~pgc_hvd.runtime.errors.AgentError` with the
  caller's message when no answer came in time (``timeout=None``: blocking, for the elastic
  world's agreement, where gloo's own timeout reports a dead rank as Horovod's error);
* :func:`gather_rows`, :func:`allgather_polled`: every rank's small row of numbers (a list, a
  tensor), in rank order (one allgather);
* :func:`gather_bytes`: every rank's bytes, in rank order (two allgathers: the lengths as
  int64, then the bytes as uint8; Horovod concatenates rows of different lengths);
* :func:`broadcast_bytes`: the root's bytes on every rank (two blocking broadcasts: the length,
  negative when the root refuses, then the bytes);
* :func:`gather_versions` and :func:`tensors_digest`: the version and digest agreement (each
  rank's model version; a 63-bit BLAKE2b digest of tensors' bits) that the optimizer's checks
  (:mod:`pgc_hvd.runtime.consistency`), ``load_checkpoint`` (:mod:`pgc_hvd.runtime.checkpoint`)
  and the elastic world's ``sync`` (:mod:`pgc_hvd.runtime.elastic.state`) compare.

Only tensor collectives of Horovod's API are used (``hvd.broadcast_object`` pickles, and hangs
with this Horovod build). The callers choose the names, the deadline and what the error says.

Owns no state: the polled small collectives and the digest. Threads: the
caller's: the training thread (the checks, ``load_checkpoint``, the elastic ``sync``, the
control store's set-up), the agent thread (the control store's bye: :func:`poll_until`).
May import: torch, numpy, :mod:`pgc_hvd.runtime.errors`, :mod:`pgc_hvd.runtime.communicator`
(its poll loop).
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from pgc_hvd.runtime.communicator import poll_until, wait_for_handle
from pgc_hvd.runtime.errors import AgentError


def no_answer(rank: int, what: str, timeout: float) -> str:
    """The usual message of a check that got no answer: ``what`` did not complete in time."""
    return (f"rank {rank}: {what} got no answer within {timeout:.0f}s: the other ranks did not "
            f"reach it (a rank died, hung, or runs a different training script)")


def finish(hvd, handle, timeout: Optional[float], error: str) -> torch.Tensor:
    """``hvd.synchronize(handle)`` once the handle completed within ``timeout`` seconds, else
    AgentError(``error``); ``timeout=None`` waits without a deadline."""
    if timeout is not None and not wait_for_handle(hvd, handle, timeout):
        raise AgentError(error)
    return hvd.synchronize(handle)


def gather_rows(hvd, row: Sequence, *, name: str, timeout: Optional[float], error: str = "",
                dtype: torch.dtype = torch.int64) -> list[list]:
    """Every rank's ``row`` (a few numbers, the same count on every rank) in rank order: one
    allgather named ``name``, polled as :func:`finish` does; ``timeout=None``: Horovod's blocking
    ``hvd.allgather``."""
    mine = torch.tensor([list(row)], dtype=dtype)
    if timeout is None:
        return hvd.allgather(mine, name=name).tolist()
    return finish(hvd, hvd.allgather_async(mine, name=name), timeout, error).tolist()


def allgather_polled(hvd, tensor: torch.Tensor, *, name: str, timeout: float, rank: int,
                     what: str) -> torch.Tensor:
    """Every rank's ``tensor`` (rows concatenated in rank order), polled with ``timeout``
    (:func:`no_answer` says what did not complete)."""
    return finish(hvd, hvd.allgather_async(tensor, name=name), timeout,
                  no_answer(rank, what, timeout))


def gather_bytes(hvd, raw: bytes, *, name: str, timeout: Optional[float],
                 error: str = "") -> list[bytes]:
    """Every rank's ``raw`` in rank order: two allgathers (``{name}.len``: the lengths as int64;
    ``{name}.data``: the bytes as uint8), each finished as :func:`finish` does."""
    lens = gather_rows(hvd, [len(raw)], name=f"{name}.len", timeout=timeout, error=error)
    data = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
    got = finish(hvd, hvd.allgather_async(data, name=f"{name}.data"), timeout, error)
    buf, out, at = got.numpy().tobytes(), [], 0
    for (k,) in lens:
        out.append(buf[at:at + k])
        at += k
    return out


def broadcast_bytes(hvd, raw: bytes, *, rank: int, root_rank: int, name: str,
                    refused: bool = False) -> tuple[bytes, bool]:
    """``(the root's raw, whether the root refused)`` on every rank: two blocking broadcasts of
    tensors (``{name}.len``: the length, negative when ``refused`` on the root; ``{name}.data``:
    the bytes). ``rank`` is this rank; what the other ranks pass as ``raw`` is ignored."""
    sign = -1 if refused else 1
    size = int(hvd.broadcast(torch.tensor([sign * len(raw)], dtype=torch.int64), root_rank,
                             name=f"{name}.len").item())
    buf = torch.zeros(abs(size), dtype=torch.uint8)
    if rank == root_rank:
        buf.copy_(torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()))
    data = hvd.broadcast(buf, root_rank, name=f"{name}.data").numpy().tobytes()
    return data, size < 0


def gather_versions(hvd, version: int, *, name: str, timeout: float, rank: int,
                    what: str = "the agreement on the starting model version") -> list[int]:
    """Every rank's ``version`` in rank order (one int64 allgather, polled with ``timeout``)."""
    rows = gather_rows(hvd, [int(version)], name=name, timeout=timeout,
                       error=no_answer(rank, what, timeout))
    return [int(r[0]) for r in rows]


def tensors_digest(tensors: Iterable[torch.Tensor]) -> int:
    """A 63-bit BLAKE2b digest of the tensors' bits, in order (dtype-exact: a parameter that
    differs in one bit, or -0.0 against 0.0, gives another digest). One pass over the data (a
    device tensor is copied to the host once)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        t = t.detach().reshape(-1).contiguous()
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).cpu().numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1
