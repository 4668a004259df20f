"""The control channels: how the ranks exchange their control rows each round (one interface).

``channel.exchange(row, packed=None) -> (rows, payloads)``: publish this rank's control row
(:mod:`pgc_hvd.runtime.rows`, float64) and return every rank's row in rank order, plus
``{(rank, step): payload}`` of the payloads that rode along (identical on every rank);
``channel.close()`` after the last round (the bye protocol where there is one);
``channel.stop()`` when the agent stops on an error or is cut off (its own threads end, no
wait for the other ranks).

* :class:`AllgatherChannel`: a Horovod allgather of the rows; with ``carries_payloads`` (the
  optimistic one-collective rounds) a rank may pass ``packed``, a float32 tensor whose first
  2 ``ctrl_len`` words receive the row and whose tail is the payload row, so the payload
  travels in the same collective.
* :class:`LoopbackChannel`: a world of one rank.
* :class:`~pgc_hvd.runtime.control_store.StoreChannel`: a TCPStore served by rank 0 (rows only).
* :class:`~pgc_hvd.runtime.control_log.LogChannel`: an ordered log in that store (the default).

:func:`control_channel` builds the one a ``control=`` value names. The collectives under them
are the agent's :class:`~pgc_hvd.runtime.communicator.Collectives` (deadlines, stable names);
which engine runs them is :mod:`pgc_hvd.runtime.engine`'s.

Owns the control channels' interface, the polled ones and their builder. Threads: the
training thread builds the channel (:func:`control_channel`, in the agent's construction: a
collective for the store's set-up); the agent thread exchanges and closes; ``stop``: either.
May import: ``runtime.communicator`` (``Collectives``), ``runtime.errors``,
``runtime.rows``, ``runtime.control_log`` and ``runtime.control_store`` (lazily, the channels
they own), torch.
"""

from __future__ import annotations

from typing import Optional

import torch

from pgc_hvd.runtime.communicator import Collectives
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import WireError, parse_packed


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
        self.ops = 0   # control collectives issued (control_ops in the records)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        self.ops += 1
        if not self.carries_payloads:
            got = self.coll.allgather(row.view(1, self.length), "ctl")
            return got.tolist(), {}
        got = self.coll.allgather(_packed(row, packed, self.length), "ctl")
        try:
            return parse_packed(got, self.n, self.length, self.width)
        except WireError as err:
            raise AgentError(f"rank {self.coll.rank}: {err}") from err

    def stop(self) -> None:
        """No thread of its own to stop."""

    def close(self) -> None:
        pass


class LoopbackChannel:
    """The control channel of a world of one rank (n = 1): the rank's own row, and its payload
    when one rides along. The agent's protocol then runs without Horovod (tests of its
    bookkeeping over many steps, single-process runs)."""

    carries_payloads = True
    ops = 0   # no control messages leave the rank

    def __init__(self, length: int, width: int):
        self.length, self.width = int(length), int(width)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        return parse_packed(_packed(row, packed, self.length).clone(), 1, self.length,
                            self.width)

    def stop(self) -> None:
        """No thread of its own to stop."""

    def close(self) -> None:
        pass


def control_channel(control: str, coll: Collectives, *, n: int, length: int, width: int,
                    optimistic: bool = False, device=None):
    """The control channel ``control`` names, for an agent whose collectives are ``coll``:
    ``"allgather"`` (:class:`AllgatherChannel`; payloads ride along when ``optimistic``, CPU
    payloads only), ``"store"`` (:class:`~pgc_hvd.runtime.control_store.StoreChannel`, a
    TCPStore served by rank 0; a collective: every rank must build it) or ``"log"``
    (:class:`~pgc_hvd.runtime.control_log.LogChannel`: an ordered log in that store, one
    decider, no polling; a collective too)."""
    if control == "log":
        if optimistic:
            raise ValueError("control='log' exchanges control rows through a key-value "
                             "store, which cannot carry payloads: leave optimistic unset")
        from pgc_hvd.runtime.control_log import LogChannel
        return LogChannel.create(coll, n, length)
    if control == "store":
        if optimistic:
            raise ValueError("control='store' exchanges control rows through a key-value "
                             "store, which cannot carry payloads: leave optimistic unset")
        from pgc_hvd.runtime.control_store import StoreChannel
        return StoreChannel.create(coll.hvd, coll.rank, n, coll.name, coll.timeout)
    if control != "allgather":
        raise ValueError(f"control must be 'allgather', 'store' or 'log', got {control!r}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if optimistic and dev.type != "cpu":
        raise ValueError("optimistic one-collective steps need CPU payloads (the control "
                         "rows live on the CPU)")
    return AllgatherChannel(coll, n, length, width, carries_payloads=bool(optimistic))
