"""The end of training without ``close()``: every optimizer the user did not close is closed.

Horovod scripts end by leaving the loop (the interpreter exits, ``hvd.shutdown()``, the optimizer
goes out of scope); they have no ``close()``. An agent left running at exit would see Horovod shut
down under it (a rank that exits first shuts down its side) and report a rank that died, or wait
for a rank that has gone. So each :class:`pgc_hvd.DistributedOptimizer` registers here at
construction and is closed, with ``close()``'s own protocol (every rank serves collectives until
every rank is done, the ranks agree on the final version, catch up, compare the parameters), at
the first of:

* **interpreter exit**: an :mod:`atexit` hook, registered again at every construction so that it
  runs before Horovod's own (registered by ``hvd.init()``; atexit runs its hooks last-in
  first-out). Every rank of the same script reaches it with the same optimizers, so every rank
  closes the same ones in the same (construction) order. A closing that fails (the parameters
  differ across ranks, a rank did not answer within the timeout) prints its error and ends the
  process with status 1 after shutting Horovod down: it is never lost in an ignored atexit
  traceback;
* **``hvd.shutdown()``**: the module's ``shutdown`` is wrapped once (the ``hvd`` the optimizer
  was built with) to close that module's optimizers first; an error is raised after Horovod is
  shut down;
* **the optimizer being garbage-collected**: its ``__del__`` (:func:`collected`) cannot run
  collectives (it may run at any point, on any thread), so it marks this rank's loop as done
  (:meth:`~pgc_hvd.runtime.agent.CommAgent.leave`: the agent keeps serving collectives until
  every rank is done, no wait) and keeps the optimizer until exit or ``hvd.shutdown()`` closes it.

An uncaught exception ended the script (``sys.last_value``, set by the interpreter before the
atexit hooks run), or the optimizer's own step raised (``failed``: a check refused the first
step on every rank, the agent stopped on an error): the optimizers are not closed but aborted
(``abort()``: the other ranks are told that this rank's training thread raised and stop with an
error that names it, not one about a rank that died). An explicit ``close()`` (or ``abandon()``) makes all this a no-op: the
registry only holds optimizers whose ``closed`` is False.

It also owns the order of the closing steps themselves (:func:`close_in_order`, what
``close()`` runs; :func:`abandon_in_order`, what ``abandon()`` runs), each of which belongs to a
part: serve collectives until every rank is done (the agent), agree on the final version
V = max_r version_r and apply the decided updates up to it
(:func:`~pgc_hvd.runtime.consistency.final_versions`, the facade's ``apply_decided``), write the
last records (the recorder), compare the parameters' and the applied hyper-parameters' digests
(:func:`~pgc_hvd.runtime.consistency.check_close`, the digest kept by the
:class:`~pgc_hvd.runtime.step.Step`), remove the gradient hooks (the capture).

Owns the registry of unclosed optimizers (under its lock), the exit hook, the wrapped
``shutdown`` and the order of the closing steps. Threads: the training thread (``register``,
``close``, ``abandon``); the atexit hook, on the main thread; ``hvd.shutdown()``'s caller;
:func:`collected` (``__del__``): any thread, no collective.
May import: ``runtime.consistency`` and ``runtime.errors`` (``AgentError``); the optimizers
and the parts are used through their public members (``closed``, ``failed``, ``close``, ``abort``,
``abandon``, ``agent``, ``hvd``; the step's ``version`` and ``hyper_digest``).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import os
import sys
import threading
import traceback
import weakref
from typing import Callable, Optional

from pgc_hvd.runtime import consistency
from pgc_hvd.runtime.errors import AgentError

_lock = threading.RLock()
_serials = itertools.count()
_live: dict = {}          # serial -> weakref to a registered optimizer
_kept: dict = {}          # serial -> optimizer collected before it was closed (closed at exit)
_shutdowns: list = []     # Horovod's own shutdown functions that were wrapped


def register(opt) -> int:
    """Close ``opt`` at exit / ``hvd.shutdown()`` unless it is closed before; returns its serial
    (the order in which the optimizers are closed), to be passed to :func:`collected`."""
    with _lock:
        for k in [k for k, ref in _live.items() if ref() is None or ref().closed]:
            del _live[k]
        serial = next(_serials)
        _live[serial] = weakref.ref(opt)
    _wrap_shutdown(opt.hvd)
    atexit.unregister(_at_exit)   # last registered: runs before Horovod's shutdown hook
    atexit.register(_at_exit)
    return serial


def collected(opt, serial: int) -> None:
    """``opt.__del__``: an optimizer nobody closed is being collected. Mark its loop done (no
    wait, no collective) and keep it until exit or ``hvd.shutdown()`` closes it. A copy of the
    optimizer's attributes under another object (Lightning's ``LightningOptimizer`` takes the
    wrapped optimizer's ``__dict__`` and class, so it has this ``__del__`` and serial) is not
    the optimizer: its collection changes nothing while the registered one lives."""
    if opt.closed:
        return
    with _lock:
        ref = _live.get(serial)
        registered = ref() if ref is not None else None
        if registered is not None and registered is not opt:
            return
        _kept[serial] = opt
    try:
        opt.agent.leave()
    except Exception:   # noqa: BLE001 - a finaliser must not raise
        pass


def kept() -> list:
    """The optimizers collected before they were closed, waiting for exit or
    ``hvd.shutdown()``, in construction order."""
    with _lock:
        return [_kept[k] for k in sorted(_kept)]


def unclosed(hvd=None) -> list:
    """The registered optimizers not closed yet (of Horovod module ``hvd`` when given), in
    construction order."""
    with _lock:
        out = []
        for k in sorted(set(_live) | set(_kept)):
            opt = _kept.get(k)
            if opt is None:
                opt = _live[k]()
            if opt is not None and not opt.closed and (hvd is None or opt.hvd is hvd):
                out.append((k, opt))
        return out


def crashed() -> bool:
    """Whether an uncaught exception is ending the interpreter (the interpreter sets
    ``sys.last_value`` when it prints one, before the atexit hooks run)."""
    return getattr(sys, "last_exc", None) is not None or \
        getattr(sys, "last_value", None) is not None


def _running(hvd) -> bool:
    try:
        return bool(hvd.is_initialized())
    except Exception:   # noqa: BLE001 - a stand-in without is_initialized
        return True


def close_all(hvd=None, *, failed: bool = False) -> list:
    """Close every unclosed optimizer (of ``hvd`` when given), in construction order; with
    ``failed`` abort them instead. Returns the errors raised (each optimizer is tried)."""
    errors = []
    for serial, opt in unclosed(hvd):
        try:
            if failed or opt.failed:
                opt.abort()
            elif not _running(opt.hvd):   # Horovod already shut down: no collective possible
                opt.abandon()
            else:
                opt.close()
        except BaseException as err:   # noqa: BLE001 - reported by the caller
            errors.append(err)
        finally:
            with _lock:
                _kept.pop(serial, None)
                _live.pop(serial, None)
    return errors


def _wrap_shutdown(hvd) -> None:
    orig = getattr(hvd, "shutdown", None)
    if not callable(orig) or getattr(orig, "__pgc_hvd_closes_first__", False):
        return

    @functools.wraps(orig)
    def shutdown(*args, **kwargs):
        errors = close_all(hvd, failed=crashed())
        try:
            return orig(*args, **kwargs)
        finally:
            if errors:
                raise errors[0]

    shutdown.__pgc_hvd_closes_first__ = True
    try:
        hvd.shutdown = shutdown
    except (AttributeError, TypeError):
        return
    _shutdowns.append(orig)


def _at_exit() -> None:
    failed = crashed()
    errors = close_all(failed=failed)
    if not errors or failed:
        return
    for err in errors:
        sys.stderr.write("pgc_hvd: closing the optimizer at exit (no close() was called) "
                         "failed:\n" + "".join(traceback.format_exception(err)))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # noqa: BLE001
            pass
    for shutdown in _shutdowns:
        try:
            shutdown()
        except Exception:   # noqa: BLE001
            pass
    os._exit(1)


# -- the closing steps (close(), abandon()) ------------------------------------------------------
def close_in_order(hvd, config, rank: int, *, step, agent, faults, recorder, capture, params,
                   apply_decided: Callable[[Optional[int]], None], ends: list) -> None:
    """The closing steps (module doc; ``DistributedOptimizer.close``): the agent is started
    first when the first step never came (``step.started`` False); ``ends`` gets every rank's
    version at the end of its loop once the ranks have agreed on them (kept when a later
    check raises). A disagreement raises :class:`AgentError` on every rank naming the
    ranks."""
    try:
        if not step.started:
            step.start()
        try:
            agent.finish()
        except AgentError as err:
            faults.raise_explained(err)
        ends.extend(consistency.final_versions(hvd, step.version, timeout=config.timeout,
                                               name=f"{config.name}.close.version", rank=rank))
        fault = None
        try:
            apply_decided(max(ends))
        except consistency.NonFiniteParameters as err:
            fault = err   # raised after the comparison, which the other ranks wait for
        recorder.drain(agent)
        consistency.check_close(hvd, step.version, params, step.hyper_digest,
                                name=f"{config.name}.close", timeout=config.timeout, rank=rank,
                                fault=fault)
    finally:
        capture.remove_hooks()
        recorder.close()


def abandon_in_order(join_timeout: float, *, agent, recorder, capture,
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
