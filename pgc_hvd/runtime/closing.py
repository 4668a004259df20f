"""The optimizer's end of life: ``close()`` (the ranks agree) and ``abandon()`` (the world is gone).

(When neither is called, :mod:`pgc_hvd.runtime.lifecycle` calls ``close()`` at exit.)

Owns the order of the closing steps, each of which belongs to a part: serve collectives until
every rank is done (the agent), agree on the final version V = max_r version_r and apply the
decided updates up to it (:func:`~pgc_hvd.runtime.consistency.final_versions`, the facade's
``apply_decided``), write the last records (the recorder), compare the parameters' and the
applied hyper-parameters' digests (:func:`~pgc_hvd.runtime.consistency.check_close`), remove
the gradient hooks (the capture). The facade keeps its flags (started, closed) and its version;
this module takes the parts it drives and the facade's ``version`` / ``apply_decided`` as
arguments, so it reads no state of its own.

Runs on the training thread. May import: ``runtime.channel`` (``AgentError``) and
``runtime.consistency``; the parts are used through their public members.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from pgc_hvd.runtime import consistency
from pgc_hvd.runtime.errors import AgentError


def close(hvd, config, rank: int, *, version: Callable[[], int], start: Optional[Callable],
          agent, faults, recorder, capture, applier, params,
          apply_decided: Callable[[Optional[int]], None],
          on_versions: Callable[[list], None]) -> None:
    """The closing steps (module doc; ``DistributedOptimizer.close``): ``start`` (when the
    first step never came) starts the agent first; ``on_versions`` gets every rank's version
    at the end of its loop once the ranks have agreed on them. A disagreement raises
    :class:`AgentError` on every rank naming the ranks."""
    try:
        if start is not None:
            start()
        try:
            agent.finish()
        except AgentError as err:
            faults.raise_explained(err)
        ends = consistency.final_versions(hvd, version(), name=f"{config.name}.close.version",
                                          timeout=config.timeout, rank=rank)
        on_versions(ends)
        fault = None
        try:
            apply_decided(max(ends))
        except consistency.NonFiniteParameters as err:
            fault = err   # raised after the comparison, which the other ranks wait for
        recorder.drain(agent)
        consistency.check_close(hvd, version(), params, applier.hyper_digest,
                                name=f"{config.name}.close", timeout=config.timeout, rank=rank,
                                fault=fault)
    finally:
        capture.remove_hooks()
        recorder.close()


def abandon(join_timeout: float, *, agent, recorder, capture,
            apply_decided: Callable[[Optional[int]], None]) -> None:
    """Leave without any collective (``DistributedOptimizer.abandon``): wait up to
    ``join_timeout`` seconds for the agent thread to stop, apply every update it decided (the
    same on every survivor; a fault there is logged, the version reached kept), write the
    records, remove the gradient hooks."""
    agent.join(join_timeout)
    try:
        apply_decided(None)
    except Exception as err:   # e.g. the non-finite check: keep the version reached
        logging.getLogger("pgc_hvd.runtime").warning(
            "pgc_hvd: applying the abandoned world's decided updates stopped: %s", err)
    recorder.drain(agent)
    capture.remove_hooks()
