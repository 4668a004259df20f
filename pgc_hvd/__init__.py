"""pgc_hvd: straggler-tolerant Horovod + PyTorch data-parallel training by gradient coding.

Synchronous data-parallel SGD waits for the slowest of n workers every step. Gradient coding
replicates the n data partitions so that a step can finish with the n - s fastest workers:

* GC (Tandon et al.): every worker computes c = s + 1 partitions per step and sends one coded
  message; the decoder combines the n - s fastest messages with coefficients a_I, a_I B_I = 1.
* PGC (pipelined gradient coding): every worker computes one partition per step and forms its
  coded message from a ring buffer of its last c evaluations (c - 1 of them stale).
* BCGC (binary cyclic gradient coding): a binary code whose decoder sums one complete class of
  workers, so the decode weights stay 1 and top-kappa compression of messages stays stable.

Layers (arrows point down): ``runtime`` (Horovod engine) and ``sim`` (virtual-time engine) drive
the same ``schemes``, which use ``codes`` (linear algebra) and ``ops`` (the compiled kernels in
``pgc_hvd._C``). Importing this package is cheap: it loads neither torch nor horovod.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "DistributedOptimizer", "DistributedDataParallel", "CodedLoader",
           "CodedSampler", "engine"]


def __getattr__(name):
    # lazy: `import pgc_hvd` stays free of torch and horovod
    if name == "DistributedOptimizer":
        from pgc_hvd.runtime.distributed import DistributedOptimizer

        return DistributedOptimizer
    if name == "CodedLoader":
        from pgc_hvd.data.coded_loader import CodedLoader

        return CodedLoader
    if name == "DistributedDataParallel":   # the DDP door (torchrun)
        from pgc_hvd.runtime.ddp import DistributedDataParallel

        return DistributedDataParallel
    if name == "CodedSampler":
        from pgc_hvd.data.coded_sampler import CodedSampler

        return CodedSampler
    if name == "engine":     # the launcher's engine module: horovod.torch or pgc_hvd.torch
        return _engine
    if name in _SUBPACKAGES:   # `pgc_hvd.data.CodedLoader` after a bare `import pgc_hvd`
        import importlib

        return importlib.import_module(f"pgc_hvd.{name}")
    raise AttributeError(f"module 'pgc_hvd' has no attribute {name!r}")


_SUBPACKAGES = ("apps", "codes", "compress", "control", "data", "delays", "metrics", "models",
                "ops", "runtime", "schemes", "sim")


def _engine(name=None):
    """The engine module a launcher-agnostic script uses as ``hvd``: ``horovod.torch`` under
    ``horovodrun``, :mod:`pgc_hvd.torch` (torch.distributed) under ``torchrun``
    (:func:`pgc_hvd.runtime.engine.from_environment`); ``name``: ``"horovod"`` or ``"torch"``.
    Not initialised: call its ``init()``."""
    import importlib

    from pgc_hvd.runtime.engine import from_environment
    chosen = name or from_environment()
    if chosen not in ("horovod", "torch"):
        raise ValueError(f"engine must be 'horovod' or 'torch', got {name!r}")
    return importlib.import_module("horovod.torch" if chosen == "horovod" else "pgc_hvd.torch")
