"""The engine: which engine's collectives the runtime uses, Horovod's or torch.distributed's.

``resolve(engine)`` returns the module object the runtime calls (``opt.hvd``):

* ``"horovod"``: ``horovod.torch`` (as before; the script calls ``hvd.init()``);
* ``"torch"``: :mod:`pgc_hvd.torchdist` (Horovod's API over torch.distributed process groups),
  initialised here when the script has not (``pgc_hvd.torch.init()``; a default group the script
  made with ``dist.init_process_group`` is used as it is);
* None (default): from the environment (:func:`from_environment`). ``horovodrun`` sets
  ``HOROVOD_RANK`` / ``HOROVOD_SIZE``: Horovod. ``torchrun`` sets ``TORCHELASTIC_RUN_ID`` and
  ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR``, and a script may have initialised
  torch.distributed itself: torch. Neither (one process, or Horovod under ``mpirun``): Horovod
  when it can be imported (the behaviour before the torch engine), else torch.

How the runtime then calls the engine (collectives with deadlines under stable names, the
entry points of Horovod's private ``mpi_ops`` it uses or wraps) is
:mod:`pgc_hvd.runtime.communicator`'s: those run in every step, beside the data plane.

Owns the engine's choice; no state. Thread: the training thread, at construction.
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
