"""The optimizer's state-dict parts: what a resume needs besides torch's optimizer state.

Owns the layout of the ``"pgc"`` part of ``state_dict()`` / of ``pgc_state_dict()`` (version,
scheme, n, s, rank, ring buffers, slot versions, error-feedback residual, busy seconds,
staleness bound, RNG states, delay-trace position), its restore into the parts that hold it
(:class:`~pgc_hvd.runtime.capture.GradientCapture`, the message encoder), and torch's
``load_state_dict`` done so that the param-group dicts a scheduler holds stay the optimizer's.
The checks of a saved state are :mod:`pgc_hvd.runtime.checkpoint`'s.

:class:`StateDicts`: the facade's state-dict methods (``state_dict``, ``load_state_dict``,
``pgc_state_dict``, ``load_pgc_state_dict``, ``load_torch_state_dict``), a base class of
:class:`~pgc_hvd.runtime.optimizer.PGCOptimizer` (here since issue 46: off the step's path).

Thread: the training thread (the user's ``state_dict()`` / ``load_state_dict()``, checkpoints).
May import: numpy, torch, ``runtime.interop``, ``runtime.plain`` and ``runtime.checkpoint``'s
checks. The optimizer itself is used through its public members only.
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np
import torch

from pgc_hvd.runtime import interop
from pgc_hvd.runtime.plain import plain_rng_state


def rng_state() -> dict:
    """This process's RNG states as tensors and plain types (:func:`plain_rng_state`)."""
    return plain_rng_state({
        "torch": torch.get_rng_state(), "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None})


def set_rng_state(rng: dict) -> None:
    """Restore :func:`rng_state`'s dict (or, in memory, the tuples of ``np.random.get_state()``
    and ``random.getstate()`` that earlier versions stored)."""
    torch.set_rng_state(rng["torch"])
    npr, pyr = rng["numpy"], rng["python"]
    if isinstance(npr, dict):
        npr = (npr["kind"], npr["key"].numpy().astype(np.uint32), int(npr["pos"]),
               int(npr["has_gauss"]), float(npr["cached_gaussian"]))
    if isinstance(pyr, dict):
        pyr = (int(pyr["version"]), tuple(int(v) for v in pyr["state"].tolist()),
               pyr["gauss_next"])
    np.random.set_state(npr)
    random.setstate(pyr)
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def pgc_part(version: int, scheme, rank: int, capture, encoder, busy: float,
             staleness_bound: Optional[int], *, copy: bool = True) -> dict:
    """This rank's ``"pgc"`` part (tensors cloned with ``copy``, referenced without)."""
    keep = (lambda b: b.clone()) if copy else (lambda b: b)
    residual = encoder.residual
    return {
        "version": int(version),
        "scheme": scheme.name, "n": scheme.n, "s": scheme.s, "rank": int(rank),
        "ring": [keep(b) for b in capture.ring],
        "slot_versions": list(capture.worker_ring.versions),
        "residual": None if residual is None else keep(residual),
        "busy": busy,
        "staleness_bound": staleness_bound,
        "rng": rng_state(),
        "trace_position": {"worker": int(rank), "step": int(version)},
    }


def restore_pgc_part(state: dict, capture, encoder) -> None:
    """Ring buffers, slot versions, residual and RNG states of a checked ``"pgc"`` part."""
    for b, saved in zip(capture.ring, state["ring"]):
        b.copy_(saved)
    capture.worker_ring.restore(state["slot_versions"])
    if state.get("residual") is not None and encoder.residual is not None:
        encoder.residual.copy_(state["residual"])
    set_rng_state(state["rng"])


def load_pgc_state(opt, state: dict, source: str, *, capture, encoder, step,
                   staleness) -> None:
    """``opt.load_pgc_state_dict(state, source)`` before the first step, all or nothing: the
    state is checked first against ``opt.pgc_state_dict()`` (:func:`~pgc_hvd.runtime.checkpoint.
    check_pgc_state`, CheckpointError naming ``source``), then the torch part, the version,
    the ring and residual, busy seconds and the staleness bound are restored (the agent and
    the plan restart from the version: the facade's)."""
    from pgc_hvd.runtime.checkpoint import check_pgc_state
    check_pgc_state(state, opt.pgc_state_dict(), source)
    opt.load_torch_state_dict(state["optimizer"])
    opt.version = int(state["version"])
    restore_pgc_part(state, capture, encoder)
    step.busy = float(state.get("busy", 0.0))
    # "c_bound": the key's name in states saved before it was "staleness_bound"
    staleness.restore_staleness_bound(state.get("staleness_bound", state.get("c_bound")))


def load_torch_state(optimizer, sd: dict, load) -> None:
    """torch's ``load_state_dict`` (``load(sd)``, the wrapped class's method), keeping the
    param-group dicts the user's optimizer shares with this one (torch replaces them; a
    scheduler built before the wrap holds them)."""
    shared = optimizer.param_groups
    load(sd)
    for mine, loaded in zip(shared, optimizer.param_groups):
        params = mine["params"]
        mine.clear()
        mine.update(loaded)
        mine["params"] = params
    optimizer.param_groups = shared


def load_state_dict(opt, state_dict: dict) -> None:
    """``opt.load_state_dict(state_dict)`` (see its docstring), through ``opt``'s public
    members: the torch part, then this rank's own ``"pgc"`` part in full
    (``opt.load_pgc_state_dict``), or only the version (``opt.start_at``) for a state of
    another rank of the same run, or of another s under ``stragglers="auto"`` (the rule starts
    again from its first s, with an empty ring, as at the first steps); another world size or
    scheme, or another s with a fixed one, is refused."""
    from pgc_hvd.runtime.checkpoint import CheckpointError, another_s_under_auto, check_same_run

    sd = dict(state_dict)
    groups = [dict(g) for g in sd.get("param_groups", [])]
    version = interop.pop_version(groups)
    sd["param_groups"] = groups
    extra = sd.pop("pgc", None)
    if (extra is not None or version is not None) and opt.started:
        raise RuntimeError("pgc_hvd: load_state_dict() of a pgc_hvd state must come before "
                           "the first step()")
    other_s = another_s_under_auto(opt, extra)     # False without a "pgc" dict
    if extra is not None:
        if not isinstance(extra, dict):
            raise CheckpointError(f"the state dict's 'pgc' entry is {type(extra).__name__}, "
                                  f"not the dict state_dict() writes")
        check_same_run(extra, {"scheme": opt.scheme.name, "n": opt.n, "s": opt.scheme.s},
                       "the optimizer state",
                       keys=("scheme", "n") if other_s else ("scheme", "n", "s"))
    if extra is not None and extra.get("rank") == opt.rank and not other_s:
        opt.load_pgc_state_dict({"optimizer": sd, **extra}, "the state dict")
        return
    opt.load_torch_state_dict(sd)
    if extra is not None and version is None:
        version = extra.get("version")
    if version is not None:
        opt.start_at(int(round(float(version))))


class StateDicts(torch.optim.Optimizer):
    """The facade's state-dict methods (the torch / Horovod way of saving and resuming), kept
    apart from :class:`~pgc_hvd.runtime.optimizer.PGCOptimizer`'s step API, on its public
    members (``current_step``, ``encoder``, ``agent``, ...); the dynamic subclass of the user's
    optimizer class gets both (:func:`~pgc_hvd.runtime.optimizer.facade_methods`)."""

    def _pgc_part(self, copy: bool = True) -> dict:
        """This rank's ``"pgc"`` part (:func:`pgc_part`), the version broadcast by
        ``hvd.broadcast_optimizer_state`` adopted first."""
        step = self.current_step
        step.adopt()
        return pgc_part(self.version, self.scheme, self.rank, step.capture, self.encoder,
                        step.busy, self.staleness_bound, copy=copy)

    def state_dict(self) -> dict:
        """torch's optimizer state plus what a resume needs: ``param_groups[0]["pgc_version"]``
        (the model version; a scalar option, so ``hvd.broadcast_optimizer_state`` carries rank
        0's to every rank) and ``"pgc"``: this rank's :meth:`pgc_state_dict` without the torch
        part (scheme, n, s, rank, ring, slot versions, error-feedback residual, RNG states).
        Tensors are referenced, not copied, as torch's own state_dict does."""
        part = self._pgc_part(copy=False)
        sd = super(self.__class__, self).state_dict()
        sd["param_groups"][0][interop.VERSION_KEY] = self.version
        sd["pgc"] = part
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a :meth:`state_dict` (or a plain torch one) before the first step: all of it
        from this rank's own state, the torch state and the version (empty ring) from another
        rank's of the same run; another world size or scheme raises CheckpointError
        (:func:`load_state_dict`)."""
        load_state_dict(self, state_dict)

    def load_torch_state_dict(self, sd: dict) -> None:
        """torch's ``load_state_dict`` of the wrapped class, keeping the param-group dicts the
        user's optimizer shares with this one (:func:`load_torch_state`)."""
        load_torch_state(self, sd, super(self.__class__, self).load_state_dict)

    def pgc_state_dict(self) -> dict:
        """Optimizer state, ring buffers, step, RNG states and delay-trace position."""
        part = self._pgc_part()
        return {"optimizer": super(self.__class__, self).state_dict(), **part}

    def load_pgc_state_dict(self, state: dict, source: str = "the state dict") -> None:
        """Restore a :meth:`pgc_state_dict` of this rank before the first step, all or nothing
        (checked first: :func:`~pgc_hvd.runtime.checkpoint.check_pgc_state`, CheckpointError
        naming ``source``). This rank only: :func:`~pgc_hvd.runtime.load_checkpoint` also makes
        the ranks agree on the step."""
        step, agent = self.current_step, self.agent
        if step.started:
            raise RuntimeError("load_pgc_state_dict must be called before the first step()")
        load_pgc_state(self, state, source, capture=step.capture, encoder=self.encoder,
                       step=step, staleness=agent)
        agent.restart_at(self.version)
        step.next()
