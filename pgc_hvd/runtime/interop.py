"""Horovod interop: what ``hvd.broadcast_optimizer_state`` does to a pgc_hvd optimizer.

Owns the two conventions by which Horovod's functions meet this optimizer:

* ``hvd.broadcast_optimizer_state(opt, root)`` on an optimizer without state sets every
  ``p.grad`` to zeros and calls ``opt.step()`` to create the state; that call is recognised
  (:func:`called_by_broadcast_state`, by the caller's code object) and must send nothing;
* the model version travels as the scalar option ``param_groups[0]["pgc_version"]``
  (:data:`VERSION_KEY`), which the broadcast carries from rank 0 to every rank.
  :func:`broadcast_version` reads it without changing anything (a property may use it);
  :func:`take_broadcast_version` removes it, for the facade to adopt at a point of its own.

Thread: the training thread (the facade's ``step()``, its properties, the state dict); no state.
May import: the standard library and torch (horovod lazily); nothing of the package.
"""

from __future__ import annotations

import sys
from typing import Optional

VERSION_KEY = "pgc_version"   # rank 0's version in param_groups[0] of state_dict()


def _is_horovod_broadcast_state(code) -> bool:
    """Whether ``code`` is horovod.torch's ``broadcast_optimizer_state`` (or the torch
    engine's, :mod:`pgc_hvd.torchdist.state`, looked up without importing it)."""
    torch_engine = sys.modules.get("pgc_hvd.torchdist.state")
    fn = getattr(torch_engine, "broadcast_optimizer_state", None)
    if fn is not None and code is fn.__code__:
        return True
    try:
        from horovod.torch import functions
    except ImportError:
        return False
    fn = getattr(functions, "broadcast_optimizer_state", None)
    return fn is not None and code is fn.__code__


def called_by_broadcast_state(depth: int = 2, hops: int = 4) -> bool:
    """Whether the caller ``depth`` frames up was reached from Horovod's
    ``broadcast_optimizer_state`` within ``hops`` frames (through torch's step wrappers)."""
    frame = sys._getframe(depth)
    for _ in range(hops):
        if frame is None:
            return False
        if _is_horovod_broadcast_state(frame.f_code):
            return True
        frame = frame.f_back
    return False


def init_state_step(params, step) -> None:
    """``hvd.broadcast_optimizer_state(opt, root)`` on an optimizer without state first sets
    every ``p.grad`` to zeros and calls ``opt.step()`` to create the state (Adam's moments,
    momentum buffers); for its own DistributedOptimizer it calls the wrapped class's step.
    That call (recognised by :func:`called_by_broadcast_state`) runs the user's optimizer rule
    ``step()`` on the zero gradients, as Horovod's does (the same on every rank), and sends
    nothing. The zero-gradient step must not move the parameters (weight decay would, on the
    ranks that had no state, e.g. all but rank 0 on a resume): they are put back."""
    import torch

    keep = [p.detach().clone() for p in params]
    step()
    with torch.no_grad():
        for p, k in zip(params, keep):
            p.copy_(k)
            p.grad = None


def broadcast_version(param_groups) -> Optional[int]:
    """The version a broadcast state brought (None when none did); reads only."""
    g0 = param_groups[0] if param_groups else {}
    if VERSION_KEY not in g0:
        return None
    return int(round(float(g0[VERSION_KEY])))


def take_broadcast_version(param_groups) -> Optional[int]:
    """:func:`broadcast_version`, and the option removed."""
    v = broadcast_version(param_groups)
    if v is not None:
        param_groups[0].pop(VERSION_KEY)
    return v


def pop_version(groups: list) -> Optional[float]:
    """The version option of a state dict's (copied) param groups, removed; None if absent."""
    return groups[0].pop(VERSION_KEY, None) if groups else None
