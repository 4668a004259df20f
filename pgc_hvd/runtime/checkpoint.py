"""Checkpoints of a rank: model, optimizer, ring buffers, step, RNG states, trace position.

Every rank saves its own file (``{path}.rank{r}``: ring buffers and RNG states differ per rank).
Save when every rank has applied the same updates (e.g. after ``optimizer.close()``, or after
``optimizer.synchronize()`` at a step every rank reached) and restore before the first step.
"""

from __future__ import annotations

import os

import torch


def _path(path, rank: int) -> str:
    return f"{os.fspath(path)}.rank{rank}"


def save_checkpoint(path, model: torch.nn.Module, optimizer, extra: dict | None = None) -> str:
    out = _path(path, optimizer.rank)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    state = {"model": model.state_dict(), "pgc": optimizer.pgc_state_dict(), "extra": extra or {}}
    tmp = out + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, out)
    return out


def load_checkpoint(path, model: torch.nn.Module, optimizer) -> dict:
    state = torch.load(_path(path, optimizer.rank), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_pgc_state_dict(state["pgc"])
    return state.get("extra", {})
