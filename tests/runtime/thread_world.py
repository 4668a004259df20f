"""n ranks as n threads of the pytest process (for the one-process unit tests of the agent
thread's parts): each thread holds its own real gloo process group
(``torch.distributed.ProcessGroupGloo`` over one shared ``HashStore``, no launcher, no default
group) behind the torch engine's :class:`~pgc_hvd.torchdist.ops.GroupOps`, the module object
shaped like ``horovod.torch`` that the runtime calls under torchrun.

One difference: these groups are not registered in torch's default world (there is none), and
``dist.broadcast(src=global rank)`` looks the root up there; :class:`ThreadGroupOps` passes the
root as the group's rank instead (``group_src``: the same rank, every group spans the world)."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import torch.distributed as dist

from pgc_hvd.torchdist.ops import GroupOps, Stage

_worlds = itertools.count()


class ThreadGroupOps(GroupOps):
    """:class:`GroupOps` whose broadcast names its root by group rank (module doc)."""

    def broadcast_async_(self, tensor, root_rank, name=None):
        def issue():   # asynchronous, as GroupOps' (the log plane's outcome is polled)
            if self.size() == 1:
                return tensor
            return Stage(dist.broadcast(tensor, group_src=int(root_rank), group=self.group,
                                        async_op=True), lambda: tensor)
        return self._start(name, issue)


def in_world(n: int, body, timeout: float = 30.0) -> list:
    """``body(rank, ops)`` on n threads, ``ops`` a :class:`ThreadGroupOps` of rank ``rank`` in a world
    of n; returns the n results in rank order and re-raises the first failure (a thread that
    hangs past ``timeout`` + 10 s fails the test)."""
    store = dist.HashStore()
    prefix = f"w{next(_worlds)}"
    results: list = [None] * n
    errors: list = []

    def run(rank: int) -> None:
        pg = None
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, n,
                                       timedelta(seconds=timeout))
            results[rank] = body(rank, ThreadGroupOps(pg, prefix, rank, n))
        except BaseException as err:   # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(err)
        finally:
            # the group's gloo threads end here, with the rank's thread, not at the pytest
            # process's exit (a gloo thread still joinable then aborts the interpreter:
            # "terminate called without an active exception", exit status 134)
            if pg is not None:
                try:
                    pg.shutdown()
                except Exception:   # noqa: BLE001 - a failed test already says what failed
                    pass

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    if errors:
        raise errors[0]
    return results
