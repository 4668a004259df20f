"""The engine's collectives as the runtime calls them: which engine, the user's unnamed ops named,
collectives with deadlines, and the control channels over them.

Which engine (:func:`resolve`, at the end of this module, with :func:`name_unnamed_ops`):
Horovod's or torch.distributed's; see "The engine" below.

Control channels: how the ranks exchange their control rows each round (one interface).

``channel.exchange(row, packed=None) -> (rows, payloads)``: publish this rank's control row
(:mod:`pgc_hvd.runtime.rows`, float64) and return every rank's row in rank order, plus
``{(rank, step): payload}`` of the payloads that rode along (identical on every rank);
``channel.close()`` after the last round (the bye protocol where there is one);
``channel.stop()`` when the agent stops on an error or is cut off (its own threads end, no
wait for the other ranks).

* :class:`AllgatherChannel`: a Horovod allgather of the rows; with ``carries_payloads`` (the
  optimistic one-collective rounds) a rank may pass ``packed``, a float32 tensor whose first
  2 ``ctrl_len`` words receive the row and whose tail is the payload row, so the payload
  travels in the same collective.
* :class:`~pgc_hvd.runtime.control_store.StoreChannel`: a TCPStore served by rank 0 (rows only).

Collectives run through a :class:`Collectives` object: asynchronous Horovod ops polled with a
deadline (a dead or hung rank raises :class:`AgentError` instead of hanging), under stable names
(``{name}.{kind}``: Horovod's response cache can then skip the negotiation of a name it has
seen; one op per kind is in flight at a time, so reusing the name is safe).

The engine: which engine's collectives the runtime uses, Horovod's or torch.distributed's.
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

Owns the engine's choice, the naming of the user's unnamed Horovod ops, :class:`Collectives`
and the control channels. May import: ``runtime.errors``, ``runtime.rows``, torch, the standard
library, ``torchdist`` (lazily) and horovod (lazily).
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Optional

import torch

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import WireError, parse_packed


def wait_for_handle(hvd, handle, timeout: float, abort=None) -> bool:
    """Poll an asynchronous Horovod handle until it completes (True) or ``timeout`` seconds pass
    (False), or ``abort()`` (when given) says to give up (False). Short sleeps first (a small
    allgather takes 1-3 ms here), then at most 1 ms between polls; a blocking ``synchronize``
    could not time out on a hung rank."""
    deadline = time.monotonic() + timeout
    sleep = 0.0001
    while not hvd.poll(handle):
        if time.monotonic() > deadline or (abort is not None and abort()):
            return False
        time.sleep(sleep)
        sleep = min(sleep * 1.5, 0.001)
    return True


class Collectives:
    """Horovod allgather / alltoall / in-place allreduce (sum) with a deadline, for one
    agent."""

    def __init__(self, hvd, rank: int, name: str, timeout: float, device=None):
        # an engine that matches collectives by call order (pgc_hvd.torchdist) gives each
        # agent its own process groups, never shared with the training thread (``device``: the
        # data plane's, which that engine checks against its backend)
        groups = getattr(hvd, "agent_ops", None)
        hvd = groups(name, timeout, device=device) if callable(groups) else hvd
        self.hvd, self.rank, self.name, self.timeout = hvd, int(rank), name, float(timeout)
        self.engine = getattr(hvd, "ENGINE", "Horovod")
        self.ops = 0
        self.step = 0          # the round being decided (for error messages)
        self._into = _output_entry_points(hvd)

    def cut_off(self) -> None:
        """Every later collective fails with AgentError (an abandoned world's agent that still
        runs must never take part in the next world's collectives)."""
        self.hvd = _Gone()
        self._into = None

    def _run(self, kind: str, start, timeout: Optional[float] = None, abort=None):
        self.ops += 1
        name = f"{self.name}.{kind}"
        limit = self.timeout if timeout is None else float(timeout)
        try:
            handle = start(name)
            if not wait_for_handle(self.hvd, handle, limit, abort):
                if abort is not None and abort():
                    raise AgentError(f"rank {self.rank}: collective {name} #{self.ops} (step "
                                     f"{self.step}) given up: another rank's collective "
                                     f"failed", broken_world=True)
                raise AgentError(
                    f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) got no "
                    f"answer within {limit:.0f}s: a rank has died or hung{self._who()}; "
                    f"stopping instead of hanging")
            return self.hvd.synchronize(handle)
        except AgentError:
            raise
        except Exception as err:
            raise AgentError(
                f"rank {self.rank}: collective {name} #{self.ops} (step {self.step}) failed: a "
                f"rank has died or shut down {self.engine}; stopping ({type(err).__name__}: "
                f"{err})", broken_world=True) from err

    def _who(self) -> str:
        """The engine's note on which ranks are gone (the torch engine's; Horovod has none)."""
        explain = getattr(self.hvd, "explain_failure", None)
        why = explain() if callable(explain) else ""
        return f" ({why})" if why else ""

    def allgather(self, tensor: torch.Tensor, kind: str,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The concatenation of every rank's ``tensor``; into ``out`` (a recycled buffer of the
        result's size: a fresh one of tens of MB is page-faulted at every step, 25-35% of the
        collective's time at 23 MB here) when given and this Horovod has the entry point."""
        if out is not None and self._into is not None:
            into, ps = self._into["allgather"], self._into["process_set"]
            return self._run(kind, lambda nm: into(tensor, out, nm, ps))
        return self._run(kind, lambda nm: self.hvd.allgather_async(tensor, name=nm))

    def alltoall(self, tensor: torch.Tensor, kind: str,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Equal splits: rank j receives the j-th of n equal chunks of every rank's ``tensor``,
        in rank order (``tensor.numel()`` must be a multiple of n); into ``out`` as
        :meth:`allgather`."""
        if out is not None and self._into is not None:
            into, ps = self._into["alltoall"], self._into["process_set"]
            splits = torch.empty(0, dtype=torch.int32)
            received = torch.empty(int(self.hvd.size()), dtype=torch.int32)
            got = self._run(kind, lambda nm: into(tensor, splits, out, received, nm, ps))
        else:
            got = self._run(kind, lambda nm: self.hvd.alltoall_async(tensor, name=nm))
        return got[0] if isinstance(got, (tuple, list)) else got

    def broadcast_(self, tensor: torch.Tensor, root: int, kind: str,
                   timeout: Optional[float] = None, abort=None) -> torch.Tensor:
        """In place: every rank's ``tensor`` (same shape and dtype everywhere) becomes rank
        ``root``'s; waits up to ``timeout`` seconds (default: the agent's), or until
        ``abort()`` says to give up (AgentError, ``broken_world``)."""
        hvd = self.hvd
        return self._run(kind, lambda nm: hvd.broadcast_async_(tensor, int(root), name=nm),
                         timeout, abort)

    def allreduce_sum_(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        """In-place sum over ranks: every rank ends with the same bits (the ring's allgather
        phase hands every rank the reduced chunks)."""
        hvd = self.hvd
        return self._run(kind, lambda nm: hvd.allreduce_async_(tensor, name=nm, op=hvd.Sum))


def _output_entry_points(hvd) -> Optional[dict]:
    """Horovod's allgather / alltoall entry points that take the output tensor (horovod.torch's
    ``mpi_ops._allgather_async(tensor, output, name, process_set)`` and ``_alltoall_async(tensor,
    splits, output, output_received_splits, name, process_set)``, what its public
    ``allgather_async`` / ``alltoall_async`` call with a fresh output), when they exist with
    exactly these parameters; None otherwise (the public calls are used)."""
    ops = getattr(hvd, "mpi_ops", None)
    ag, a2a = getattr(ops, "_allgather_async", None), getattr(ops, "_alltoall_async", None)
    ps = getattr(ops, "global_process_set", None)
    try:
        if (ag is None or a2a is None or ps is None
                or list(inspect.signature(ag).parameters) != ["tensor", "output", "name",
                                                              "process_set"]
                or list(inspect.signature(a2a).parameters) != [
                    "tensor", "splits", "output", "output_received_splits", "name",
                    "process_set"]):
            return None
    except (TypeError, ValueError):
        return None
    return {"allgather": ag, "alltoall": a2a, "process_set": ps}


def _packed(row: torch.Tensor, packed: Optional[torch.Tensor], length: int) -> torch.Tensor:
    """The float32 tensor a rank sends: its row's float64 words bit-cast (2 ``length`` words),
    written in front of the payload when ``packed`` carries one."""
    words = row.view(torch.float32)
    if packed is None:
        return words
    packed[: 2 * length].copy_(words)
    return packed


class AllgatherChannel:
    """Control rows by Horovod allgather; payloads may ride along (``carries_payloads``)."""

    def __init__(self, coll: Collectives, n: int, length: int, width: int,
                 carries_payloads: bool):
        self.coll, self.n, self.length, self.width = coll, int(n), int(length), int(width)
        self.carries_payloads = bool(carries_payloads)
        self.ops = 0   # control collectives issued (control_ops in the records)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        self.ops += 1
        if not self.carries_payloads:
            got = self.coll.allgather(row.view(1, self.length), "ctl")
            return got.tolist(), {}
        got = self.coll.allgather(_packed(row, packed, self.length), "ctl")
        try:
            return parse_packed(got, self.n, self.length, self.width)
        except WireError as err:
            raise AgentError(f"rank {self.coll.rank}: {err}") from err

    def stop(self) -> None:
        """No thread of its own to stop."""

    def close(self) -> None:
        pass


class LoopbackChannel:
    """The control channel of a world of one rank (n = 1): the rank's own row, and its payload
    when one rides along. The agent's protocol then runs without Horovod (tests of its
    bookkeeping over many steps, single-process runs)."""

    carries_payloads = True
    ops = 0   # no control messages leave the rank

    def __init__(self, length: int, width: int):
        self.length, self.width = int(length), int(width)

    def exchange(self, row: torch.Tensor, packed: Optional[torch.Tensor] = None):
        return parse_packed(_packed(row, packed, self.length).clone(), 1, self.length,
                            self.width)

    def stop(self) -> None:
        """No thread of its own to stop."""

    def close(self) -> None:
        pass


class _Gone:
    """Stands in for Horovod in an abandoned agent: every collective fails."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise AgentError("pgc_hvd elastic: this agent's world was abandoned")
        return refuse


def control_channel(control: str, coll: Collectives, *, n: int, length: int, width: int,
                    optimistic: bool = False, device=None):
    """The control channel ``control`` names, for an agent whose collectives are ``coll``:
    ``"allgather"`` (:class:`AllgatherChannel`; payloads ride along when ``optimistic``, CPU
    payloads only), ``"store"`` (:class:`~pgc_hvd.runtime.control_store.StoreChannel`, a
    TCPStore served by rank 0; a collective: every rank must build it) or ``"log"``
    (:class:`~pgc_hvd.runtime.control_log.LogChannel`: an ordered log in that store, one
    decider, no polling; a collective too)."""
    if control == "log":
        if optimistic:
            raise ValueError("control='log' exchanges control rows through a key-value "
                             "store, which cannot carry payloads: leave optimistic unset")
        from pgc_hvd.runtime.control_log import LogChannel
        return LogChannel.create(coll, n, length)
    if control == "store":
        if optimistic:
            raise ValueError("control='store' exchanges control rows through a key-value "
                             "store, which cannot carry payloads: leave optimistic unset")
        from pgc_hvd.runtime.control_store import StoreChannel
        return StoreChannel.create(coll.hvd, coll.rank, n, coll.name, coll.timeout)
    if control != "allgather":
        raise ValueError(f"control must be 'allgather', 'store' or 'log', got {control!r}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if optimistic and dev.type != "cpu":
        raise ValueError("optimistic one-collective steps need CPU payloads (the control "
                         "rows live on the CPU)")
    return AllgatherChannel(coll, n, length, width, carries_payloads=bool(optimistic))


# ---- the engine: Horovod's or torch.distributed's, and the user's unnamed ops named ---------


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
