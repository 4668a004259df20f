"""The edges of an elastic world: whether an error means the world broke
(:func:`world_error`), leaving the old world's optimizer without a collective
(:func:`abandon`), and the objects the ranks of a new world broadcast to each other as tensors
and plain types only (:func:`bcast_object`, :func:`horovod_bcast`: the ``bcast_object`` that
Horovod's ``State`` base class gets).

Owns no state: these edges, as functions. Threads: the training thread (the elastic state's
``restore`` and ``sync``, Horovod's ``State``); :func:`world_error` also on the agent thread
(the elastic state's ``on_stop``).
May import: :mod:`pgc_hvd.runtime.agreement` (the byte broadcast),
:mod:`pgc_hvd.runtime.plain`, :mod:`pgc_hvd.runtime.errors`; Horovod's exceptions, lazily.
"""

from __future__ import annotations

import enum
import logging
import pickle
from typing import Any, Callable, Optional

from pgc_hvd.runtime import plain
from pgc_hvd.runtime.agreement import broadcast_bytes
from pgc_hvd.runtime.errors import AgentError

log = logging.getLogger(__name__)


def world_error(err: BaseException) -> bool:
    """Whether ``err`` (or an error in its cause/context chain) says the world broke (a rank
    died): Horovod's ``HorovodInternalError`` (a collective failed), or an
    :class:`~pgc_hvd.runtime.errors.AgentError` with ``broken_world`` (the control log's store
    is gone with rank 0, a census named dead ranks)."""
    from horovod.common.exceptions import HorovodInternalError

    seen = set()
    e: Optional[BaseException] = err
    while e is not None and id(e) not in seen:
        if isinstance(e, HorovodInternalError):
            return True
        if isinstance(e, AgentError) and e.broken_world:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def bcast_object(hvd, obj: Any, root_rank: int = 0, name: str = "pgc.elastic.obj") -> Any:
    """``obj`` from ``root_rank`` on every rank, as tensors and plain types only.

    Who can write what the receivers read: the root rank's bytes arrive on every other rank, so
    they are never unpickled. ``obj`` travels in torch's serialization format holding only
    tensors and plain types (:mod:`pgc_hvd.runtime.plain`: dicts, lists, numbers, strings,
    tensors, ... -- an optimizer's ``state_dict()`` is one) and is read with
    ``torch.load(weights_only=True)``, so bytes from a peer (or from anyone who could inject into
    the job's collectives) cannot run code on the receiver: anything else raises ValueError
    naming the refused global. An ``obj`` that is not tensors and plain types raises
    :class:`~pgc_hvd.runtime.plain.NotPlain` on every rank, with the root's message naming the
    entry; nothing is sent. Two ``hvd.broadcast`` of tensors
    (:func:`pgc_hvd.runtime.agreement.broadcast_bytes`: the length, negative for that refusal,
    then the bytes); Horovod's ``broadcast_object`` pickles, and hangs in this build
    (docs/elastic.md)."""
    rank = hvd.rank()
    raw, refused = b"", False
    if rank == root_rank:
        try:
            raw = plain.dumps(obj, "the object")
        except plain.NotPlain as err:
            raw, refused = str(err).encode(), True
    data, refused = broadcast_bytes(hvd, raw, rank=rank, root_rank=root_rank, name=name,
                                    refused=refused)
    if refused:
        why = data.decode("utf-8", "replace")
        raise plain.NotPlain(f"bcast_object from rank {root_rank}: {why}")
    try:
        return plain.loads(data)
    except pickle.UnpicklingError as err:
        detail = next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line),
                      str(err).strip()[-300:])
        raise ValueError(f"rank {rank}: bcast_object refused what rank {root_rank} sent: it is "
                         f"not tensors and plain types, and building it could run code "
                         f"({detail})") from None


def horovod_bcast(hvd) -> Callable:
    """The ``bcast_object`` Horovod's ``State`` base class gets. Its ``check_host_updates``
    (``state.commit()``) broadcasts ``(timestamp, timestamp, HostUpdateResult)``, the last an
    ``enum.IntFlag``: enum members of a tuple travel as their int (Horovod compares with ``==``
    and ``|``, which an int answers the same)."""
    def bcast(obj):
        if isinstance(obj, tuple):
            obj = tuple(int(v) if isinstance(v, enum.Enum) and isinstance(v, int) else v
                        for v in obj)
        return bcast_object(hvd, obj, name="pgc.elastic.state")
    return bcast


def abandon(opt, join_timeout: float = 5.0) -> int:
    """Leave a pgc_hvd optimizer of a world that is gone, with no collective: ``opt.abandon()``
    (apply every update its agent decided, the same on every survivor; wait for the agent thread
    to end; remove the gradient hooks; mark it closed). An agent thread still running after
    that (it should not: its next collective fails once the world is gone) has its collectives
    cut off, so that it can never take part in the next world's. Returns the version reached."""
    version = opt.abandon(join_timeout)
    agent = opt.agent
    if agent.running:
        log.warning("pgc_hvd elastic: the old world's agent thread is still running after "
                    "%.0fs; its collectives are cut off", join_timeout)
    agent.cut_off()   # also ends the old world's control-log reader (rank 0), if any
    return version
