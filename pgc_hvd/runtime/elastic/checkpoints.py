"""Durable progress of an elastic run: the decided model version on disk, so that a job that
Horovod could not keep alive restarts from it and loses nothing decided (issue 26).

Why: Horovod's elastic mode survives a rank's death only when every survivor reaches the new
rendezvous in time. A death during the job's start-up, a re-form or under load can make the
survivors abort in C++ (``gloo::IoException``, a rendezvous ``Wait timeout``, a ``Connect
timeout``): no Python code runs, nothing is saved then. So progress is saved before it can be
lost: after every step (or every ``every`` versions) each rank writes the state it holds, and a
new job (``launch/elastic_run.py`` restarts a failed one) starts from the newest file.

What a file holds (world-independent, unlike :func:`~pgc_hvd.runtime.checkpoint.save_checkpoint`,
whose per-rank files carry the ring buffers, n, s and the rank of one fixed world): ``{"format":
1, "version": V, "model": model.state_dict(), "optimizer": the torch optimizer's state_dict()
(momentum, ...), "n": the world size it was written in, "time": ...}``. A resumed world starts at
V with an empty ring, exactly as a re-formed world does (:meth:`ElasticState.sync`), so it may
have any n. Tensors and plain types only (:mod:`pgc_hvd.runtime.plain`), read with
``torch.load(weights_only=True)``: a file cannot run code when it is read.

Where: ``{folder}/{tag}.v{V}.pt``, ``tag`` one per process slot (host and local rank), written
to ``.tmp`` and renamed over (``os.replace``: atomic, a kill leaves the previous file or the new
one, never a mix), then the tag's older files are removed; the version is in the name, so the
newest is found without reading any file. Every rank writes its own: a version any rank has
applied is on disk even when that rank is the one killed, and on hosts without a shared folder
each host keeps its own (the ranks then agree in ``sync()``, the most advanced one broadcasts).
Writes are not fsync'ed unless ``fsync=True``: a process's death (SIGKILL, an abort) never loses
what it wrote to the page cache; only the machine's crash can.

Cost (docs/elastic.md, "Kills at any moment"): one ``torch.save`` of the model and the optimizer
state per rank per saved version: about 1 ms for the recipe's MLP; for large models save every k
versions (a restart then redoes at most k - 1 versions).

Owns the elastic checkpoint files (:func:`write`, :func:`read`, :func:`latest_version`) and
:class:`ElasticCheckpoints` (folder, tag, how often). Thread: the training thread (the user's
loop: ``save``, ``resume``).
May import: torch, :mod:`pgc_hvd.runtime.plain`, :mod:`pgc_hvd.runtime.checkpoint` (its atomic
writer); nothing of Horovod (the caller passes the state's parts).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from typing import Optional

import torch

from pgc_hvd.runtime.checkpoint import write_atomic
from pgc_hvd.runtime.plain import check_plain

FORMAT = 1
_NAME = re.compile(r"^(?P<tag>.+)\.v(?P<version>\d+)\.pt$")


class ElasticCheckpointError(ValueError):
    """A checkpoint file that cannot be resumed from (the message names it and why)."""


def checkpoint_files(folder) -> list[tuple[int, str, str]]:
    """``(version, tag, path)`` of every checkpoint file in ``folder``, oldest first (none when
    the folder does not exist)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _NAME.match(name)
        if m:
            out.append((int(m["version"]), m["tag"], os.path.join(os.fspath(folder), name)))
    return sorted(out)


def latest_version(folder) -> Optional[int]:
    """The newest version saved in ``folder``, or None."""
    files = checkpoint_files(folder)
    return files[-1][0] if files else None


def write(folder, tag: str, version: int, model_state: dict, optimizer_state: dict,
          n: int = 0, fsync: bool = False) -> str:
    """Write one checkpoint file atomically (module doc) and remove the tag's older ones;
    returns its path."""
    if "/" in tag or _NAME.match(f"{tag}.v0.pt")["tag"] != tag:
        raise ValueError(f"checkpoint tag {tag!r} must be a file name part without '/'")
    state = {"format": FORMAT, "version": int(version), "model": model_state,
             "optimizer": optimizer_state, "n": int(n), "time": time.time()}
    check_plain(state, "the elastic checkpoint")
    folder = os.fspath(folder)
    path = os.path.join(folder, f"{tag}.v{int(version)}.pt")
    write_atomic(path, state, fsync=fsync, verify=False)   # check_plain above; every version
    for v, t, old in checkpoint_files(folder):
        if t == tag and v < version:
            with contextlib.suppress(OSError):
                os.remove(old)
    return path


def read(path) -> dict:
    """The state in checkpoint file ``path`` (``torch.load(weights_only=True)``: no code runs),
    or :class:`ElasticCheckpointError` naming the file and the problem."""
    path = os.fspath(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ElasticCheckpointError(f"elastic checkpoint {path} cannot be read "
                                     f"({type(err).__name__}: {str(err)[:300]})") from None
    if (not isinstance(state, dict) or state.get("format") != FORMAT
            or not all(k in state for k in ("version", "model", "optimizer"))):
        raise ElasticCheckpointError(f"{path} is not an elastic checkpoint of format {FORMAT}")
    return state


class ElasticCheckpoints:
    """Save an :class:`~pgc_hvd.runtime.elastic.ElasticState`'s progress, resume a new job from
    it (module doc).

        ckpt = ElasticCheckpoints("run/checkpoints", tag=f"{host}.{hvd.local_rank()}")
        resumed = ckpt.resume(state)          # before train(state); None: nothing saved yet

        @hvd.elastic.run
        def train(state):
            while state.opt.version < steps:
                ckpt.save(state)              # the version every rank of this world reached
                ...
                state.step(...)
            state.close()
            ckpt.save(state)

    Args:
        folder: where the files go (shared by all ranks, or one per host).
        tag: this process slot's name part (host and local rank): one file per slot.
        every: save when the version is a multiple of ``every`` (and always the first version
            of a world and the last one, :meth:`save` with ``force=True``).
        fsync: make each file durable against the machine's crash too (slower).
    """

    def __init__(self, folder, tag: str, every: int = 1, fsync: bool = False):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1 (versions), got {every!r}")
        self.folder, self.tag, self.every, self.fsync = os.fspath(folder), str(tag), every, fsync
        self.saved = -1             # the newest version this process wrote
        self.seconds = 0.0          # time spent writing
        self.writes = 0

    def save(self, state, force: bool = False) -> Optional[str]:
        """Write the state's model and optimizer at its current version when that is new and
        due (``version % every == 0``, or ``force``); returns the path written, or None."""
        opt = state.opt
        if opt is None:
            return None
        v = int(opt.version)
        if v <= self.saved or not (force or v % self.every == 0):
            return None
        t0 = time.perf_counter()
        path = write(self.folder, self.tag, v, state.model.state_dict(),
                     torch.optim.Optimizer.state_dict(opt), n=int(opt.n), fsync=self.fsync)
        self.seconds += time.perf_counter() - t0
        self.writes += 1
        self.saved = v
        return path

    def resume(self, state) -> Optional[int]:
        """Before the first world's ``sync()``: load the newest file of the folder into
        ``state.model`` and ``state.base`` and make the state start at its version
        (:meth:`ElasticState.resume_at`; ``sync()`` then broadcasts it from the most advanced
        rank to any rank that found no file). Returns the version, or None when there is none.
        A damaged newest file (it cannot be: files are renamed complete) raises
        :class:`ElasticCheckpointError`."""
        files = checkpoint_files(self.folder)
        if not files:
            return None
        version, _, path = files[-1]
        saved = read(path)
        state.model.load_state_dict(saved["model"])
        state.base.load_state_dict(saved["optimizer"])
        state.resume_at(int(saved["version"]))
        self.saved = int(saved["version"])
        return self.saved
