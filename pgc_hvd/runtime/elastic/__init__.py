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
already (:data:`.cascade.SOCKETS`), so that the first world's gloo sockets are told apart. An
elastic script also calls :func:`response_cache_off` before ``hvd.init()`` (the recipe,
``launch/elastic_train.py``, does): Horovod's response cache, whose per-cycle bit allreduce can
abort a survivor in gloo when a world breaks, is then off unless the user set it. The import
changes no environment variable (a test session or a notebook that imports this package keeps
Horovod's defaults for its other jobs). The other names load on first use (:mod:`.state`
imports Horovod; :mod:`.checkpoints` does not).

Owns the response cache's setting (:func:`response_cache_off`, :func:`cache_off`) and the
package's lazy names; no state. Threads: import time (:mod:`.cascade` marks the sockets), the
training thread (before ``hvd.init()``).
May import: its modules (:mod:`.cascade` at import, the others lazily).
"""

from __future__ import annotations

import importlib
import os
import sys

from pgc_hvd.runtime.elastic import cascade  # noqa: F401  (marks the sockets held now)

#: the environment variable Horovod reads at each ``hvd.init()`` for its response cache's size
CACHE_ENV = "HOROVOD_CACHE_CAPACITY"


def response_cache_off(env=None) -> bool:
    """Turn Horovod's response cache off for the worlds this process will init:
    ``HOROVOD_CACHE_CAPACITY=0`` in ``env`` (default ``os.environ``) unless it is set already
    (the user's value wins) or Horovod is already initialized in this process (then the current
    world has the cache on, and a later world of this process must have it too, or its ranks
    would disagree on the negotiation: every rank of a job runs the same script, so they all
    take the same branch). Returns whether the cache is off now (:func:`cache_off`).

    Why (issue 38, docs/elastic.md "Killing rank 0"): with the cache on, Horovod's background
    loop runs an 8-byte allreduce of the cache bits every cycle, on the same gloo slot as every
    data allreduce (Horovod sets no tag). When a world breaks in a ring allreduce, the rank that
    sent to the dead one fails first and its next cycle posts that 8-byte receive from its other
    ring neighbour, which is still in the broken allreduce with a segment queued for it; gloo
    sends the segment into the 8-byte receive and aborts the process in its transport thread
    (``op.preamble.length <= op.nbytes. 308 vs 8``), which no Python code can catch. Without
    the cache the loop negotiates by gather and broadcast to rank 0, which post no allreduce.
    That costs step time (4.2 ms a version, +10%, on the 2-core test machine: docs/elastic.md
    has the figures); ``HOROVOD_CACHE_CAPACITY=1024`` for every rank keeps the cache."""
    env = os.environ if env is None else env
    if CACHE_ENV not in env:
        hvd = sys.modules.get("horovod.torch")
        try:
            started = hvd is not None and bool(hvd.is_initialized())
        except (AttributeError, ValueError, RuntimeError):
            started = False
        if not started:
            env[CACHE_ENV] = "0"
    return cache_off(env)


def cache_off(env=None) -> bool:
    """Whether the next ``hvd.init()`` has Horovod's response cache off
    (``HOROVOD_CACHE_CAPACITY`` is 0; Horovod's default, when unset, is 1024)."""
    env = os.environ if env is None else env
    try:
        return int(env.get(CACHE_ENV, "1024").strip()) == 0
    except ValueError:
        return False


_WHERE = {"ElasticState": "state", "check_timeouts": "state",
          "world_error": "world", "abandon": "world", "bcast_object": "world",
          "horovod_bcast": "world",
          "ElasticCheckpoints": "checkpoints", "ElasticCheckpointError": "checkpoints"}

__all__ = sorted(_WHERE) + ["CACHE_ENV", "cache_off", "cascade", "response_cache_off"]


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
