"""Control rounds through a key-value store instead of an allgather (``control="store"``).

DESIGN.md leaves two ways for the ranks to agree, every control round, on which messages are
ready: a tiny collective (the agent's default: one ``hvd.allgather`` of the control rows) or an
event-driven key-value store. This is the second: a ``torch.distributed.TCPStore`` served by
rank 0. Round k of a run named ``name``:

* every rank ``set``s its control row (float64 bytes) under ``pgc/<name>/<k>/<rank>``;
* every rank ``multi_get``s the n keys of round k, which waits for the missing ones.

So every rank reads the same n rows for round k, in rank order: the same input to the scheme as
the allgather's, hence the same decisions. A rank at round k has read round k - 1 completely, so
every rank has written round k - 1 and read round k - 2: each rank deletes its own key of round
k - 2 (the store holds at most 2n rows per run). A rank that does not answer within ``timeout``
raises :class:`~pgc_hvd.runtime.errors.AgentError` naming the ranks whose rows are missing. At the
end every rank adds 1 to ``pgc/<name>/bye`` after its last round, and rank 0 (the server) waits
for n before it returns, so it never shuts the store down under a rank still reading.

Measured on this machine (``benchmarks/control/control_channel.py``, docs/architecture.md): one round
costs 0.3-0.6 ms against 1.3-7.7 ms for the allgather at np = 2-4. Payloads cannot ride with the
rows (the store is one server), so a step that fires moves its messages in the data allgather.

Address of rank 0's server: one address, the one the ranks use (:mod:`pgc_hvd.runtime.
store_address`: ``PGC_HVD_STORE_ADDR``, else the interface gloo is pinned to, else
``MASTER_ADDR``, else rank 0's host name); the server listens on that address only, not on
every interface as a plain TCPStore does. The port is chosen by the OS; ``address:port`` and
rank 0's host name are broadcast as bytes (:func:`pgc_hvd.runtime.agreement.broadcast_bytes`;
``hvd.broadcast_object`` hangs with horovod 0.28.1 + torch 2.14); a failure to listen is
broadcast instead, so every rank raises it.

Trust: a TCPStore has no authentication. Whoever can reach that address and port can read and
write rows (float64 bytes: no code runs from them, but a forged row changes decisions), as with
torch.distributed's own store: run on a trusted network (docs/architecture.md, "Who may write
what").

Owns the TCPStore's set-up (:func:`open_store`), :class:`StoreChannel` and the bye
(:func:`say_bye`, the log's too). Threads: the training thread (set-up, in the agent's
construction: a collective), the agent thread (``exchange``, ``close``).
May import: torch, numpy, :mod:`pgc_hvd.runtime.agreement` (the address broadcast, the wait for
the last bye), :mod:`pgc_hvd.runtime.store_address`, :mod:`pgc_hvd.runtime.errors`.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import numpy as np
import torch

from pgc_hvd.runtime.agreement import broadcast_bytes, poll_until
from pgc_hvd.runtime.store_address import bind_address, check_reachable, listen



def _broadcast_text(hvd, text: str, rank: int, name: str) -> str:
    raw, _ = broadcast_bytes(hvd, text.encode(), rank=rank, root_rank=0, name=name)
    return raw.decode("utf-8", "replace")


def open_store(hvd, rank: int, name: str, timeout: float):
    """Rank 0 serves a TCPStore on the ranks' address only, every rank connects (a collective:
    every rank must call it). Returns this rank's store (rank 0: the server) and
    ``connect(timeout)``, which opens one more client of the same server (for a thread of its
    own)."""
    from torch.distributed import TCPStore

    td = timedelta(seconds=float(timeout))
    store, text = None, ""
    if rank == 0:
        try:
            address, why = bind_address()
            fd, port = listen(address, why)
        except ValueError as err:
            text = f"!{err}"
        else:
            try:   # world_size=None: no join counting (it would wait for workers that come later)
                store = TCPStore(address, port, None, True, td, wait_for_workers=False,
                                 master_listen_fd=fd)
            except BaseException:
                os.close(fd)
                raise
            text = f"{address}:{port} {socket.gethostname()}"
    text = _broadcast_text(hvd, text, rank, f"{name}.store.address")
    if text.startswith("!"):
        raise ValueError(f"rank {rank}: control store of {name!r}: {text[1:]}")
    target, _, server_host = text.partition(" ")
    address, _, port = target.rpartition(":")
    if rank != 0:
        check_reachable(address, server_host)

    def connect(seconds: float):
        return TCPStore(address, int(port), None, False, timedelta(seconds=float(seconds)))

    if rank != 0:
        store = connect(timeout)
    return store, connect


class StoreChannel:
    """One run's control rounds over a TCPStore (see the module doc)."""

    def __init__(self, store, rank: int, n: int, name: str, timeout: float):
        self.store, self.rank, self.n = store, int(rank), int(n)
        self.prefix = f"pgc/{name}"
        self.timeout = float(timeout)
        self.round = 0
        self.ops = 0               # store operations issued (control_ops in the records)

    @classmethod
    def create(cls, hvd, rank: int, n: int, name: str, timeout: float) -> "StoreChannel":
        """Rank 0 serves, every rank connects (a collective: every rank must call it)."""
        store, _ = open_store(hvd, rank, name, timeout)
        return cls(store, rank, n, name, timeout)

    def _key(self, k: int, w: int) -> str:
        return f"{self.prefix}/{k}/{w}"

    carries_payloads = False   # rows only: payloads move in the data phase

    def exchange(self, row: torch.Tensor, packed=None) -> tuple[list[list[float]], dict]:
        """Publish this rank's row for the next round; return every rank's row, in rank order
        (and no payloads: the :mod:`pgc_hvd.runtime.channel` interface)."""
        from pgc_hvd.runtime.errors import AgentError

        k = self.round
        self.round += 1
        keys = [self._key(k, w) for w in range(self.n)]
        self.ops += 2 + (k >= 2)
        try:
            self.store.set(keys[self.rank], row.contiguous().numpy().tobytes())
            got = self.store.multi_get(keys)
        except Exception as err:
            raise AgentError(self._no_answer(k, keys, err)) from err
        if k >= 2:
            self.store.delete_key(self._key(k - 2, self.rank))
        return [np.frombuffer(v, dtype=np.float64).tolist() for v in got], {}

    def _no_answer(self, k: int, keys: list, err: Exception) -> str:
        try:
            missing = [w for w, key in enumerate(keys) if not self.store.check([key])]
        except Exception:  # the server itself is gone (rank 0 died)
            return (f"rank {self.rank}: control round {k} failed: the control store on rank 0 "
                    f"is unreachable (rank 0 died or shut down); stopping "
                    f"({type(err).__name__}: {err})")
        return (f"rank {self.rank}: control round {k}: rank(s) {missing} did not answer within "
                f"{self.timeout:.0f}s: a rank has died or hung; stopping instead of hanging "
                f"({type(err).__name__}: {err})")

    def stop(self) -> None:
        """No thread of its own to stop (the agent stopped or was cut off)."""

    def close(self) -> None:
        """After the last round: rank 0 waits until every rank has read it."""
        say_bye(self.store, self.prefix, self.rank, self.n, self.timeout)


def say_bye(store, prefix: str, rank: int, n: int, timeout: float) -> None:
    """The end of a store channel's run (``control="store"`` and ``"log"``): every rank adds 1
    to ``<prefix>/bye``; rank 0, the server, waits (up to ``timeout``) until all n have, so it
    never shuts the store down under a rank still reading."""
    bye = f"{prefix}/bye"
    store.add(bye, 1)
    if rank == 0:
        # a rank that never said bye within timeout has failed on its own: nothing to wait for
        poll_until(lambda: int(store.add(bye, 0)) >= n, timeout)
