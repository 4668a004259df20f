"""Elastic pgc_hvd: a rank that dies is a straggler that never returns, and training goes on.

Horovod's elastic mode (``horovodrun --gloo -np N --min-np M --max-np X
--host-discovery-script ...``, :func:`horovod.torch.elastic.run`) re-forms the world after a
rank fails or hosts are added. :class:`ElasticState` is the ``State`` object to hand it: it
owns the pgc_hvd optimizer and the data partitions, and rebuilds both for every new world.

Usage (``launch/elastic_train.py`` and docs/elastic.md are the full recipe)::

    hvd.init()
    state = ElasticState(model, torch.optim.SGD(model.parameters(), lr=0.05),
                         make_optimizer=lambda base: pgc_hvd.DistributedOptimizer(
                             base, named_parameters=model.named_parameters(),
                             scheme="pgc-cr", stragglers=1),
                         make_loader=lambda n: PartitionLoader(X, y, n=n, batch_size=32),
                         events="elastic.jsonl")

    @hvd.elastic.run
    def train(state):
        while state.opt.version < steps:
            for xb, yb in state.batches():
                loss = loss_fn(model(xb), yb)
                loss.backward()
            state.step(loss=loss.item())
        state.close()

    train(state)

What happens when a rank dies (SIGKILL, a lost host): the survivors with an operation pending
on their connection to the dead rank fail at once (gloo sees the reset connection); the first
rank whose collective fails shuts down its sockets of the world (:mod:`pgc_hvd.runtime.
elastic.cascade`: Horovod's own shutdown leaves them open), so every rank blocked on a receive
from it fails at once too and does the same: every survivor leaves within milliseconds, not
after ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (``cascade=False`` turns this off). The survivors'
agents stop with an :class:`~pgc_hvd.runtime.agent.AgentError` whose cause is Horovod's
``HorovodInternalError``; :meth:`ElasticState.step` re-raises it as ``HorovodInternalError``
so that Horovod's elastic loop resets the world (``hvd.shutdown(); hvd.init()``). Then:

1. :meth:`restore` (no collective: the old world is gone) abandons the old optimizer
   (:func:`abandon`): every update the old world decided is applied (a straggler catches up on
   the steps decided without it; all survivors took the same decisions), the agent thread has
   stopped, the gradient hooks are removed. Nothing is rolled back to a commit: the decided
   updates are the same on every rank, so every survivor already holds the same model.
2. :meth:`sync`, in the new world: the ranks allgather ``[version, parameter digest]``. When every
   rank holds the same version and digest nothing moves (the usual case after a death); else (a
   rank that joined, or a survivor whose last data-phase allreduce completed when another's did
   not) the rank with the highest version broadcasts the parameters and the optimizer's state
   (momentum, Adam moments) to all. The torch optimizer state goes into the base optimizer, a
   new :func:`~pgc_hvd.DistributedOptimizer` is built for the new n (``make_optimizer``), started
   at the agreed version with an empty ring (:meth:`start_at`: the ring warms up again), and
   the data is re-partitioned into n parts (``make_loader(n)``).
3. a record of the change (``event: world_change``: step, old n, new n, why, when the last step
   of the old world finished, when the first and the last rank noticed the end of the world
   (``noticed_first_at``, ``noticed_at``), when the new world was ready, when its
   first step finished, ``seconds_lost``) goes to ``events`` (JSON lines, rank 0) and to
   :attr:`ElasticState.changes` on every rank.

A rank that joins (discovery lists a new host, up to ``--max-np``): Horovod tells every worker;
the ranks check for such notices together every ``check_every`` model versions, without a
barrier (:meth:`_check_hosts`), close the optimizer at the same point (:meth:`close` brings them
to one version and checks the parameters agree), and raise ``HostsUpdatedInterrupt``; the new
world syncs as above, the new rank receiving the model by broadcast.

The straggler budget across a change of n: ``make_optimizer`` is called again for every world
and decides s for the new n (``stragglers=``; it sees ``hvd.size()``). The dead rank is not a
straggler of the new world, so it does not use up s: a world of n - 1 ranks again tolerates s
slow ranks each step (a scheme needs n > s; pass e.g. ``min(s, hvd.size() - 1)``). Within one
world, a rank that dies is tolerated only until its peers notice (one collective): gradient
coding cannot step past a dead rank inside a world, because every Horovod collective needs
every rank of the world.

Owns :class:`ElasticState` (this rank's optimizer, loader and world bookkeeping, the world-change
records) and :func:`check_timeouts`. Threads: the training thread (Horovod's elastic loop:
``sync``, ``restore``, ``step``, ...), the agent thread (the agent's ``on_stop``: a broken
world's sockets shut down before the training thread notices).
May import: torch, Horovod (its ``State`` base class and exceptions),
:mod:`pgc_hvd.runtime.agreement` (the world's agreement on version and digest, the joint host
check), :mod:`pgc_hvd.runtime.elastic` (the cache setting),
:mod:`pgc_hvd.runtime.elastic.cascade`, :mod:`pgc_hvd.runtime.elastic.world`,
:mod:`pgc_hvd.runtime.errors`; the optimizer only through ``make_optimizer`` and its public
members.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from typing import Callable, Optional

import torch

from pgc_hvd.runtime.agreement import finish, gather_rows, tensors_digest
from pgc_hvd.runtime.elastic import CACHE_ENV, cache_off
from pgc_hvd.runtime.elastic import cascade as gloo_cascade
from pgc_hvd.runtime.elastic.world import abandon, bcast_object, horovod_bcast, world_error
from pgc_hvd.runtime.errors import AgentError

log = logging.getLogger(__name__)

_REASONS = {0: "start", 1: "rank lost", 2: "hosts updated"}


def _horovod_state_base():
    from horovod.common.elastic import State
    return State


class ElasticState(_horovod_state_base()):
    """Horovod elastic ``State`` that rebuilds the pgc_hvd optimizer and the data partitions
    for every world (module doc).

    Args:
        model: the ``torch.nn.Module`` trained (its parameters are what the ranks agree on).
        optimizer: the user's torch optimizer over ``model``'s parameters; it holds the
            optimizer state between worlds (each world's pgc_hvd optimizer is built from it).
        make_optimizer: ``base -> pgc_hvd.DistributedOptimizer(base, ...)``, called on every rank
            in every world (``hvd.size()`` is the new n; choose s for it here).
        make_loader: ``n -> loader`` (e.g. ``PartitionLoader(X, y, n=n, ...)``), or None.
        events: path of a JSON-lines file rank 0 appends world changes to, or None.
        check_every: model versions between the ranks' joint checks for added hosts.
        timeout: seconds a rank waits for the others' part of one such check.
        hvd: the Horovod module (default ``horovod.torch``).
        cascade: shut down this rank's gloo sockets when its world breaks, so that the others
            leave at once (:mod:`pgc_hvd.runtime.elastic.cascade`; Linux, a no-op elsewhere).
            Import this module before ``hvd.init()`` so that the first world's sockets are
            found (its import marks the sockets that are not Horovod's).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 make_optimizer: Callable, make_loader: Optional[Callable] = None, *,
                 events: Optional[str] = None, check_every: int = 10, timeout: float = 120.0,
                 hvd=None, cascade: bool = True):
        if hvd is None:
            import horovod.torch as hvd
        self.hvd = hvd
        super().__init__(bcast_object=horovod_bcast(hvd), get_rank=hvd.rank)
        if not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be an int >= 1 (model versions), got "
                             f"{check_every!r}")
        self.model, self.base = model, optimizer
        self.make_optimizer, self.make_loader = make_optimizer, make_loader
        self.events, self.check_every, self.timeout = events, check_every, float(timeout)
        self.opt = None
        self._resume_version = -1       # a checkpoint's version this rank starts from (resume_at)
        self.loader = None
        self.worlds = 0                 # worlds this rank has trained in
        self.changes: list[dict] = []   # world-change records (every rank)
        self.step_times: list[tuple[int, float, int]] = []  # (version, time, n) after each step
        self._reason = 0                # why the current world ends (1 lost, 2 hosts updated)
        self._noticed = float("nan")    # when this rank noticed the end of its world
        self._last_step_at = float("nan")
        self._pending: Optional[dict] = None   # change record waiting for its first step
        self._boundary = 0              # last check_every boundary processed
        self._check = None              # (boundary, handle) of the joint host check in flight
        self._host_ts = 0.0             # newest host-update timestamp acted on
        self._sockets = gloo_cascade.SOCKETS if cascade else None   # this world's gloo sockets
        self._world_id = 0              # counts the worlds whose sockets were adopted
        if not cache_off():
            warnings.warn(
                f"pgc_hvd elastic: Horovod's response cache is on ({CACHE_ENV}="
                f"{os.environ.get(CACHE_ENV, 'unset, so 1024')}): when a rank dies in a ring "
                f"allreduce, a survivor can abort in gloo ('op.preamble.length <= op.nbytes') "
                f"where no Python code can catch it, and the job may fall below --min-np "
                f"(docs/elastic.md, 'Killing rank 0'). Set {CACHE_ENV}=0 for every rank "
                f"(horovodrun --cache-capacity 0), or call pgc_hvd.runtime.elastic."
                f"response_cache_off() before hvd.init(), which sets it when it is not set",
                RuntimeWarning, stacklevel=2)

    # -- Horovod State interface -------------------------------------------------------
    def save(self) -> None:
        """Nothing to copy: the decided updates are the same on every rank, so a re-formed
        world continues from the model the survivors hold (no rollback to a commit)."""

    def restore(self) -> None:
        """After ``HorovodInternalError`` (the world broke): abandon the old optimizer, no
        collective."""
        if self._reason == 0:
            self._reason = 1
        if self._noticed != self._noticed:
            self._noticed = time.time()
        self._leave_world(broken=True)
        self._check = None
        if self.opt is not None:
            abandon(self.opt)
            self._last_step_at = (self.step_times[-1][1] if self.step_times
                                  else self._last_step_at)
            # the optimizer's torch state moves to the base optimizer before the next world
            self.base.load_state_dict(torch.optim.Optimizer.state_dict(self.opt))

    def sync(self) -> None:
        """In a new world (also the first): agree on the model, build the optimizer for n."""
        hvd = self.hvd
        n, rank = hvd.size(), hvd.rank()
        t_ready0 = time.time()
        self._adopt_world(n, rank)
        params = [p for p in self.model.parameters()]
        old_n = self.opt.n if self.opt is not None else 0
        version = int(self.opt.version) if self.opt is not None else self._resume_version
        digest = tensors_digest(params) if self.opt is not None or version >= 0 else 0
        # blocking (timeout=None): a rank lost now reaches the others as Horovod's error
        ints = gather_rows(hvd, [version, digest, old_n, self._reason], name="pgc.elastic.sync.i",
                           timeout=None)
        times = gather_rows(hvd, [self._last_step_at, self._noticed, self._host_ts],
                            name="pgc.elastic.sync.t", timeout=None, dtype=torch.float64)
        # the newest host update acted on, the same on every rank (a rank that joined was told
        # of none): the joint host checks compare against it
        self._host_ts = max(t[2] for t in times)
        versions = [r[0] for r in ints]
        V = max(max(versions), 0)
        # the most advanced rank; among equals one of the last world (old_n > 0) before a rank
        # that only read a checkpoint (a joiner on a shared folder), then the lowest rank
        root = max(range(len(ints)), key=lambda i: (ints[i][0], ints[i][2] > 0, -i))
        # a rank without a model (the first world, a rank that joined) or one that differs from
        # the most advanced rank gets the parameters and optimizer state by broadcast
        moved = any(r[0] < 0 or r[0] != ints[root][0] or r[1] != ints[root][1] for r in ints)
        if moved:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=root)
            state = bcast_object(hvd, _cpu(self.base.state_dict()) if rank == root else None,
                                 root_rank=root, name="pgc.elastic.sync.opt")
            self.base.load_state_dict(state)
        try:
            self.opt = self.make_optimizer(self.base)
        except AgentError as err:   # the new world broke during the construction check
            self._world_broke(err)
            raise
        agent = getattr(self.opt, "agent", None)
        if agent is not None:
            # a lost rank re-forms the world: no census of who is gone (control='log')
            agent.census = False
        if self._sockets is not None and agent is not None:   # leave at once, from the agent
            world = self._world_id
            agent.on_stop = lambda err: self._agent_stopped(err, world)
        check_timeouts(self.opt)
        if getattr(self.opt, "n", n) != n:
            raise ValueError(f"make_optimizer built an optimizer for n={self.opt.n} in a world of "
                             f"{n} ranks")
        self.opt.start_at(V)
        self.loader = self.make_loader(n) if self.make_loader is not None else None
        self._boundary = V // self.check_every
        self._check = None
        prev_n = max(r[2] for r in ints)
        if prev_n > 0:  # a re-formed world: record the change when its first step is done
            survivors = sum(1 for r in ints if r[2] > 0)   # in the last world (a joiner that
            #                                           read a checkpoint is still a joiner)
            last = [t[0] for t in times if t[0] == t[0]]
            noticed = [t[1] for t in times if t[1] == t[1]]
            self._pending = {
                "event": "world_change", "step": V, "old_n": prev_n, "new_n": n,
                "survivors": survivors, "joined": n - survivors,
                "reason": _REASONS[max(r[3] for r in ints)],
                "parameters_broadcast": bool(moved), "root": root,
                "last_step_at": max(last) if last else None,
                "noticed_at": max(noticed) if noticed else None,
                "noticed_first_at": min(noticed) if noticed else None,
                "sync_started_at": t_ready0, "ready_at": time.time()}
        self.worlds += 1
        self._reason, self._noticed = 0, float("nan")

    def resume_at(self, version: int) -> None:
        """Before the first world: this rank's model and ``optimizer`` hold a checkpoint of
        ``version`` (:class:`~pgc_hvd.runtime.elastic.checkpoints.ElasticCheckpoints`), so the
        first ``sync()`` counts it as a rank that holds that version (the most advanced rank's
        model and optimizer state are broadcast to the others) and starts there."""
        if self.opt is not None:
            raise RuntimeError("resume_at must be called before the first world's sync()")
        self._resume_version = int(version)

    def reset(self) -> None:
        """Called by Horovod after the world re-formed, before :meth:`sync`; nothing to do."""

    # -- training loop ---------------------------------------------------------------
    def batches(self):
        """``self.opt.batches(self.loader)``, a failure of the world raised as
        ``HorovodInternalError`` (the first call compares the loaders across ranks)."""
        try:
            yield from self.opt.batches(self.loader)
        except AgentError as err:
            self._world_broke(err)
            raise

    def step(self, loss=None):
        """``self.opt.step(loss=loss)``; a failure of the world is raised as Horovod's
        ``HorovodInternalError`` (elastic mode then re-forms it); checks for added hosts every
        ``check_every`` versions."""
        try:
            ret = self.opt.step(loss=loss)
        except AgentError as err:
            self._world_broke(err)
            raise
        now = time.time()
        self._last_step_at = now
        self.step_times.append((int(self.opt.version), now, int(self.opt.n)))
        if self._pending is not None:
            rec, self._pending = self._pending, None
            rec["first_step_at"] = now
            rec["first_step_version"] = int(self.opt.version)
            t0 = rec["last_step_at"] if rec["last_step_at"] is not None else rec["noticed_at"]
            rec["seconds_lost"] = None if t0 is None else now - t0
            self.changes.append(rec)
            self._write(rec)
        self._check_hosts()
        return ret

    def close(self) -> None:
        """End of training: ``self.opt.close()`` (every rank at one version, parameters
        compared), a failure of the world raised as ``HorovodInternalError``."""
        try:
            self.opt.close()
        except AgentError as err:
            self._world_broke(err)
            raise
        if self._pending is not None:   # the world ended before its first step
            rec, self._pending = self._pending, None
            rec.update(first_step_at=None, first_step_version=None, seconds_lost=None)
            self.changes.append(rec)
            self._write(rec)

    # -- internals ---------------------------------------------------------------------
    def _agent_stopped(self, err: BaseException, world: int) -> None:
        """The agent thread of world ``world`` stopped with ``err``: a broken world is left at
        once (the others are told by the shut-down sockets), before the training thread
        notices. An agent of an older world (one that outlived its world) leaves nothing."""
        if world == self._world_id and world_error(err):
            self._leave_world(broken=True)

    def _adopt_world(self, n: int, rank: int) -> None:
        """A new world started: its gloo sockets are those its ``hvd.init()`` opened. Finding
        none in a world of several ranks means they were opened before this module's import
        marked the process's sockets: said, with the fix, as the cascade cannot work then."""
        self._world_id += 1
        if self._sockets is None:
            return
        found = self._sockets.adopt(exclude=gloo_cascade.rendezvous_endpoints())
        if found == 0 and n > 1 and self._sockets.available:
            log.warning("pgc_hvd elastic: rank %d found none of this world's gloo sockets (was "
                        "pgc_hvd.runtime.elastic imported after hvd.init()?): a rank's death "
                        "will cost HOROVOD_GLOO_TIMEOUT_SECONDS in this world; import it "
                        "before hvd.init()", rank)

    def _leave_world(self, broken: bool) -> None:
        """The world ends: shut down its gloo sockets when it broke (module doc), and mark
        every socket held now, so that the next world's ``hvd.init()`` tells its own apart."""
        if self._sockets is None:
            return
        if broken:
            self._sockets.cascade()
        self._sockets.mark()

    def _world_broke(self, err: AgentError) -> None:
        if world_error(err):
            from horovod.common.exceptions import HorovodInternalError
            self._reason = max(self._reason, 1)
            self._noticed = time.time()
            self._leave_world(broken=True)
            log.warning("pgc_hvd elastic: rank %d at version %d: the world broke (%s); "
                        "re-forming", self.hvd.rank(), self.opt.version, err)
            raise HorovodInternalError(str(err)) from err

    def _check_hosts(self) -> None:
        """Joint check for added/removed hosts, without a barrier: at each ``check_every``
        boundary a rank starts an async max-allreduce of the newest host-update timestamp it
        was told of, and waits for the previous boundary's (every rank has started that one:
        all steps before this boundary are decided, so a slower rank only applies them). A
        newer timestamp than the one acted on makes every rank, at the same boundary, close
        its optimizer and raise ``HostsUpdatedInterrupt``."""
        hvd = self.hvd
        b = int(self.opt.version) // self.check_every
        while self._boundary < b:
            self._boundary += 1
            if self._check is not None:
                got = finish(hvd, self._check[1], self.timeout, (
                    f"rank {hvd.rank()}: the joint check for added hosts at version "
                    f"{self._check[0] * self.check_every} got no answer within "
                    f"{self.timeout:.0f}s: a rank hung, or left its training loop on "
                    f"another count of updates than the others (loop on `while "
                    f"state.opt.version < steps` on every rank)")).tolist()
                self._check = None
                if got[0] > self._host_ts:
                    self._host_ts = got[0]
                    self._reason = 2
                    self._noticed = time.time()
                    self.close()
                    self._last_step_at = (self.step_times[-1][1] if self.step_times else
                                          self._last_step_at)
                    self.base.load_state_dict(torch.optim.Optimizer.state_dict(self.opt))
                    self._leave_world(broken=False)   # an orderly end: only the mark
                    from horovod.common.exceptions import HostsUpdatedInterrupt
                    raise HostsUpdatedInterrupt(False)
            ts = self._host_ts
            while not self._host_messages.empty():
                stamp, _ = self._host_messages.get()
                ts = max(ts, float(stamp))
            t = torch.tensor([ts], dtype=torch.float64)
            self._check = (self._boundary, hvd.allreduce_async(
                t, op=hvd.Max, name=f"pgc.elastic.hosts.{self._boundary}"))

    def _write(self, rec: dict) -> None:
        if self.events is None or self.hvd.rank() != 0:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.events)), exist_ok=True)
        with open(self.events, "a") as f:
            f.write(json.dumps(rec) + "\n")


def check_timeouts(opt) -> None:
    """The optimizer's ``timeout`` must exceed gloo's: a dead rank must reach the survivors as
    Horovod's error (the world re-forms), not as pgc_hvd's timeout first (which ends the
    survivor's process, and Horovod then drops its host too)."""
    config = getattr(opt, "config", None)   # DistributedOptimizer.config (RuntimeConfig)
    control = getattr(config, "control", "log")
    if control == "store":
        raise ValueError(
            "pgc_hvd elastic: control='store' polls rows through a store served by rank 0 and "
            "is not built for elastic worlds; use the default control='log' (its lost store "
            "re-forms the world like a failed collective) or 'allgather' in make_optimizer")
    gloo = float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "30"))
    mine = getattr(config, "timeout", None)
    if mine is not None and mine <= gloo:
        raise ValueError(
            f"pgc_hvd elastic: the optimizer's timeout ({mine:g} s) must be longer than "
            f"HOROVOD_GLOO_TIMEOUT_SECONDS ({gloo:g} s), so that a dead rank reaches the others "
            f"as Horovod's HorovodInternalError (the world re-forms) and not as pgc_hvd's "
            f"timeout (which stops the run): pass DistributedOptimizer(..., timeout={gloo * 2:g}) "
            f"in make_optimizer, or lower HOROVOD_GLOO_TIMEOUT_SECONDS")


def _cpu(obj):
    """A state dict with its tensors on the CPU (for :func:`bcast_object`)."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj
