"""Which engine's collectives the runtime uses: Horovod's or torch.distributed's.

``resolve(engine)`` returns the module object the runtime calls (``opt.hvd``):

* ``"horovod"``: ``horovod.torch`` (as before; the script calls ``hvd.init()``);
* ``"torch"``: :mod:`pgc_hvd.torchdist` (Horovod's API over torch.distributed process groups),
  initialised here when the script has not (``pgc_hvd.torch.init()``; a default group the script
  made with ``dist.init_process_group`` is used as it is);
* None (default): from the environment. ``horovodrun`` sets ``HOROVOD_RANK`` /
  ``HOROVOD_SIZE``: Horovod. ``torchrun`` sets ``TORCHELASTIC_RUN_ID`` and ``RANK`` /
  ``WORLD_SIZE`` / ``MASTER_ADDR``, and a script may have initialised torch.distributed itself:
  torch. Neither (one process, or Horovod under ``mpirun``): Horovod when it can be imported
  (the behaviour before the torch engine), else torch.

May import: the standard library, ``torchdist`` (lazily) and horovod (lazily).
"""

from __future__ import annotations

import os

ENGINES = ("horovod", "torch")


def from_environment() -> str:
    """The engine the launcher's environment names (module doc)."""
    env = os.environ
    if "HOROVOD_RANK" in env or "HOROVOD_SIZE" in env:
        return "horovod"
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "WORLD_SIZE",
                                                               "MASTER_ADDR")):
        return "torch"
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return "torch"
    except ImportError:
        pass
    try:
        import horovod.torch  # noqa: F401
        return "horovod"
    except ImportError:
        return "torch"


def resolve(engine=None):
    """The engine module for ``engine`` (``"horovod"``, ``"torch"``, None: from the
    environment, or an engine module itself, returned as it is)."""
    if engine is not None and not isinstance(engine, str):
        return engine
    name = from_environment() if engine is None else engine
    if name == "horovod":
        import horovod.torch as hvd
        return hvd
    if name == "torch":
        import pgc_hvd.torchdist as engine_module
        engine_module.init()
        return engine_module
    raise ValueError(f"engine must be 'horovod', 'torch' or None (from the environment), got "
                     f"{engine!r}")


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
        import itertools
        import threading
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
    import inspect
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
