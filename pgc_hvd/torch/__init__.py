"""pgc_hvd for ``torchrun``: Horovod's API over torch.distributed, with no Horovod import.

    import pgc_hvd.torch as hvd          # in place of `import horovod.torch as hvd`

    hvd.init()                           # torch.distributed from torchrun's environment
    model = ...; hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   scheme="pgc-cr", stragglers=1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    loader = hvd.CodedLoader(dataset, n=hvd.size(), batch_size=32)
    ...                                   # torchrun --nproc-per-node 4 train.py

``init``, ``shutdown``, ``rank``, ``size``, ``local_rank``, ``local_size``, the collectives
(``allreduce``, ``allgather``, ``broadcast``, ``alltoall`` and their ``_async`` forms with
``poll`` / ``synchronize``), ``broadcast_parameters``, ``broadcast_optimizer_state``,
``broadcast_object``, ``Sum`` / ``Average`` / ``Compression`` are :mod:`pgc_hvd.torchdist`'s
(run on the engine's own process group, so they never meet the script's collectives on torch's
default group); ``DistributedOptimizer`` is :func:`pgc_hvd.DistributedOptimizer` on this engine;
``CodedLoader`` is :class:`pgc_hvd.data.CodedLoader`; ``DistributedDataParallel`` and
``CodedSampler`` are the DDP door's (:mod:`pgc_hvd.runtime.ddp`).
"""

from __future__ import annotations

import pgc_hvd.torchdist as _engine
from pgc_hvd.torchdist import (Adasum, Average, CollectiveError, Compression, Max, Min,
                               Product, Sum, allgather, allgather_async, allreduce, allreduce_,
                               allreduce_async, allreduce_async_, alltoall, alltoall_async,
                               barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
                               broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                               cross_rank, cross_size, init, is_initialized, local_rank,
                               local_size, poll, rank, size, synchronize)

ENGINE = _engine.ENGINE


def shutdown() -> None:
    """Close this process's pgc_hvd optimizers (as at exit), then leave the world. Looked up on
    the engine at each call: the runtime wraps the engine's ``shutdown`` to close first."""
    _engine.shutdown()


def DistributedOptimizer(optimizer, named_parameters=None, *args, **kwargs):
    """:func:`pgc_hvd.DistributedOptimizer` on the torch.distributed engine (every argument as
    there); initialises the engine when :func:`init` was not called."""
    from pgc_hvd.runtime.distributed import DistributedOptimizer as build

    kwargs.pop("engine", None)
    kwargs.setdefault("hvd", _engine)
    if not _engine.is_initialized():
        _engine.init()
    return build(optimizer, named_parameters, *args, **kwargs)


def __getattr__(name):
    if name == "CodedLoader":       # lazy, as in pgc_hvd
        from pgc_hvd.data.coded_loader import CodedLoader
        return CodedLoader
    if name == "CodedSampler":
        from pgc_hvd.data.coded_sampler import CodedSampler
        return CodedSampler
    if name == "DistributedDataParallel":   # the DDP door
        from pgc_hvd.runtime.ddp import DistributedDataParallel
        return DistributedDataParallel
    raise AttributeError(f"module 'pgc_hvd.torch' has no attribute {name!r}")
