"""Horovod runtime: each rank is one worker of a gradient-coding scheme.

* :func:`DistributedOptimizer` -- wraps a torch optimizer like ``hvd.DistributedOptimizer``; a
  communication agent thread per rank decides every step in a control phase (which ranks are
  ready; the scheme's rule) and a data phase (one allreduce of the ranks' weighted contributions
  for dense messages, an allgather of sparse top-kappa ones; :mod:`pgc_hvd.compress.codecs`).
* :class:`PartitionLoader` -- the n data partitions and, per step, the batches the scheme asks
  a rank to evaluate.
* :class:`TopK` -- top-kappa compression of the coded messages (:mod:`pgc_hvd.compress`).
* :func:`save_checkpoint` / :func:`load_checkpoint` -- model, optimizer, ring, step, RNG, trace;
  a restore is checked in full and agreed by every rank, or refused with :class:`CheckpointError`.

Owns no state and no code: the package's public names, re-exported from the modules that
own them. Thread: import time only.
May import: ``runtime.checkpoint``, ``runtime.distributed``, ``runtime.errors``,
``data.partition_loader``, ``compress`` (the names it re-exports).
"""

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from pgc_hvd.data.partition_loader import PartitionLoader
from pgc_hvd.compress import TopK
from pgc_hvd.runtime.distributed import DistributedOptimizer

__all__ = ["DistributedOptimizer", "TopK", "PartitionLoader", "AgentError", "save_checkpoint",
           "load_checkpoint", "CheckpointError"]
