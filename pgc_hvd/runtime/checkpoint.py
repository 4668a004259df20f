"""Checkpoints of a rank: model, optimizer, ring buffers, step, RNG states, trace position.

Every rank saves its own file (``{path}.rank{r}``: ring buffers and RNG states differ per rank).
Save when every rank has applied the same updates (e.g. after ``optimizer.close()``, or after
``optimizer.apply_decided()`` at a step every rank reached) and restore before the first step.

Saving is atomic and durable: the state goes to ``{file}.tmp``, which is fsync'ed and renamed
over ``{file}``, and the folder is fsync'ed, so a crash leaves the previous checkpoint or the new
one, never a mix. A save that fails or is interrupted (KeyboardInterrupt) removes its ``.tmp``;
a process killed outright (SIGKILL) may leave it behind, and the next save replaces it (loading
never reads it).

What a checkpoint may hold: tensors and plain types only (:mod:`pgc_hvd.runtime.plain`; the RNG
states as tensors, ``extra`` checked at save time), and it is read with
``torch.load(weights_only=True)``, so a checkpoint from elsewhere cannot run code when it is
read: a file holding other pickled objects (a ``__reduce__`` calling ``os.system``) is refused
with a CheckpointError naming the file and the globals it holds, before anything in it is
built. Files written before this rule (their numpy RNG state a pickled numpy array) are refused
too, with the fix: :func:`convert_checkpoint` rewrites one without running code in it.

Restoring is all or nothing, on every rank: :func:`load_checkpoint` reads and checks the whole
file first (a torch checkpoint with the keys :func:`save_checkpoint` writes; scheme, n, s and
rank of this run; the shapes of the model's tensors, the ring buffers and the error-feedback
residual; the optimizer's parameter groups), then the ranks compare, in one small polled
allgather, the step each read (:mod:`pgc_hvd.runtime.agreement`; the problems' texts follow
when a rank refuses). Only when every rank's file passed and all hold the same step does any rank
change its model and optimizer; otherwise every rank raises the same :class:`CheckpointError`
naming each rank's file and problem, and nothing was changed.

Owns the per-rank checkpoint file (its keys, the atomic write :func:`write_atomic`, the checks
of a saved state, the all-or-nothing restore) and :class:`CheckpointError`; no state. Thread:
the training thread (the user's save and load; the elastic checkpoints' writer).
May import: numpy, torch, the standard library, ``runtime.agreement`` (the agreement
on the step), ``runtime.plain`` (what a checkpoint may hold).
"""

from __future__ import annotations

import contextlib
import os
import pickle

import numpy as np
import torch

from pgc_hvd.runtime.agreement import gather_bytes, gather_rows
from pgc_hvd.runtime.plain import NotPlain, check_plain, unsafe_globals

# what save_checkpoint writes; load_checkpoint needs the first two
CHECKPOINT_KEYS = ("model", "pgc", "extra")
# what pgc_state_dict writes; the optional ones have defaults in load_pgc_state_dict
PGC_REQUIRED = ("optimizer", "version", "scheme", "n", "s", "rank", "ring", "slot_versions",
                "rng")
RNG_KEYS = ("torch", "numpy", "python")


class CheckpointError(ValueError):
    """A checkpoint that cannot be restored into this run; the message names the file (or the
    state dict) and the problem. Raised before anything was changed."""


def _path(path, rank: int) -> str:
    return f"{os.fspath(path)}.rank{rank}"


def _fsync_dir(folder: str) -> None:
    """Make a rename inside ``folder`` durable (POSIX: fsync the directory itself)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path, model: torch.nn.Module, optimizer, extra: dict | None = None) -> str:
    """Write this rank's checkpoint to ``{path}.rank{rank}`` atomically (see the module doc) and
    return that file's name. ``extra``: a dict of tensors and plain types (numbers, strings,
    lists, dicts, ...; :mod:`pgc_hvd.runtime.plain`), returned by :func:`load_checkpoint`;
    anything else (a numpy scalar, an object) raises :class:`~pgc_hvd.runtime.plain.NotPlain`
    naming its key before anything is written."""
    out = _path(path, optimizer.rank)
    state = {"model": model.state_dict(), "pgc": optimizer.pgc_state_dict(), "extra": extra or {}}
    try:
        check_plain(state["extra"], "extra")
        check_plain(state["model"], "the model's state_dict()")
        check_plain(state["pgc"], "the optimizer's pgc_state_dict()")
    except NotPlain as err:
        raise NotPlain(f"save_checkpoint({out}): {err}; nothing was written") from None
    write_atomic(out, state)
    return out


def write_atomic(out: str, state: dict, *, fsync: bool = True, verify: bool = True) -> None:
    """``torch.save(state)`` to ``out`` atomically (module doc): to ``out.tmp``, renamed over
    ``out``; a failed or interrupted save removes its ``.tmp``. ``fsync``: the file and the
    folder are fsync'ed too (durable against the machine's crash, not only the process's death).
    ``verify``: the written file is checked to hold no global that ``weights_only=True``
    refuses (it is read once more). Also the writer of the elastic checkpoints
    (:mod:`pgc_hvd.runtime.elastic.checkpoints`, which skips both by default)."""
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    tmp = out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        bad = unsafe_globals(tmp) if verify else []
        if bad:     # check_plain let through something torch pickles as a global
            raise NotPlain(f"{out}: the state pickles globals {bad} that load_checkpoint would "
                           f"refuse; store tensors and plain types only; nothing was written")
        os.replace(tmp, out)
    except BaseException:       # also KeyboardInterrupt: never leave a partial .tmp behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if fsync:
        _fsync_dir(folder)


def read_checkpoint(file) -> dict:
    """The state dict in checkpoint ``file``, or a CheckpointError naming the file (missing,
    empty, truncated or damaged, holding objects other than tensors and plain types, not a
    checkpoint of :func:`save_checkpoint`). Read with ``torch.load(weights_only=True)``: no
    code in the file runs."""
    file = os.fspath(file)
    if not os.path.isfile(file):
        what = "is a folder" if os.path.isdir(file) else "does not exist"
        raise CheckpointError(f"checkpoint file {file} {what}; save_checkpoint(path, ...) writes "
                              f"one file per rank, named path.rank<r>")
    if os.path.getsize(file) == 0:
        raise CheckpointError(f"checkpoint file {file} is empty (0 bytes); it was not written by "
                              f"save_checkpoint, which replaces a file only with a complete one")
    try:
        state = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise CheckpointError(_refusal(file, err)) from None
    except Exception as err:
        raise CheckpointError(f"checkpoint file {file} cannot be read, it is truncated or "
                              f"damaged ({type(err).__name__}: {err})") from None
    missing = [k for k in CHECKPOINT_KEYS[:2] if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{file} is not a pgc_hvd checkpoint: it lacks {missing} (found "
                              f"{_describe(state)}); write checkpoints with save_checkpoint")
    return state


def _numpy_globals() -> list:
    """numpy's value-rebuilding globals (``(object, name)`` pairs for torch's ``safe_globals``):
    what a checkpoint of an earlier pgc_hvd holds besides tensors and plain types (its numpy
    RNG state; numpy values in ``extra``), under both names of numpy's core module (numpy 1
    wrote ``numpy.core``). They build arrays, dtypes and scalars, and run no other code."""
    core = getattr(np, "_core", None) or np.core
    out = [np.ndarray, np.dtype]
    out += [getattr(np.dtypes, k) for k in dir(getattr(np, "dtypes", None)) if k.endswith("DType")]
    for fn in ("_reconstruct", "scalar"):
        obj = getattr(core.multiarray, fn)
        out += [(obj, f"numpy.core.multiarray.{fn}"), (obj, f"numpy._core.multiarray.{fn}")]
    return out


def _legacy(name: str) -> bool:
    """Whether global ``name`` is one of :func:`_numpy_globals`."""
    module, _, attr = name.rpartition(".")
    return (name in ("numpy.ndarray", "numpy.dtype") or module == "numpy.dtypes" or
            (attr in ("_reconstruct", "scalar") and
             module in ("numpy.core.multiarray", "numpy._core.multiarray")))


def _refusal(file: str, err: Exception) -> str:
    """The message for a file that ``torch.load(weights_only=True)`` refused (``err``)."""
    try:
        found = unsafe_globals(file)
    except Exception:
        found = []
    if found and all(_legacy(g) for g in found):
        return (f"checkpoint file {file} was written by an earlier pgc_hvd (its numpy RNG state "
                f"is a pickled numpy array; checkpoints now hold tensors and plain types only "
                f"and are read with torch.load(weights_only=True)); convert it once, without "
                f"running code in it: python -c \"from pgc_hvd.runtime.checkpoint import "
                f"convert_checkpoint; convert_checkpoint('{file}')\" (each rank's file)")
    what = f"the globals {found}" if found else "objects"
    detail = next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line),
                  str(err).strip().splitlines()[-1] if str(err).strip() else "")
    return (f"checkpoint file {file} holds {what} that torch.load(weights_only=True) refuses to "
            f"build: unpickling them could run code, so it is not read (save_checkpoint writes "
            f"tensors and plain types only). Do not load a file of unknown origin; if you wrote "
            f"it yourself and trust it, load it with torch.load(..., weights_only=False), turn "
            f"those objects into tensors and plain types and save again with save_checkpoint "
            f"(torch: {detail})")


def convert_checkpoint(file) -> str:
    """Rewrite a checkpoint written by an earlier pgc_hvd (numpy's RNG state a pickled numpy
    array, Python's a tuple) in place, atomically, as tensors and plain types, so that
    :func:`load_checkpoint` reads it; numpy scalars (``np.float64(0.9)`` in ``extra``) become
    Python numbers, other numpy values are refused, named. The old file is read with
    ``torch.load(weights_only=True)`` allowing only numpy's value-rebuilding globals, so no code
    in it runs; any other object is refused. Returns ``file``."""
    file = os.fspath(file)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            state = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise CheckpointError(_refusal(file, err)) from None
    rng = state.get("pgc", {}).get("rng") if isinstance(state, dict) else None
    if not isinstance(rng, dict):
        raise CheckpointError(f"{file} is not a pgc_hvd checkpoint (no pgc RNG state: found "
                              f"{_describe(state)}); nothing to convert")
    from pgc_hvd.runtime.plain import plain_rng_state
    state["pgc"]["rng"] = plain_rng_state(rng)
    state = _numbers(state)
    try:
        check_plain(state, file)
    except NotPlain as err:
        raise CheckpointError(f"{err}; not converted") from None
    write_atomic(file, state)
    return file


def _numbers(x):
    """``x`` with numpy scalars replaced by the Python numbers they hold (containers rebuilt)."""
    if isinstance(x, np.generic):
        return x.item()
    if type(x) in (dict, list, tuple):
        items = x.items() if isinstance(x, dict) else enumerate(x)
        conv = {k: _numbers(v) for k, v in items}
        return conv if isinstance(x, dict) else type(x)(conv.values())
    return x


def _describe(x) -> str:
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))[:8]}"
    return f"a {type(x).__name__}"


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else None


def check_model_state(saved, model: torch.nn.Module, source: str) -> None:
    """CheckpointError unless ``model.load_state_dict(saved)`` would succeed (same keys, same
    tensor shapes)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{source}: its model state is {_describe(saved)}, not a state dict")
    want = model.state_dict()
    missing, unexpected = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
    if missing or unexpected:
        raise CheckpointError(f"{source}: its model state does not fit this model (missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}); restore into the "
                              f"model it was saved from")
    bad = [f"{k}: saved {_shape(saved[k])}, model {tuple(v.shape)}" for k, v in want.items()
           if isinstance(v, torch.Tensor) and _shape(saved[k]) != tuple(v.shape)]
    if bad:
        raise CheckpointError(f"{source}: model tensor shapes differ ({'; '.join(bad[:3])})")


def check_same_run(state: dict, current: dict, source: str = "the state dict",
                   keys=("scheme", "n", "s", "rank")) -> None:
    """CheckpointError unless ``state`` was saved with this run's ``keys`` (scheme, n, s, and
    rank for a rank's own ring)."""
    for key in keys:
        if state.get(key) != current[key]:
            hint = (", each rank its own file" if key == "rank" else
                    "; for another world size load the parameters and a plain torch optimizer "
                    "state, then call optimizer.start_at(version)" if key == "n" else "")
            raise CheckpointError(f"{source}: saved with {key}={state.get(key)!r}, this run has "
                                  f"{key}={current[key]!r}; restore with the scheme, stragglers "
                                  f"and world size it was saved with{hint}")


def another_s_under_auto(optimizer, saved) -> bool:
    """Whether ``saved`` (a ``"pgc"`` part of a state or checkpoint) was saved at another s
    than ``optimizer``'s and ``optimizer`` runs ``stragglers="auto"`` (the rule had moved s):
    then only its torch state and step are restored, the ring starts empty
    (``load_checkpoint``, ``load_state_dict``); with a fixed s another s is refused."""
    return (optimizer.auto_stragglers is not None and isinstance(saved, dict)
            and saved.get("s") != optimizer.scheme.s)


def check_pgc_state(state, current: dict, source: str = "the state dict", *,
                    other_s: bool = False) -> None:
    """CheckpointError unless ``state`` (a saved ``pgc_state_dict()``) can be restored into the
    optimizer whose own ``pgc_state_dict()`` is ``current``: the required keys, the same scheme,
    n, s and rank, a step >= 0, ring buffers and residual of the same number and shapes, and the
    same parameter groups. ``other_s`` (``stragglers="auto"``, a state of another s: only its
    torch state and step are restored): the same scheme, n, rank and parameter groups and a step
    >= 0 only.
    Nothing is changed; ``load_pgc_state_dict`` calls it first."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: its optimizer state is {_describe(state)}, not the "
                              f"dict of pgc_state_dict()")
    missing = [k for k in PGC_REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{source}: its optimizer state lacks {missing}; it was not written "
                              f"by pgc_state_dict() / save_checkpoint")
    check_same_run(state, current, source,
                   keys=("scheme", "n", "rank") if other_s else ("scheme", "n", "s", "rank"))
    v = state["version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise CheckpointError(f"{source}: its step (version) is {v!r}, not an int >= 0")
    groups, want_groups = state["optimizer"], current["optimizer"]["param_groups"]
    saved_groups = groups.get("param_groups") if isinstance(groups, dict) else None
    if (not isinstance(saved_groups, list) or "state" not in groups or
            [len(g.get("params", ())) for g in saved_groups] != [len(g["params"]) for g in want_groups]):
        raise CheckpointError(f"{source}: its optimizer state does not fit this optimizer (saved "
                              f"parameter groups {_group_sizes(saved_groups)}, this optimizer "
                              f"{_group_sizes(want_groups)})")
    if other_s:    # only the torch state and the step are restored
        return
    ring, want = state["ring"], current["ring"]
    if not isinstance(ring, (list, tuple)) or [_shape(b) for b in ring] != [_shape(b) for b in want]:
        got = [_shape(b) for b in ring] if isinstance(ring, (list, tuple)) else _describe(ring)
        raise CheckpointError(f"{source}: ring buffers {got} do not match this run's "
                              f"{[_shape(b) for b in want]} (another model or scheme)")
    sv = state["slot_versions"]
    if not isinstance(sv, (list, tuple)) or len(sv) != len(current["slot_versions"]):
        raise CheckpointError(f"{source}: slot_versions {sv!r} do not match this run's "
                              f"{len(current['slot_versions'])} ring slots")
    res, want_res = state.get("residual"), current["residual"]
    if (res is None) != (want_res is None) or _shape(res) != _shape(want_res):
        raise CheckpointError(f"{source}: error-feedback residual {_shape(res)}, this run "
                              f"{_shape(want_res)} (None = no error-feedback compression); restore "
                              f"with the compression it was saved with")
    rng = state["rng"]
    if not isinstance(rng, dict) or any(k not in rng for k in RNG_KEYS) or \
            not isinstance(rng["torch"], torch.Tensor) or \
            not _rng_part_ok(rng["numpy"], "key", 624) or \
            not _rng_part_ok(rng["python"], "state", 625):
        raise CheckpointError(f"{source}: its RNG states are {_describe(rng)}, not the dict of "
                              f"{list(RNG_KEYS)} pgc_state_dict() writes")


def _rng_part_ok(part, key: str, size: int) -> bool:
    """numpy's or Python's RNG state as :func:`~pgc_hvd.runtime.plain.plain_rng_state`
    writes it (a dict whose ``key`` is a tensor of ``size``), or the generator's own tuple (an
    in-memory state of an earlier version)."""
    if isinstance(part, tuple):
        return True
    return (isinstance(part, dict) and isinstance(part.get(key), torch.Tensor)
            and part[key].numel() == size)


def _group_sizes(groups):
    if not isinstance(groups, list):
        return "missing"
    return [len(g.get("params", ())) if isinstance(g, dict) else "?" for g in groups]


def load_checkpoint(path, model: torch.nn.Module, optimizer) -> dict:
    """Restore this rank's checkpoint ``{path}.rank{rank}`` into ``model`` and ``optimizer`` on
    every rank, all or nothing (see the module doc); returns the ``extra`` dict it was saved with.

    Every rank must call it (it is a collective, with the optimizer's ``timeout``), before the
    first ``step()``. Raises :class:`CheckpointError` on every rank, with one message and with
    no model or optimizer changed, when any rank's file is missing, damaged or does not fit the
    run, or when the ranks' files hold different steps. Under ``stragglers="auto"`` a file saved
    at another s (the rule had moved it) restores the model, torch's optimizer state and the
    step, with an empty ring (``optimizer.start_at``), as ``load_state_dict`` does: the rule
    starts again from its first s.
    """
    file = _path(path, optimizer.rank)
    state, error, other_s = None, None, False
    try:
        if getattr(optimizer, "started", False):
            raise CheckpointError("load_checkpoint must be called before the first step()")
        state = read_checkpoint(file)
        check_model_state(state["model"], model, file)
        before_pgc = optimizer.pgc_state_dict()
        other_s = another_s_under_auto(optimizer, state["pgc"])
        check_pgc_state(state["pgc"], before_pgc, file, other_s=other_s)
    except Exception as err:        # any failure is reported to every rank, never half-way
        error = str(err) if isinstance(err, CheckpointError) else f"{type(err).__name__}: {err}"
    step = None if error else state["pgc"]["version"]
    _agree(optimizer, path, step, error)
    before_model = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        model.load_state_dict(state["model"])
        if other_s:
            optimizer.load_torch_state_dict(state["pgc"]["optimizer"])
            optimizer.start_at(step)
        else:
            optimizer.load_pgc_state_dict(state["pgc"], source=file)
    except BaseException:           # unreachable after the checks, but never leave a mix
        model.load_state_dict(before_model)
        optimizer.load_pgc_state_dict(before_pgc)
        raise
    return state.get("extra", {})


def _agree(optimizer, path, step, error) -> None:
    """Return when every rank's file passed its checks and all hold ``step``; else raise the
    same CheckpointError on every rank, naming each rank's problem."""
    hvd, timeout, rank = optimizer.hvd, optimizer.config.timeout, optimizer.rank
    late = (f"rank {rank}: not every rank called load_checkpoint within {timeout:.0f}s (the "
            f"optimizer's timeout); every rank must restore its own file before the first step")
    rows = gather_rows(hvd, [0 if error else 1, -1 if step is None else step],
                       name="pgc.checkpoint.step", timeout=timeout, error=late)
    steps = {s for ok, s in rows if ok}
    if all(ok for ok, _ in rows) and len(steps) == 1:
        return
    texts = gather_bytes(hvd, (error or "").encode("utf-8"), name="pgc.checkpoint.errors",
                         timeout=timeout, error=late)
    parts = [f"rank {r}: step {s}" if ok else f"rank {r}: {texts[r].decode('utf-8', 'replace')}"
             for r, (ok, s) in enumerate(rows)]
    why = ("some ranks' files cannot be restored" if not all(ok for ok, _ in rows) else
           "the ranks' files hold different steps; save every rank at the same step (e.g. after "
           "optimizer.close())")
    raise CheckpointError(f"load_checkpoint({os.fspath(path)!r}) restored nothing on any rank: "
                          f"{why} ({'; '.join(parts)})")
