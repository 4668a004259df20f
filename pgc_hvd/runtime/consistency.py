"""What must agree across ranks, and the cheap collectives that check it.

Every rank applies the same sequence of decoded updates, so the ranks' parameters stay
bit-identical only if every rank starts from the same parameters and turns an update into a step
the same way. This module holds the pieces :class:`pgc_hvd.DistributedOptimizer` uses to check
that, each once (at construction, at the first ``batches()`` of a loader, at ``close()``), never
per step:

- :func:`optimizer_fingerprint`, :func:`loader_fingerprint`: the settings that must agree, as an
  ordered ``{field: JSON value}`` dict (the optimizer class and every hyper-parameter of every
  param group, scheme, s, options, compression, control, name, optimistic, the parameters'
  dtypes, device kind and shapes; the loader's n, seed, batch size and partitions);
- :func:`gather_fingerprints`: every rank's dict on every rank (its JSON bytes; a few hundred
  bytes, polled with the timeout);
- :func:`fingerprint_differences` and :func:`mismatch_message`: the fields whose values differ
  from rank 0's and the ranks that hold them;
- :func:`check_start`, :func:`final_versions`: every rank's model version (at the first step:
  they must agree; at ``close()``: every rank goes on to the largest any rank reached in its
  loop);
- :func:`compare_digests`, :func:`check_close`: the parameters' digest (one pass over d, at
  ``close()`` only), allgathered as one int64 per rank with the model version, so that no run
  ends with ranks that disagree.

The collectives, the version agreement and the digest are :mod:`pgc_hvd.runtime.agreement`'s
(``gather_versions`` and ``tensors_digest`` are used from here too).

Owns what must agree across ranks and its checks (the fingerprints, :class:`LoaderCheck`, the
start and close checks, :class:`NonFiniteParameters`); no state beyond a LoaderCheck's. Thread:
the training thread (construction, a loader's first ``batches()``, the first step, ``close()``).
May import: torch, numpy, :mod:`pgc_hvd.runtime.agreement`, :mod:`pgc_hvd.runtime.errors`.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Optional, Sequence

import numpy as np
import torch

from pgc_hvd.runtime.agreement import (gather_bytes, gather_rows, gather_versions, no_answer,
                                       tensors_digest)
from pgc_hvd.runtime.errors import AgentError


class NonFiniteParameters(AgentError):
    """This rank's parameters hold NaN/Inf while the decoded updates are finite: they were
    changed outside the optimizer; every rank stops
    (:meth:`pgc_hvd.runtime.faults.FaultMonitor.check_params`)."""

#: why a field must agree, appended to the error when it differs
HINTS = {
    "name": "it names the collectives: ranks with different names would wait for each other "
            "until the timeout",
    "optimistic": "it decides whether payloads ride in the control allgather: the ranks' "
                  "rows would not parse",
    "control": "every rank must exchange control rows through the same channel",
    "optimizer class": "every rank must turn a decoded update into the same step",
    "parameter dtypes": "cast the model the same way on every rank (model.to(dtype))",
    "device kind": "put the model on the same kind of device on every rank",
    "parameter shapes": "build the same model on every rank",
}
LOADER_HINT = ("build the loader with the same data, seed and batch_size on every rank: gradient "
               "coding recovers the full gradient only if the replicas of a partition evaluate "
               "the same samples")


def canonical(value):
    """A JSON-able form of a setting that is equal on two ranks exactly when the setting is
    (floats keep every bit through ``repr``; tensors become lists, or a digest when large;
    objects whose repr holds a memory address are named by their class)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if np.isfinite(value) else repr(value)
    if isinstance(value, (np.integer, np.floating)):
        return canonical(value.item())
    if torch.is_tensor(value):
        t = value.detach().cpu()
        if t.numel() <= 16:
            return {"tensor": [canonical(x) for x in t.reshape(-1).tolist()],
                    "dtype": str(t.dtype)}
        return {"tensor_digest": tensors_digest([t]), "dtype": str(t.dtype),
                "shape": list(t.shape)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, torch.dtype):
        return str(value)
    r = repr(value)
    if " at 0x" in r:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return r


def _runs(items: Sequence[str]) -> str:
    """Run-length form, in order: ``float16 x2, float32 x4``."""
    out, prev, k = [], None, 0
    for it in list(items) + [None]:
        if it == prev:
            k += 1
            continue
        if prev is not None:
            out.append(f"{prev} x{k}")
        prev, k = it, 1
    return ", ".join(out)


def optimizer_fingerprint(optimizer_class: type, param_groups: Sequence[dict],
                          params: Sequence[torch.Tensor], *, scheme: str, stragglers: int,
                          options: dict, compression, control: str, name: str,
                          optimistic: bool, replay: Optional[Sequence] = None,
                          extra: Optional[dict] = None) -> dict:
    """The ordered ``{field: value}`` of everything that must agree across ranks for the
    ranks' parameters to stay identical (module doc). ``params`` are the parameters in the flat
    layout's order; ``optimistic`` is the effective value (None resolved)."""
    fp = {
        **{k: canonical(v) for k, v in (extra or {}).items()},
        "scheme": scheme.lower(), "stragglers": int(stragglers),
        "scheme_options": canonical(dict(options)), "compression": repr(compression),
        "control": control, "name": name, "optimistic": optimistic,
        "replay_arrivals": (None if not replay else
                            f"{len(replay)} arrivals, crc32 "
                            f"{zlib.crc32(repr([tuple(map(int, a)) for a in replay]).encode())}"),
        "optimizer class": f"{optimizer_class.__module__}.{optimizer_class.__qualname__}",
        "param_groups (parameters per group)": [len(g["params"]) for g in param_groups],
    }
    for i, g in enumerate(param_groups):
        for key in sorted(k for k in g if k != "params"):
            fp[f"param_groups[{i}][{key!r}]"] = canonical(g[key])
    fp["parameter dtypes"] = _runs([str(p.dtype).replace("torch.", "") for p in params])
    fp["device kind"] = sorted({p.device.type for p in params})
    shapes = repr([tuple(p.shape) for p in params]).encode()
    fp["parameter shapes"] = (f"{len(params)} tensors, d = {sum(p.numel() for p in params)}, "
                              f"shapes crc32 {zlib.crc32(shapes)}")
    return fp


def loader_fingerprint(loader) -> dict:
    """The partitioning a loader serves, as far as it is known: every loader's class and its
    ``n``, ``seed`` and ``batch_size`` when it has them; for a
    :class:`~pgc_hvd.data.partition_loader.PartitionLoader` also the number, shape and dtype of the
    samples and CRC32s of the partitions' indices and of the labels (one pass over the indices
    and labels, not over the samples); for a loader over a torch dataset
    (:class:`~pgc_hvd.data.coded_loader.CodedLoader`) the dataset's class and length and the
    ``repr`` of its ``transform`` / ``target_transform`` (memory addresses blanked), since
    replicas must augment alike -- never a sample."""
    cls = type(loader)
    fp = {"loader class": f"{cls.__module__}.{cls.__qualname__}"}
    for key in ("n", "seed", "batch_size"):
        if hasattr(loader, key):
            fp[f"loader {key}"] = canonical(getattr(loader, key))
    parts = getattr(loader, "partitions", None)
    if parts is not None:
        crc = 0
        for p in parts:
            crc = zlib.crc32(np.ascontiguousarray(np.asarray(p, dtype=np.int64)).tobytes(), crc)
        fp["loader partitions"] = f"{len(parts)} partitions of sizes crc32 " \
            f"{zlib.crc32(repr([len(p) for p in parts]).encode())}, indices crc32 {crc}"
    ds = getattr(loader, "dataset", None)
    if ds is not None and hasattr(ds, "__len__"):
        names = []
        while True:   # through torch Subsets to the dataset that holds the transforms
            dcls = type(ds)
            names.append(f"{dcls.__module__}.{dcls.__qualname__} of {len(ds)} samples")
            inner = getattr(ds, "dataset", None)
            if not (isinstance(ds, torch.utils.data.Subset) and hasattr(inner, "__len__")):
                break
            ds = inner
        fp["loader dataset"] = " in ".join(names)
        for attr in ("transform", "target_transform"):
            if getattr(ds, attr, None) is not None:
                fp[f"loader {attr}"] = re.sub(r"0x[0-9a-fA-F]+", "0x?", repr(getattr(ds, attr)))
    X, y = getattr(loader, "X", None), getattr(loader, "y", None)
    if torch.is_tensor(X):
        fp["loader samples"] = f"{tuple(X.shape)} {str(X.dtype).replace('torch.', '')}"
    if torch.is_tensor(y):
        fp["loader labels"] = f"{len(y)} labels, digest {tensors_digest([y])}"
    return fp


def gather_fingerprints(hvd, fingerprint: dict, *, name: str, timeout: float, rank: int,
                        what: str) -> list[dict]:
    """Every rank's ``fingerprint`` on every rank, in rank order: its UTF-8 JSON bytes through
    :func:`~pgc_hvd.runtime.agreement.gather_bytes` (two allgathers), polled with ``timeout``."""
    raw = json.dumps(fingerprint).encode()
    return [json.loads(b.decode()) for b in
            gather_bytes(hvd, raw, name=name, timeout=timeout,
                         error=no_answer(rank, what, timeout))]


_ABSENT = "<absent>"


def fingerprint_differences(rows: Sequence[dict]) -> list[tuple[str, list[int], dict]]:
    """``[(field, ranks whose value differs from rank 0's, {rank: value})]`` for every field on
    which the ranks do not all agree, in rank 0's field order (fields only other ranks have
    last)."""
    fields = list(rows[0])
    for r in rows[1:]:
        fields += [f for f in r if f not in fields]
    out = []
    for f in fields:
        vals = [json.dumps(r.get(f, _ABSENT), sort_keys=True) for r in rows]
        if len(set(vals)) > 1:
            bad = [r for r, v in enumerate(vals) if v != vals[0]]
            out.append((f, bad, {r: row.get(f, _ABSENT) for r, row in enumerate(rows)}))
    return out


def _short(v, width: int = 90) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return s if len(s) <= width else s[:width - 3] + "..."


def mismatch_message(diffs, *, what: str, fix: str, hints: Optional[dict] = None,
                     hint: Optional[str] = None) -> str:
    """One error for every rank: per differing field, the ranks that differ from rank 0 and the
    values (rank 0's first, then each differing rank's)."""
    hints = HINTS if hints is None else hints
    parts = []
    shown_max = 4
    for field, bad, vals in diffs[:shown_max]:
        shown = "; ".join(f"rank {r}: {_short(vals[r])}" for r in [0] + bad[:4])
        more = f"; and {len(bad) - 4} more ranks" if len(bad) > 4 else ""
        why = hints.get(field) or hint
        parts.append(f"ranks {bad} were built with a different {field} than rank 0 "
                     f"({shown}{more}){'' if not why else f' ({why})'}")
    if len(diffs) > shown_max:
        parts.append(f"and {len(diffs) - shown_max} more fields differ: "
                     + ", ".join(f for f, _, _ in diffs[shown_max:shown_max + 12])
                     + (", ..." if len(diffs) > shown_max + 12 else ""))
    return f"{what}: " + "; ".join(parts) + f". {fix}"


def compare_digests(hvd, version: int, digest: int, *, name: str, timeout: float,
                    rank: int) -> Optional[str]:
    """Allgather ``[version, digest]`` (int64) from every rank; returns None when every rank
    holds the same, else an error message naming the ranks that differ from the majority (ties:
    from rank 0's group) and every rank's version."""
    rows = gather_rows(hvd, [int(version), int(digest)], name=name, timeout=timeout,
                       error=no_answer(rank, "close()'s comparison of the parameters across "
                                             "ranks", timeout))
    keys = [tuple(r) for r in rows]
    if len(set(keys)) == 1:
        return None
    groups: dict = {}
    for r, k in enumerate(keys):
        groups.setdefault(k, []).append(r)
    ordered = sorted(groups.values(), key=lambda rs: (-len(rs), rs[0]))
    ref = ordered[0]
    odd = sorted(r for rs in ordered[1:] for r in rs)
    versions = [k[0] for k in keys]
    what = ("hold parameters that differ from" if len(set(versions)) == 1 else
            "end at a different model version or with different parameters than")
    return (f"pgc_hvd: after close(), ranks {odd} {what} ranks {ref} (model version per rank "
            f"{versions}; parameter digests {[hex(k[1]) for k in keys]}): every rank applied "
            f"the same decoded updates, so something outside the optimizer changed the "
            f"parameters of some ranks (code that runs on one rank only, a different model or "
            f"initialisation without hvd.broadcast_parameters, a hardware fault). Do not save or "
            f"evaluate this model; restart from a checkpoint saved when the ranks agreed.")


# -- the checks DistributedOptimizer runs, each once -----------------------------------------
def check_construction(hvd, optimizer_class: type, param_groups, params, fields: dict, *,
                       rank: int, n: int, timeout: float) -> None:
    """Every rank compares everything that must agree across ranks before any scheme is built
    (:func:`optimizer_fingerprint` of ``fields``, :func:`pgc_hvd.runtime.config.cross_rank_fields`);
    a mismatch raises the same ValueError on every rank, naming each field that differs, the
    ranks that differ from rank 0 and their values. The collectives are named ``pgc.config.*``
    whatever ``name`` is, so a different ``name`` is reported, not waited on."""
    fp = optimizer_fingerprint(optimizer_class, param_groups, params, **fields)
    rows = gather_fingerprints(
        hvd, fp, name="pgc.config", timeout=timeout, rank=rank,
        what="the construction check of DistributedOptimizer (every rank must construct it)")
    diffs = fingerprint_differences(rows)
    if diffs:
        raise ValueError(mismatch_message(
            diffs, what="pgc_hvd.DistributedOptimizer",
            fix=f"Every rank must build the optimizer with the same arguments, "
                f"hyper-parameters and model: compute them from the same configuration, not "
                f"from the rank (world size {n})."))


def check_start(hvd, version: int, *, name: str, timeout: float, rank: int) -> None:
    """Every rank starts at the same model version (one int64 allgather), or ValueError."""
    versions = gather_versions(hvd, version, name=name, timeout=timeout, rank=rank)
    if len(set(versions)) != 1:
        by: dict = {}
        for r, v in enumerate(versions):
            by.setdefault(v, []).append(r)
        listing = ", ".join(f"ranks {rs}: version {v}" for v, rs in sorted(by.items()))
        raise ValueError(
            f"pgc_hvd: the ranks start at different model versions ({listing}): "
            f"a checkpoint was loaded on some ranks only. Load it on every rank "
            f"(pgc_hvd.runtime.load_checkpoint), or load it on rank 0 and then call "
            f"hvd.broadcast_parameters(model.state_dict(), 0) and "
            f"hvd.broadcast_optimizer_state(optimizer, 0) on every rank before the first "
            f"step")


class LoaderCheck:
    """Compares a loader's partitioning across ranks (:func:`loader_fingerprint`: class, n,
    seed, batch size, partitions, samples and labels of a PartitionLoader) the first time a
    loader object is passed to ``batches()``, and again whenever a loader with a partitioning
    not compared before is passed: one collective on the training thread, so every rank must
    pass its loaders in the same order; the same loader again costs nothing. A mismatch raises
    the same ValueError on every rank naming the field and the ranks."""

    def __init__(self, hvd, *, n: int, rank: int, name: str, timeout: float, scheme_name: str):
        self.hvd, self.n, self.rank, self.name = hvd, int(n), int(rank), name
        self.timeout, self.scheme_name = float(timeout), scheme_name
        self._fps: list = []        # loader fingerprints already compared
        self._last = None           # the loader last checked
        self._bound: list = []      # loaders already bound (compared by identity)

    def __call__(self, loader, bind: Optional[tuple] = None) -> None:
        """Check ``loader`` (see the class doc); the first time, call its ``bind(*bind)`` if it
        has one (``(scheme, rank)``: a prefetching loader then foresees the (partition, step)
        pairs it will be asked for)."""
        if loader is self._last:
            return
        n_parts = getattr(loader, "n", None)
        if n_parts is not None and n_parts != self.n:
            raise ValueError(f"pgc_hvd: the loader splits the data into n = {n_parts} partitions "
                             f"but {self.scheme_name} runs on {self.n} ranks, one partition per "
                             f"rank: build it with n=hvd.size()")
        fp = loader_fingerprint(loader)
        if fp not in self._fps:
            k = len(self._fps)
            rows = gather_fingerprints(
                self.hvd, fp, name=f"{self.name}.loader.{k}", timeout=self.timeout,
                rank=self.rank,
                what=f"the comparison of loader {k} across ranks at its first batches() (every "
                     f"rank must iterate optimizer.batches(loader) with its loaders in the same "
                     f"order)")
            diffs = fingerprint_differences(rows)
            if diffs:
                raise ValueError(mismatch_message(
                    diffs, what="pgc_hvd: optimizer.batches(loader)", hint=LOADER_HINT,
                    fix="Build the loader from the same data and arguments on every rank."))
            self._fps.append(fp)
        if bind is not None and not any(b is loader for b in self._bound):
            fn = getattr(loader, "bind", None)
            if callable(fn):
                fn(*bind)
            self._bound.append(loader)
        self._last = loader


def check_close(hvd, version: int, params, hyper: int, *, name: str, timeout: float,
                rank: int, fault: Optional[BaseException] = None) -> None:
    """``close()``'s comparison: the parameters' digests and the applied hyper-parameters'
    digests (:func:`compare_digests`), then ``fault`` (this rank's own, raised after the
    comparison the other ranks wait for), then AgentError on every rank when they differ."""
    differ = compare_digests(hvd, version, tensors_digest(params), name=name, timeout=timeout,
                             rank=rank)
    hyper_differ = compare_digests(hvd, version, hyper, name=f"{name}.hyper", timeout=timeout,
                                   rank=rank)
    if fault is not None:
        raise fault
    if differ is not None and hyper_differ is not None:
        differ += (" The hyper-parameters the updates were applied with (lr, momentum, "
                   "...) also differ across ranks: a learning-rate change that depends "
                   "on rank-local values (ReduceLROnPlateau on the rank's own loss, an "
                   "lr set from wall time) trains a different model on each rank. Drive "
                   "it from values every rank shares: the step count (optimizer.version "
                   "or the loop counter: each step() applies one update) or "
                   "optimizer.metrics (the decided step's mean loss).")
    if differ is not None:
        raise AgentError(differ)


def final_versions(hvd, version: int, *, name: str, timeout: float, rank: int) -> list:
    """``close()``'s agreement on the final version: every rank's loop-end version (the final
    version is their max), with a RuntimeWarning when the loops ended at different versions
    (the missing updates are then applied without the loop's per-step code)."""
    ends = gather_versions(hvd, version, name=name, timeout=timeout, rank=rank,
                           what="close()'s agreement on the final model version")
    if len(set(ends)) > 1:
        import warnings
        warnings.warn(
            f"pgc_hvd: the ranks' training loops ended at different versions "
            f"({dict(enumerate(ends))}): close() applies the missing decided updates "
            f"(up to {max(ends)}) without the loop's own per-step code (schedulers, "
            f"clipping). Give every rank the same number of step() calls (each applies "
            f"one update), e.g. `for i in range(steps)` or `while opt.version < steps`",
            RuntimeWarning, stacklevel=3)
    return ends
