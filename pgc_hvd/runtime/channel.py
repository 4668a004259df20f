"""Control channels: how the ranks exchange their control rows each round (one interface).

``channel.exchange(row, packed=None) -> (rows, payloads)``: publish this rank's control row
(:mod:`pgc_hvd.runtime.wire`, float64) and return every rank's row in rank order, plus
``{(rank, step): payload}`` of the payloads that rode along (identical on every rank).

* :class:`AllgatherChannel`: a Horovod allgather of the rows; with ``carries_payloads`` (the
  optimistic one-collective rounds) a rank may pass ``packed``, a float32 tensor whose first
  2 ``ctrl_len`` words receive the row and whose tail is the payload row, so the payload
  travels in the same collective.
* :class:`~pgc_hvd.runtime.control_store.StoreChannel`: a TCPStore served by rank 0 (rows only).

Collectives run through a :class:`Collectives` object: asynchronous Horovod ops polled with a
deadline (a dead or hung rank raises :class:`AgentError` instead of hanging), under stable names
(``{name}.{kind}``: Horovod's response cache can then skip the negotiation of a name it has
seen; one op per kind is in flight at a time, so reusing the name is safe).
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from pgc_hvd.runtime.wire import WireError, parse_packed


class AgentError(RuntimeError):
    """A fault the runtime cannot step past (dead/hung rank, failed rank, undecodable step)."""


def wait_for_handle(hvd, handle, timeout: float) -> bool:
    """Poll an asynchronous Horovod handle until it completes (True) or ``timeout`` seconds pass
    (False). Short sleeps first (a small allgather takes 1-3 ms here), then at most 1 ms between
    polls; a blocking ``synchronize`` could not time out on a hung rank."""
    deadline = time.monotonic() + timeout
    sleep = 0.0001
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            return False
        time.sleep(sleep)
        sleep = min(sleep * 1.5, 0.001)
    return True


class Collectives:
    """Horovod allgather / alltoall / in-place allreduce (sum) with a deadline, for one
    agent."""

    def __init__(self, hvd, rank: int, name: str, timeout: float):
        self.hvd, self.rank, self.name, self.timeout = hvd, int(rank), name, float(timeout)
        self.ops = 0
        self.step = 0          # the round being decided (for error messages)

    def _run(self, kind: str, start):
        self.ops += 1
        name = f"{self.name}.{kind}"
        try:
            handle = start(name)
            if not wait_for_handle(self.hvd, handle, self.timeout):
                raise AgentError(
                    f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) got no "
                    f"answer within {self.timeout:.0f}s: a rank has died or hung; stopping "
                    f"instead of hanging")
            return self.hvd.synchronize(handle)
        except AgentError:
            raise
        except Exception as err:
            raise AgentError(
                f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) failed: a "
                f"rank has died or shut down Horovod; stopping ({type(err).__name__}: "
                f"{err})") from err

    def allgather(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        return self._run(kind, lambda nm: self.hvd.allgather_async(tensor, name=nm))

    def alltoall(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """Equal splits: rank j receives the j-th of n equal chunks of every rank's ``tensor``,
        in rank order (``tensor.numel()`` must be a multiple of n)."""
        got = self._run(kind, lambda nm: self.hvd.alltoall_async(tensor, name=nm))
        return got[0] if isinstance(got, (tuple, list)) else got

    def allreduce_sum_(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """In-place sum over ranks: every rank ends with the same bits (the ring's allgather
        phase hands every rank the reduced chunks)."""
        hvd = self.hvd
        return self._run(kind, lambda nm: hvd.allreduce_async_(tensor, name=nm, op=hvd.Sum))


def _packed(row: torch.Tensor, packed: Optional[torch.Tensor], length: int) -> torch.Tensor:
    """The float32 tensor a rank sends: its row's float64 words bit-cast (2 ``length`` words),
    written in front of the payload when ``packed`` carries one."""
    words = row.view(torch.float32)
    if packed is None:
        return words
    packed[: 2 * length].copy_(words)
    return packed


class AllgatherChannel:
    """Control rows by Horovod allgather; payloads may ride along (``carries_payloads``)."""

    def __init__(self, coll: Collectives, n: int, length: int, width: int,
                 carries_payloads: bool):
        self.coll, self.n, self.length, self.width = coll, int(n), int(length), int(width)
        self.carries_payloads = bool(carries_payloads)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        if not self.carries_payloads:
            got = self.coll.allgather(row.view(1, self.length), "ctl")
            return got.tolist(), {}
        got = self.coll.allgather(_packed(row, packed, self.length), "ctl")
        try:
            return parse_packed(got, self.n, self.length, self.width)
        except WireError as err:
            raise AgentError(f"rank {self.coll.rank}: {err}") from err

    def close(self) -> None:
        pass


class LoopbackChannel:
    """The control channel of a world of one rank (n = 1): the rank's own row, and its payload
    when one rides along. The agent's protocol then runs without Horovod (tests of its
    bookkeeping over many steps, single-process runs)."""

    carries_payloads = True

    def __init__(self, length: int, width: int):
        self.length, self.width = int(length), int(width)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        return parse_packed(_packed(row, packed, self.length).clone(), 1, self.length,
                            self.width)

    def close(self) -> None:
        pass
