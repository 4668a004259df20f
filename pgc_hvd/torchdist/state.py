"""Horovod's state broadcasts on the torch engine's training group: ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``.

Tensors are broadcast as one flat buffer per (dtype, device) (a handful of collectives for a
whole model instead of one per tensor) and copied back in place, so a model's ``state_dict()``
(whose tensors share storage with the parameters and buffers) is updated as with Horovod.

``broadcast_optimizer_state(opt, root)`` follows Horovod's: an optimizer without state first
gets zero gradients and one ``opt.step()`` to create it (a pgc_hvd optimizer recognises this
call, as it recognises Horovod's: the user's rule on zero gradients, nothing sent, the
parameters kept; :mod:`pgc_hvd.runtime.interop`), then every state tensor and every scalar
option of the param groups (the learning rate, ``pgc_version``: the model version travels this
way) is rank ``root``'s. Unlike Horovod's, the options are broadcast also when the optimizer
has no state (plain SGD), so the version always travels.

May import: the standard library, torch and ``torchdist.ops``.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any

import torch

from pgc_hvd.torchdist.ops import GroupOps


def _named(params) -> list:
    if isinstance(params, dict):
        return sorted(params.items())
    if isinstance(params, torch.nn.Module):
        return sorted(params.state_dict().items())
    out = list(params)
    if out and not isinstance(out[0], tuple):
        out = [(str(i), p) for i, p in enumerate(out)]
    return out


def broadcast_tensors_(ops: GroupOps, tensors: list, root_rank: int, name: str) -> None:
    """Every tensor of ``tensors`` becomes rank ``root_rank``'s, in place (one flat broadcast
    per dtype and device; the list must hold the same shapes on every rank)."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for k, ((dtype, device), ts) in enumerate(groups.items()):
        flat = torch.cat([t.detach().reshape(-1) for t in ts]) if ts else torch.empty(0)
        ops.broadcast_(flat, root_rank, name=f"{name}.{k}")
        off = 0
        with torch.no_grad():
            for t in ts:
                t.copy_(flat[off: off + t.numel()].view_as(t))
                off += t.numel()


def broadcast_parameters(ops: GroupOps, params, root_rank: int = 0) -> None:
    """Horovod's ``broadcast_parameters``: ``params`` is a ``state_dict()``, a list of
    ``(name, tensor)`` (``model.named_parameters()``) or of tensors; each becomes rank
    ``root_rank``'s, in place."""
    named = _named(params)
    broadcast_tensors_(ops, [t for _, t in named if torch.is_tensor(t)], root_rank,
                       "pgc.torch.broadcast_parameters")


def broadcast_object(ops: GroupOps, obj: Any, root_rank: int = 0,
                     name: str = "pgc.torch.object") -> Any:
    """Rank ``root_rank``'s picklable ``obj`` on every rank (its size, then its bytes).

    Like Horovod's ``broadcast_object`` it unpickles what the root sent, so the receivers run
    whatever code those bytes name: only for objects among the job's own ranks, on a network
    where nobody else can reach the process group's ports (pgc_hvd itself never calls it; its
    elastic state uses :func:`pgc_hvd.runtime.elastic.bcast_object`, tensors and plain types
    only)."""
    raw = pickle.dumps(obj) if ops.rank() == root_rank else b""
    size = ops.broadcast(torch.tensor([len(raw)], dtype=torch.int64), root_rank,
                         name=f"{name}.size")
    buf = torch.zeros(int(size.item()), dtype=torch.uint8)
    if ops.rank() == root_rank:
        buf.copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    buf = ops.broadcast(buf, root_rank, name=f"{name}.data")
    return obj if ops.rank() == root_rank else pickle.loads(buf.numpy().tobytes())


def _numbers(value):
    """The option ``value`` as a list of floats and a function back, or None (not numeric)."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        kind = type(value)
        return [float(value)], (lambda xs: kind(xs[0]) if kind is not bool else bool(xs[0]))
    if isinstance(value, (tuple, list)) and value and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        kinds, seq = [type(v) for v in value], type(value)
        return [float(v) for v in value], (lambda xs: seq(k(x) for k, x in zip(kinds, xs)))
    return None


def broadcast_optimizer_state(ops: GroupOps, optimizer, root_rank: int = 0) -> None:
    """Horovod's ``broadcast_optimizer_state`` (module doc)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = optimizer.state_dict()
    if len(state["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        optimizer.step()        # a pgc_hvd optimizer recognises this caller (module doc)
        state = optimizer.state_dict()
    # scalar options of every param group, then every state entry, in the groups' order
    scalars, setters, tensors = [], [], []

    def add(value, put) -> None:
        """``value``'s numbers go to ``scalars``; ``put`` gets them back, converted."""
        conv = _numbers(value)
        if conv is None:
            return
        xs, back = conv
        at = len(scalars)
        scalars.extend(xs)
        setters.append(lambda got, a=at, m=len(xs), b=back: put(b(got[a:a + m])))

    for index, group in enumerate(state["param_groups"]):
        for key in sorted(k for k in group if k != "params"):
            add(group[key], lambda v, i=index, k=key: optimizer.param_groups[i].__setitem__(k, v))
        for pid in group["params"]:
            for key, value in sorted(state["state"].get(pid, {}).items()):
                if torch.is_tensor(value):
                    tensors.append(value)
                else:
                    add(value, lambda v, p=pid, k=key: _set_state(optimizer, p, k, v))
    got = ops.broadcast(torch.tensor(scalars, dtype=torch.float64), root_rank,
                        name="pgc.torch.optimizer.options").tolist()
    broadcast_tensors_(ops, tensors, root_rank, "pgc.torch.optimizer.state")
    for put in setters:
        put(got)


def _set_state(optimizer, pid: int, key: str, value) -> None:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optimizer.state[params[pid]][key] = value
