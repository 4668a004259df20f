"""The torch.distributed engine: Horovod's collective API on torch's process groups.

The runtime takes its collectives from a module object shaped like ``horovod.torch``
(``opt.hvd``): ``rank``/``size``, ``allgather_async``, ``alltoall_async``, ``allreduce_async_``,
``broadcast``, ``poll``/``synchronize``, the ops ``Sum``/``Average``. This package is that module
for ``torchrun``: the same names over ``torch.distributed`` (gloo for CPU tensors, NCCL for CUDA
ones), so the runtime runs unchanged on either engine.

* :mod:`~pgc_hvd.torchdist.ops`: the collectives on one process group, handles, the allgather
  of rows of different lengths without padding;
* :mod:`~pgc_hvd.torchdist.world`: init/shutdown, the process groups (the training thread's,
  and a control and a data group per communication agent) and which thread owns each, the
  ranks that are gone;
* :mod:`~pgc_hvd.torchdist.state`: ``broadcast_parameters``, ``broadcast_optimizer_state``,
  ``broadcast_object``.

The module-level collectives below run on the training thread's group. The runtime's agent
gets its own groups through :func:`agent_ops` (``runtime.communicator.Collectives`` asks for them).
Users import :mod:`pgc_hvd.torch` (this API plus ``DistributedOptimizer`` and ``CodedLoader``).

May import: the standard library and torch; nothing of the package above it.
"""

from __future__ import annotations

from pgc_hvd.torchdist import state as _state
from pgc_hvd.torchdist.ops import (Adasum, Average, CollectiveError, Handle, Max, Min, Product,
                                   Sum)
from pgc_hvd.torchdist.world import (agent_ops, cross_rank, cross_size, default_backend,
                                     explain, init, is_initialized, local_rank, local_size, rank,
                                     shutdown, size, train_ops)

ENGINE = "torch.distributed"
global_process_set = None     # Horovod's name; only the global set exists here


def explain_failure() -> str:
    """The ranks on this host whose process has exited, as a sentence ("" when none)."""
    return explain()


def poll(handle: Handle) -> bool:
    return handle.poll()


def synchronize(handle: Handle):
    return handle.wait()


def allgather_async(tensor, name=None) -> Handle:
    return train_ops().allgather_async(tensor, name=name)


def allgather(tensor, name=None):
    return train_ops().allgather(tensor, name=name)


def allreduce_async_(tensor, average=None, name=None, op=None, **scale) -> Handle:
    return train_ops().allreduce_async_(tensor, average, name, op, **scale)


def allreduce_async(tensor, average=None, name=None, op=None, **scale) -> Handle:
    return train_ops().allreduce_async(tensor, average, name, op, **scale)


def allreduce_(tensor, average=None, name=None, op=None, **scale):
    return train_ops().allreduce_(tensor, average, name, op, **scale)


def allreduce(tensor, average=None, name=None, op=None, **scale):
    return train_ops().allreduce(tensor, average, name, op, **scale)


def alltoall_async(tensor, splits=None, name=None) -> Handle:
    return train_ops().alltoall_async(tensor, splits, name)


def alltoall(tensor, splits=None, name=None):
    return train_ops().alltoall(tensor, splits, name)


def broadcast_async_(tensor, root_rank, name=None) -> Handle:
    return train_ops().broadcast_async_(tensor, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    return train_ops().broadcast_(tensor, root_rank, name)


def broadcast_async(tensor, root_rank, name=None) -> Handle:
    return train_ops().broadcast_async(tensor, root_rank, name)


def broadcast(tensor, root_rank, name=None):
    return train_ops().broadcast(tensor, root_rank, name)


def barrier(name=None) -> None:
    train_ops().barrier(name)


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Horovod's: every tensor of ``params`` (a state_dict, ``named_parameters()``, a list)
    becomes rank ``root_rank``'s, in place."""
    _state.broadcast_parameters(train_ops(), params, root_rank)


def broadcast_optimizer_state(optimizer, root_rank: int = 0) -> None:
    """Horovod's: the optimizer's state and scalar options become rank ``root_rank``'s."""
    _state.broadcast_optimizer_state(train_ops(), optimizer, root_rank)


def broadcast_object(obj, root_rank: int = 0, name: str = "pgc.torch.object"):
    """Rank ``root_rank``'s picklable ``obj`` on every rank."""
    return _state.broadcast_object(train_ops(), obj, root_rank, name)


class Compression:
    """Horovod's ``hvd.Compression`` names for pgc_hvd's message wire formats: ``none``
    (float32) and ``fp16`` (float16 messages: half the bytes)."""

    class none:
        pgc_wire_dtype = "float32"

    class fp16:
        pgc_wire_dtype = "float16"
