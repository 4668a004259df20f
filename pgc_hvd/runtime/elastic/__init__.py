"""Elastic pgc_hvd: Horovod's elastic mode re-forms the world when a rank dies or hosts are
added, and the run goes on in it (docs/elastic.md).

* :class:`ElasticState` (:mod:`.state`): the ``State`` to hand ``hvd.elastic.run``; it rebuilds
  the optimizer and the data partitions for every world;
* :func:`world_error`, :func:`abandon`, :func:`bcast_object` (:mod:`.world`): whether an error
  broke the world, leaving the old world's optimizer without a collective, objects broadcast as
  tensors and plain types only;
* :class:`ElasticCheckpoints` (:mod:`.checkpoints`): the decided version on disk every step, so
  that a job Horovod could not keep alive restarts from it;
* :mod:`.cascade`: this rank's gloo sockets of the current world, shut down when it breaks so
  that every survivor leaves at once.

Import this package before ``hvd.init()``: the import marks the sockets the process holds
already (:data:`.cascade.SOCKETS`), so that the first world's gloo sockets are told apart. The
other names load on first use (:mod:`.state` imports Horovod; :mod:`.checkpoints` does not).

May import: its modules (:mod:`.cascade` at import, the others lazily).
"""

from __future__ import annotations

import importlib

from pgc_hvd.runtime.elastic import cascade  # noqa: F401  (marks the sockets held now)

_WHERE = {"ElasticState": "state", "check_timeouts": "state",
          "world_error": "world", "abandon": "world", "bcast_object": "world",
          "horovod_bcast": "world",
          "ElasticCheckpoints": "checkpoints", "ElasticCheckpointError": "checkpoints"}

__all__ = sorted(_WHERE) + ["cascade"]


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
