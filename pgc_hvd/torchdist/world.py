"""The torch engine's world: init, shutdown, ranks, its process groups, who is gone.

Process groups (every one spans the world; created on the training thread, in the same order on
every rank, which torch.distributed requires of ``new_group``):

* ``train``: the training thread's collectives (the consistency checks at construction, first
  step and close, the seed agreement, checkpoints, ``broadcast_parameters`` /
  ``broadcast_optimizer_state``, the module-level ``allgather`` ... of :mod:`pgc_hvd.torch`).
  Created by :func:`init`. The user's own collectives on torch's default group never meet it.
* per communication agent (the runtime's ``name``, e.g. ``"pgc"``): ``{name}.ctl``, the control
  rows (gloo: they live on the CPU), and ``{name}.data``, the data plane (gloo for CPU tensors,
  NCCL for CUDA ones when torch has NCCL). Created by :func:`agent_ops` when the optimizer builds
  its agent (after the construction check, on the training thread) and kept for the next
  optimizer of that name. Only the agent's thread issues on them, one collective at a time.

The backend (:func:`resolve_backend`, the one place it is checked): ``init(backend=...)``, else
the environment variable ``PGC_HVD_TORCH_BACKEND`` (``gloo`` or ``nccl``; what ``pgc-hvd train``
under ``torchrun`` and any unchanged script can set), else gloo for CPU tensors plus NCCL for
CUDA ones when torch sees a GPU and has NCCL. ``nccl`` always means ``cpu:gloo,cuda:nccl``: the
engine's own rows live on the CPU. NCCL runs one rank per GPU, so under it each group checks,
before its first collective on CUDA tensors, that no two ranks on a host hold the same GPU, and
refuses with the fix (one GPU per rank, or ``PGC_HVD_TORCH_BACKEND=gloo`` to let ranks share
one) instead of NCCL's failure in that collective (``GroupOps.check_gpu``); an agent's data group
is checked by :func:`agent_ops`, on the training thread, while the optimizer is built.

So each group has one issuing thread, and on every rank that thread issues the same sequence:
the training thread runs the same program on every rank (as Horovod's named collectives also
require); the agent issues one control allgather per round and, once every rank has the same
rows, the same decision and the same data collective (the rows are identical on every rank).

Who is gone: at :func:`init` every rank publishes its host name and process id (one allgather);
after a failure or a timeout :func:`explain` names the ranks on this host whose process has
exited ("rank 2 (pid 4242) has exited"). Ranks on other hosts are not probed.

May import: the standard library, torch and ``torchdist.ops``.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from pgc_hvd.torchdist.ops import GroupOps

DEFAULT_TIMEOUT = 300.0     # seconds; the process groups' own timeout (see init)


class _World:
    def __init__(self):
        self.lock = threading.Lock()
        self.train: Optional[GroupOps] = None
        self.agents: dict = {}
        self.peers: list = []           # (host, pid) per rank
        self.owns_default = False
        self.backend = "gloo"
        self.timeout = DEFAULT_TIMEOUT
        self.atexit = False


W = _World()


BACKEND_ENV = "PGC_HVD_TORCH_BACKEND"
NCCL = "cpu:gloo,cuda:nccl"       # what "nccl" means here: the engine's own rows are CPU tensors


def resolve_backend(value: str, where: str = "backend") -> str:
    """The torch.distributed backend string for ``value``: ``gloo``; ``nccl`` (or torch's own
    ``cpu:gloo,cuda:nccl``) -> ``cpu:gloo,cuda:nccl``, refused when this torch has no NCCL; any
    other ``device:backend,...`` string is torch's to check. ``where`` names the setting in the
    error."""
    key = str(value).strip().lower()
    if key == "gloo":
        return "gloo"
    if key in ("nccl", NCCL):
        if not dist.is_nccl_available():
            raise ValueError(f"{where}={value!r}: this torch was built without NCCL; use gloo")
        return NCCL
    if ":" in key:
        return key
    raise ValueError(f"{where}={value!r}: use gloo, or nccl (NCCL for CUDA tensors, gloo for "
                     f"CPU ones)")


def default_backend() -> str:
    """``PGC_HVD_TORCH_BACKEND`` when set (:func:`resolve_backend`), else gloo for CPU tensors
    plus NCCL for CUDA ones when torch sees a GPU and has NCCL."""
    chosen = os.environ.get(BACKEND_ENV, "").strip()
    if chosen:
        return resolve_backend(chosen, BACKEND_ENV)
    if torch.cuda.is_available() and dist.is_nccl_available():
        return NCCL
    return "gloo"


def uses_nccl_for_cuda(backend: str) -> bool:
    """Whether CUDA tensors go through NCCL under ``backend`` (a torch backend string)."""
    key = str(backend).lower()
    if key == "nccl":
        return True
    return any(part.strip() == "cuda:nccl" for part in key.split(","))


def init(backend: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """Join the world: torch's default process group from the environment ``torchrun`` sets
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), or a world of one process when
    none is set (as ``hvd.init()`` in a plain ``python script.py``); an already initialised
    default group (the script called ``dist.init_process_group``) is used as it is, its backend
    the engine's groups' (``nccl`` taken as ``cpu:gloo,cuda:nccl``: the engine's own rows are CPU
    tensors). Then the
    engine's ``train`` group and the peers' (host, pid). ``timeout``: the groups' own timeout
    in seconds (default 300; a collective blocked on a hung rank is abandoned by gloo after it,
    and the process exits no later; pgc_hvd's own deadlines are the optimizer's ``timeout``).
    ``backend``: gloo or nccl (:func:`resolve_backend`; default: :func:`default_backend`).
    Idempotent."""
    with W.lock:
        if W.train is not None:
            return
        W.timeout = float(timeout) if timeout is not None else DEFAULT_TIMEOUT
        if not dist.is_initialized():
            W.backend = (resolve_backend(backend, "init(backend)") if backend is not None
                         else default_backend())
            td = timedelta(seconds=W.timeout)
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                dist.init_process_group(W.backend, timeout=td)
            else:
                dist.init_process_group(W.backend, store=dist.HashStore(), rank=0,
                                        world_size=1, timeout=td)
            W.owns_default = True
        else:
            # the script's own dist.init_process_group("nccl"): the engine's groups still need
            # gloo for their CPU rows (peers, checks, control), so "nccl" is taken as NCCL's
            # pair; another backend of the script's is used as it is
            given = backend if backend is not None else str(dist.get_backend())
            W.backend = (resolve_backend(given, "the default process group's backend")
                         if given.strip().lower() in ("gloo", "nccl") else given)
        rank, size = dist.get_rank(), dist.get_world_size()
        W.train = GroupOps(_new_group(W.timeout), "train", rank, size, explain,
                           gpu_host=_gpu_host(W.backend))
        host = socket.gethostname()
        mine = torch.tensor([os.getpid(), _host_id(host)], dtype=torch.int64)
        got = W.train.allgather(mine.view(1, 2), name="pgc.torch.peers").tolist()
        W.peers = [(h, pid) for pid, h in got]
        if not W.atexit:
            atexit.register(shutdown)   # before any optimizer's hook: runs after them
            W.atexit = True


def _host_id(host: str) -> int:
    import hashlib
    return int.from_bytes(hashlib.blake2b(host.encode(), digest_size=7).digest(), "little")


def _gpu_host(backend: str) -> Optional[int]:
    """The host id a group checks one-GPU-per-rank with, when CUDA tensors go through NCCL."""
    return _host_id(socket.gethostname()) if uses_nccl_for_cuda(backend) else None


def _new_group(timeout: float, backend: Optional[str] = None):
    return dist.new_group(backend=backend or W.backend, timeout=timedelta(seconds=timeout))


def _require() -> GroupOps:
    if W.train is None:
        raise ValueError("pgc_hvd.torch has not been initialized; run pgc_hvd.torch.init() "
                         "(under torchrun) first")
    return W.train


def train_ops() -> GroupOps:
    """The training thread's group (module doc)."""
    return _require()


def agent_ops(name: str, timeout: float, device=None) -> "AgentOps":
    """The collectives of agent ``name``: its control and data groups (module doc), created at
    the first call for ``name`` on every rank (a collective; the training thread, while the
    optimizer is built) and reused by the next optimizer of that name. ``device``: where the
    agent's data plane lives; a CUDA one under NCCL is checked to be one GPU per rank here, on
    the training thread (``GroupOps.check_gpu``: a ValueError on every rank otherwise), not at
    the agent thread's first collective."""
    train = _require()
    with W.lock:
        ops = W.agents.get(name)
        if ops is None:
            # the groups' own timeout stays above the agent's deadline, so the agent's
            # "got no answer within" error comes first and gloo's later
            t = max(W.timeout, 2.0 * float(timeout) + 10.0)
            ctl = GroupOps(_new_group(t, "gloo"), f"{name}.ctl", train.rank(), train.size(),
                           explain)
            data = GroupOps(_new_group(t), f"{name}.data", train.rank(), train.size(),
                            explain, gpu_host=_gpu_host(W.backend))
            ops = W.agents[name] = AgentOps(ctl, data)
    # the data group's sums of CPU tensors by direct exchanges, waited up to this agent's
    # deadline (pgc_hvd.torchdist.direct_sum; a later agent of the name may differ)
    ops.data.sum_timeout = float(timeout)
    if device is not None:
        ops.data.check_gpu(torch.device(device))   # the same point on every rank (kind agrees)
    return ops


class AgentOps:
    """The Horovod-shaped collectives one agent thread calls: the control rows
    (``{name}.ctl``, the runtime's name for them) on the control group, everything else on the
    data group (:class:`~pgc_hvd.runtime.communicator.Collectives` names its collectives
    ``{name}.{kind}``)."""

    ENGINE = "torch.distributed"

    def __init__(self, ctl: GroupOps, data: GroupOps):
        self.ctl, self.data = ctl, data
        self.Sum, self.Average = data.Sum, data.Average
        self.poll, self.synchronize = GroupOps.poll, GroupOps.synchronize
        self.wait_for = GroupOps.wait_for
        self.rank, self.size = data.rank, data.size

    def _on(self, name: Optional[str]) -> GroupOps:
        return self.ctl if name is not None and name.endswith(".ctl") else self.data

    def allgather_async(self, tensor, name=None):
        return self._on(name).allgather_async(tensor, name=name)

    def alltoall_async(self, tensor, splits=None, name=None):
        return self._on(name).alltoall_async(tensor, splits, name=name)

    def allreduce_async_(self, tensor, average=None, name=None, op=None):
        return self._on(name).allreduce_async_(tensor, average, name=name, op=op)

    def broadcast(self, tensor, root_rank, name=None):
        return self._on(name).broadcast(tensor, root_rank, name=name)

    def broadcast_async_(self, tensor, root_rank, name=None):
        """In place (the control log's outcome, ``{name}.dec``: on the data group, in the
        agent's one sequence of data collectives)."""
        return self._on(name).broadcast_async_(tensor, root_rank, name=name)

    def explain_failure(self) -> str:
        return explain()


def explain() -> str:
    """The ranks on this host whose process has exited, as a sentence; "" when none is known."""
    gone = []
    me = _host_id(socket.gethostname())
    for r, (host, pid) in enumerate(W.peers):
        if host == me and pid != os.getpid() and not _alive(pid):
            gone.append(f"rank {r} (pid {pid})")
    if not gone:
        return ""
    return f"{', '.join(gone)} {'has' if len(gone) == 1 else 'have'} died (process exited)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def is_initialized() -> bool:
    return W.train is not None


def shutdown() -> None:
    """Leave the world: the engine's groups are destroyed, and torch's default group when
    :func:`init` created it. Idempotent."""
    with W.lock:
        if W.train is None:
            return
        groups = [W.train.group] + [g.group for a in W.agents.values() for g in (a.ctl, a.data)]
        W.train, W.agents = None, {}
        owns, W.owns_default = W.owns_default, False
    if not dist.is_initialized():
        return
    for g in groups:
        try:
            dist.destroy_process_group(g)
        except Exception:               # noqa: BLE001 -- leaving a broken world
            pass
    if owns:
        try:
            dist.destroy_process_group()
        except Exception:               # noqa: BLE001
            pass


def rank() -> int:
    return _require().rank()


def size() -> int:
    return _require().size()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0 if size() == 1 else rank()))


def local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1 if size() == 1 else size()))


def cross_rank() -> int:
    return int(os.environ.get("GROUP_RANK", 0))


def cross_size() -> int:
    return max(1, size() // max(1, local_size()))
