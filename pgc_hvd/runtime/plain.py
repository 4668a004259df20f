"""Tensors and plain types: what pgc_hvd writes to disk or sends between ranks as an object.

An object read back with ``pickle.loads`` or ``torch.load(weights_only=False)`` can run any code
its writer chose (a ``__reduce__`` returning ``os.system``). pgc_hvd never reads objects that
way: checkpoints (:mod:`pgc_hvd.runtime.checkpoint`) and the objects the elastic ranks broadcast
(:func:`pgc_hvd.runtime.elastic.bcast_object`) are torch's serialization format holding only

* containers: ``dict`` / ``collections.OrderedDict``, ``list``, ``tuple``, ``set``;
* scalars: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
  ``bytearray``;
* torch: ``torch.Tensor`` and ``torch.nn.Parameter`` (not other tensor subclasses),
  ``torch.Size``, ``torch.dtype``, ``torch.device``;

and they are read with ``torch.load(weights_only=True)``, whose unpickler builds those types
and refuses every other global (the default of ``torch.load`` since torch 2.6).
:func:`check_plain` refuses anything else before it is written or sent, naming where it sits
and how to convert it (``float(x)`` for a numpy scalar, ``torch.from_numpy`` for an array, ...).

Owns the allow-list of what pgc_hvd writes or sends as an object (:data:`CONTAINERS`,
:data:`SCALARS`, :data:`TORCH`) and its check (:func:`check_plain`, ``dumps``, ``loads``); no
state. Thread: the caller's (the training thread: checkpoints, the elastic broadcasts).
May import: numpy, torch and the standard library; nothing of the package.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

SCALARS = (type(None), bool, int, float, complex, str, bytes, bytearray)
TORCH = (torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype, torch.device)
CONTAINERS = (dict, OrderedDict, list, tuple, set)
ALLOWED = ("tensors and plain types (dict, list, tuple, set, None, bool, int, float, complex, "
           "str, bytes; torch.Tensor, torch.Size, torch.dtype, torch.device)")


class NotPlain(TypeError):
    """An object holds something other than tensors and plain types (the message names where)."""


def _hint(x) -> str:
    mod = type(x).__module__
    if mod == "numpy":
        return ("; convert numpy values first: float(x) / int(x) / x.item() for a scalar, "
                "torch.from_numpy(a) for an array")
    if callable(x):
        return "; a function or class cannot be stored: store its name and look it up on loading"
    if isinstance(x, (int, float, str)):   # an enum or another subclass of a plain type
        base = next(t for t in (bool, int, float, str) if isinstance(x, t))
        return f"; convert it with {base.__name__}(x)"
    return "; store its data as tensors and plain types (e.g. its state_dict() or vars())"


def check_plain(obj: Any, what: str = "the object") -> None:
    """Return when ``obj`` holds only tensors and plain types (module doc); else raise
    :class:`NotPlain` naming the first offending entry by its path in ``obj``
    (``what['extra']['best']``), its type and a conversion."""
    stack = [(obj, what)]
    seen = set()
    while stack:
        x, path = stack.pop()
        t = type(x)
        if t in SCALARS or t in TORCH:
            continue
        if t not in CONTAINERS:
            raise NotPlain(f"{path} is a {t.__module__}.{t.__qualname__}: only {ALLOWED} are "
                           f"stored or sent, so that reading them runs no code{_hint(x)}")
        if id(x) in seen:
            continue
        seen.add(id(x))
        if t in (dict, OrderedDict):
            for k, v in x.items():
                stack.append((k, f"{path} key {k!r}"))
                stack.append((v, f"{path}[{k!r}]"))
        else:
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(x))


def dumps(obj: Any, what: str = "the object") -> bytes:
    """``obj`` (checked by :func:`check_plain`) in torch's serialization format."""
    check_plain(obj, what)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loads(raw: bytes, source: str = "the bytes received") -> Any:
    """What :func:`dumps` wrote, read with ``torch.load(weights_only=True)`` onto the CPU: no
    code in ``raw`` runs; anything but tensors and plain types raises ``pickle.UnpicklingError``
    (torch's message names the global it refused)."""
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def unsafe_globals(file) -> list:
    """The globals in torch file ``file`` that ``weights_only=True`` refuses (read from the
    pickle's opcodes; nothing is built or run)."""
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(file))


def plain_rng_state(rng: dict) -> dict:
    """RNG states as tensors and plain types (a checkpoint is read with
    ``torch.load(weights_only=True)``, :mod:`pgc_hvd.runtime.plain`): torch's (and CUDA's) byte
    tensors as they are; numpy's ``get_state()`` tuple as ``{"kind", "key" (int64 tensor of
    624), "pos", "has_gauss", "cached_gaussian"}``; Python's ``random.getstate()`` tuple as
    ``{"version", "state" (int64 tensor of 625), "gauss_next"}``. Entries already in that form
    are kept."""
    out = dict(rng)
    if isinstance(rng["numpy"], tuple):
        kind, key, pos, has_gauss, cached = rng["numpy"]
        out["numpy"] = {"kind": str(kind), "key": torch.from_numpy(np.asarray(key, np.int64)),
                        "pos": int(pos), "has_gauss": int(has_gauss),
                        "cached_gaussian": float(cached)}
    if isinstance(rng["python"], tuple):
        version, internal, gauss_next = rng["python"]
        out["python"] = {"version": int(version),
                         "state": torch.tensor(internal, dtype=torch.int64),
                         "gauss_next": None if gauss_next is None else float(gauss_next)}
    return out
