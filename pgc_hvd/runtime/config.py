"""The optimizer's configuration: Horovod's keywords mapped, every default, every local check.

Owns :class:`RuntimeConfig` (the arguments of :func:`pgc_hvd.DistributedOptimizer` in one frozen
object), the mapping of Horovod's keywords (``compression=hvd.Compression.fp16``, ``op=hvd.Sum``,
the fusion options), every default (the straggler budget's is
:func:`pgc_hvd.schemes.default_stragglers`, written once, below both engines) and every check
that needs no collective, each once and before any collective, each error naming the argument
and the fix. It also lists the fields every rank compares at construction
(:func:`cross_rank_fields`; the comparison itself is :mod:`pgc_hvd.runtime.consistency`'s).

May import: ``options``, ``delays``, ``compress``, ``schemes``, ``control`` (layers below
``runtime``) and torch; nothing else of ``runtime``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

import torch

from pgc_hvd.compress import TopK
from pgc_hvd.options import is_count
from pgc_hvd.schemes import default_stragglers

#: ``straggler_policy`` values (the simulator's option of the same name)
POLICIES = ("continue", "cancel")
#: ``control`` values (how control rows move: :mod:`pgc_hvd.runtime.channel`)
CONTROLS = ("allgather", "store", "log")
#: the default control plane: the ordered log, which does not poll, so pgc_hvd issues the same
#: Horovod ops on every rank whatever the arrival order (the user's unnamed collectives keep
#: matching; docs/architecture.md "The control plane and the user's collectives")
DEFAULT_CONTROL = "log"
#: names ``step(metrics=...)`` may not use (:attr:`DistributedOptimizer.metrics` has them)
RESERVED_METRICS = ("step", "loss", "ranks")


def takes_three(fn) -> bool:
    """Whether ``fn`` accepts three positional arguments (``on_update(step, flat, decision)``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    pos = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos += 1
    return pos >= 3


def _check_arguments(n: int, *, stragglers, compression, delays, records, timeout, poll_interval,
                     on_record, on_update, replay_arrivals, scheme_options, optimistic=None):
    """Type and range checks of DistributedOptimizer's arguments, before any collective, each
    error naming the argument. Returns (s as an int, delays as a DelayModel or None); a delay
    spec string (``"exp:mean=0.1,seed=1"``) is parsed as the simulator's ``--delay``."""
    from pgc_hvd.delays import check_workers, parse_delay

    if isinstance(stragglers, bool):
        raise TypeError("stragglers must be an int (the straggler budget s), got a bool")
    try:
        s = operator.index(stragglers)
    except TypeError:
        raise TypeError(f"stragglers must be an int (the straggler budget s), got "
                        f"{stragglers!r}") from None
    if compression is not None and not isinstance(compression, TopK):
        raise TypeError(f"compression must be None (dense messages) or "
                        f"pgc_hvd.compress.TopK(...), got {compression!r}; Horovod's "
                        f"hvd.Compression does not apply here")
    if optimistic is not None and not isinstance(optimistic, bool):
        raise TypeError(f"optimistic must be None (by message size), True or False, got "
                        f"{optimistic!r}")
    if isinstance(delays, str):
        delays = parse_delay(delays)
    if delays is not None and not callable(getattr(delays, "sample", None)):
        raise TypeError(f"delays must be None, a delay model (DelayModel, or any object with "
                        f"sample(worker, step) -> seconds) or a spec string such as "
                        f"'exp:mean=0.1,seed=1', got {delays!r}")
    if delays is not None:
        check_workers(delays, n)
    if records is not None and not callable(getattr(records, "write", None)):
        raise TypeError(f"records must be None or have a write(record) method (e.g. "
                        f"pgc_hvd.metrics.records.RecordWriter(path)), got {records!r}")
    for name, fn in (("on_record", on_record), ("on_update", on_update)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be None or callable, got {fn!r}")
    for name, v in (("timeout", timeout), ("poll_interval", poll_interval)):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0):
            raise ValueError(f"{name} must be finite seconds > 0, got {v!r}")
    for w, _ in replay_arrivals or ():
        if not 0 <= int(w) < n:
            raise ValueError(f"replay_arrivals names worker {w}, outside [0, n) = [0, {n}): "
                             "was the schedule recorded with another number of ranks?")
    if (scheme_options or {}).get("decoder") == "min-error" and compression is None:
        raise ValueError("decoder='min-error' picks the complete class whose messages lost least "
                         "to compression (sum of ||C(u_i) - u_i||), so it needs compressed "
                         "messages: pass compression=pgc_hvd.compress.TopK(...), or use "
                         "decoder='n-s' for dense ones")
    return s, delays


@dataclass(frozen=True)
class RuntimeConfig:
    """The keyword arguments of :func:`DistributedOptimizer` (its docstring says what each
    means), in one object. :meth:`checked` validates them for a world of n ranks before any
    collective (:func:`_check_arguments`, then the choices below), parses a delay spec string,
    normalises the replayed arrivals, and returns the config the optimizer is built from."""

    scheme: str = "pgc-cr"
    stragglers: Optional[int] = None     # None: default_stragglers(scheme)
    compression: Any = None
    delays: Any = None
    records: Any = None
    scheme_options: Optional[dict] = None
    timeout: float = 60.0
    poll_interval: float = 0.002
    name: str = "pgc"
    on_record: Any = None
    on_update: Any = None
    replay_arrivals: Any = None
    straggler_policy: str = "continue"
    optimistic: Optional[bool] = None
    control: str = DEFAULT_CONTROL
    backward_passes_per_step: int = 1
    op_scale: float = 1.0
    wire_dtype: Optional[str] = None     # "float16": dense messages travel as fp16
    metrics: tuple = ()                  # names of the user metrics step(metrics=) carries
    momentum_correction: bool = True     # pgc_hvd.control.momentum (stale gradients' momentum)

    def checked(self, n: int) -> "RuntimeConfig":
        stragglers = (default_stragglers(self.scheme) if self.stragglers is None
                      else self.stragglers)
        s, delays = _check_arguments(
            n, stragglers=stragglers, compression=self.compression, delays=self.delays,
            records=self.records, timeout=self.timeout, poll_interval=self.poll_interval,
            on_record=self.on_record, on_update=self.on_update,
            replay_arrivals=self.replay_arrivals, scheme_options=self.scheme_options,
            optimistic=self.optimistic)
        if self.control not in CONTROLS:
            raise ValueError(f"control must be 'allgather', 'store' or 'log', "
                             f"got {self.control!r}")
        if self.straggler_policy not in POLICIES:
            raise ValueError(f"straggler_policy must be 'continue' or 'cancel', "
                             f"got {self.straggler_policy!r}")
        replay = ([(int(w), int(k)) for w, k in self.replay_arrivals]
                  if self.replay_arrivals else None)
        from pgc_hvd.control.momentum import parse_momentum_correction
        return dataclasses.replace(self, stragglers=s, delays=delays, name=str(self.name),
                                   momentum_correction=parse_momentum_correction(
                                       self.momentum_correction),
                                   scheme_options=dict(self.scheme_options or {}),
                                   timeout=float(self.timeout), replay_arrivals=replay)

    @property
    def cancel(self) -> bool:
        """``straggler_policy="cancel"``."""
        return self.straggler_policy == "cancel"

    def check_scheme(self, scheme) -> None:
        """The checks that need the built scheme (``straggler_policy="cancel"``'s limits)."""
        if not self.cancel:
            return
        if scheme.late_usable:
            raise ValueError(f"straggler_policy='cancel' drops late messages, but "
                             f"{scheme.name} uses them (staleness table)")
        if self.replay_arrivals:
            raise ValueError("replay_arrivals replays a schedule in which every rank "
                             "computes given steps; use straggler_policy='continue'")

    def replay_steps(self, rank: int) -> list:
        """The steps ``rank`` computes in the replayed schedule, in order (it skips the others,
        as in the run the order came from)."""
        return sorted({k for w, k in self.replay_arrivals or () if w == rank})

    def wire(self) -> Optional[torch.dtype]:
        return None if self.wire_dtype is None else getattr(torch, self.wire_dtype)

    def effective_optimistic(self, codec, device, n: int) -> bool:
        """``optimistic``, or by default: small payloads ride with the control rows
        (:func:`pgc_hvd.compress.optimistic_default`: CPU rows, n of them at most
        ``PGC_HVD_OPTIMISTIC_BYTES``), with ``control="allgather"`` only."""
        if self.optimistic is not None:
            return bool(self.optimistic)
        from pgc_hvd.compress import optimistic_default
        return self.control == "allgather" and optimistic_default(
            codec.payload_bytes, torch.device(device).type == "cpu", n)


def cross_rank_fields(config: RuntimeConfig) -> dict:
    """The configuration fields every rank compares at construction
    (:func:`pgc_hvd.runtime.consistency.optimizer_fingerprint`'s keywords; it adds the
    optimizer class, its hyper-parameters and the parameters). The effective optimistic
    setting follows from the payload size (the same on every rank once the rest agrees) and
    PGC_HVD_OPTIMISTIC_BYTES (per rank), so an unset one is compared as that rule."""
    from pgc_hvd.compress.transport import optimistic_threshold
    optimistic_field = (bool(config.optimistic) if config.optimistic is not None else
                        f"by payload size (n payloads at most {optimistic_threshold()} bytes, "
                        f"PGC_HVD_OPTIMISTIC_BYTES)")
    return {"scheme": str(config.scheme), "stragglers": int(config.stragglers),
            "options": config.scheme_options, "compression": config.compression,
            "control": config.control, "name": config.name, "optimistic": optimistic_field,
            "replay": config.replay_arrivals,
            "extra": {"wire dtype": config.wire_dtype or "float32",
                      "op (update factor)": config.op_scale,
                      "backward_passes_per_step": config.backward_passes_per_step,
                      "metrics (names)": list(config.metrics),
                      "momentum_correction": config.momentum_correction}}


def check_parameters(params, names: dict) -> None:
    """Parameters must be real floating point. fp16, bf16 and fp64 parameters work: the ring,
    the coded messages and the decoded update are fp32 (the kernels' dtype; gradients are
    added into the fp32 ring slots as they arrive), and the update is cast to each
    parameter's dtype when it is applied (:mod:`pgc_hvd.runtime.updates`), so an fp64 gradient
    is rounded to fp32 on its way, an fp16/bf16 one is not rounded further. Complex parameters
    have no fp32 ring form: refused here, before any collective."""
    bad = [(i, p.dtype) for i, p in enumerate(params) if not p.dtype.is_floating_point]
    if bad:
        which = ", ".join(f"{names.get(id(params[i]), f'#{i}')} "
                          f"({str(dt).replace('torch.', '')})" for i, dt in bad[:5])
        raise TypeError(f"pgc_hvd.DistributedOptimizer: parameters {which} are not real "
                        f"floating point; the ring and messages are fp32 vectors. Use "
                        f"float32, float16, bfloat16 or float64 parameters (e.g. keep real "
                        f"and imaginary parts as two real parameters)")


def parameter_names(params, named_parameters) -> dict:
    """``{id(p): name}`` from ``named_parameters`` (checked to name every trainable parameter
    of the optimizer); ``{}`` when it is None."""
    if named_parameters is None:
        return {}
    named = list(named_parameters)
    ids = {id(p) for _, p in named}
    missing = [i for i, p in enumerate(params) if id(p) not in ids and p.requires_grad]
    if missing:
        raise ValueError(f"named_parameters does not name {len(missing)} of the "
                         f"optimizer's parameters (indices {missing[:5]})")
    return {id(p): nm for nm, p in named}


def metric_values(names: tuple, metrics) -> tuple:
    """``step(metrics={name: value})`` as the k floats of the control row (NaN for a name not
    given); unknown names or non-numbers are refused."""
    if metrics is None:
        return (math.nan,) * len(names) if names else ()
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict {{name: float}}, got {metrics!r}")
    unknown = sorted(set(metrics) - set(names))
    if unknown:
        raise ValueError(f"step(metrics=...) names {unknown}, not declared: pass "
                         f"metrics={sorted(set(names) | set(unknown))} to "
                         f"DistributedOptimizer (the control rows are sized for them)")
    try:
        return tuple(float(metrics.get(k, math.nan)) for k in names)
    except (TypeError, ValueError):
        raise TypeError(f"metrics values must be numbers, got {metrics!r}") from None


# -- Horovod's keywords --------------------------------------------------------------------
def from_horovod(hvd, *, compression, backward_passes_per_step, op, gradient_predivide_factor,
                 num_groups, groups, sparse_as_dense, process_set, metrics) -> dict:
    """The :class:`RuntimeConfig` fields that Horovod's keywords map to: ``compression`` and
    ``wire_dtype`` (:func:`horovod_compression`), ``op_scale`` (:func:`horovod_op`),
    ``backward_passes_per_step`` and ``metrics`` (checked); the fusion and sparse keywords are
    checked and otherwise accepted (:func:`horovod_fusion_options`)."""
    compression, wire_dtype = horovod_compression(compression)
    op_scale = horovod_op(hvd, op, gradient_predivide_factor)
    horovod_fusion_options(hvd, backward_passes_per_step, num_groups, groups, sparse_as_dense,
                           process_set)
    return {"compression": compression, "wire_dtype": wire_dtype, "op_scale": op_scale,
            "backward_passes_per_step": int(backward_passes_per_step),
            "metrics": metric_names(metrics)}


def metric_names(metrics) -> tuple:
    if isinstance(metrics, str) or not all(isinstance(m, str) and m for m in metrics):
        raise TypeError(f"metrics must be a list of metric names (str), e.g. ['accuracy'], got "
                        f"{metrics!r}")
    if len(set(metrics)) != len(tuple(metrics)) or set(RESERVED_METRICS) & set(metrics):
        raise ValueError(f"metrics {list(metrics)}: names must be distinct and not 'step', "
                         f"'loss' or 'ranks'")
    return tuple(metrics)


def horovod_compression(compression):
    """``(compression, wire dtype name)``: Horovod's ``hvd.Compression.none`` -> dense fp32,
    ``hvd.Compression.fp16`` -> dense messages with a float16 wire format
    (:func:`pgc_hvd.compress.from_horovod`); pgc_hvd's :class:`TopK` as it is (fp32 values);
    anything else is refused naming what works."""
    if compression is None or isinstance(compression, TopK):
        return compression, None
    from pgc_hvd.compress import from_horovod as wire_of
    wire = wire_of(compression)
    return None, (None if wire == torch.float32 else str(wire).replace("torch.", ""))


def horovod_op(hvd, op, predivide) -> float:
    """The factor applied to the decoded (average) update for Horovod's ``op``."""
    if isinstance(predivide, bool) or not isinstance(predivide, (int, float)) or \
            not math.isfinite(predivide) or predivide <= 0:
        raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got "
                         f"{predivide!r}")
    names = {getattr(hvd, k, object()): k for k in ("Average", "Sum", "Adasum")}
    name = "Average" if op is None else names.get(op)
    if name is None:
        raise ValueError(f"op must be hvd.Average or hvd.Sum, got {op!r}")
    if predivide != 1.0 and name != "Average":
        raise ValueError("gradient_predivide_factor != 1.0 needs op=hvd.Average (as in Horovod)")
    if name == "Adasum":
        raise ValueError(
            "op=hvd.Adasum is refused: Adasum combines every rank's gradient by pairwise "
            "projections, while gradient coding decodes the average from the n - s fastest "
            "ranks' coded messages and never has every gradient. Use op=hvd.Average (default)")
    return float(hvd.size()) if name == "Sum" else 1.0


def horovod_fusion_options(hvd, passes, num_groups, groups, sparse_as_dense, process_set):
    """Type checks of Horovod's fusion and sparse keywords (accepted, see DistributedOptimizer)."""
    if isinstance(passes, bool) or not is_count(passes):
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    if groups is not None and not isinstance(groups, (int, list, tuple)):
        raise ValueError(f"groups must be None, an int or a list of parameter lists, got "
                         f"{groups!r}")
    if not isinstance(sparse_as_dense, bool):
        raise ValueError(f"sparse_as_dense must be a bool, got {sparse_as_dense!r}")
    if process_set is not None and process_set is not getattr(hvd, "global_process_set", None):
        raise ValueError("process_set: pgc_hvd runs the scheme over every rank "
                         "(n = hvd.size()); a process set other than the global one is "
                         "refused -- run one optimizer per job")
