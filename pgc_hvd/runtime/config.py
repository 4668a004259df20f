"""The optimizer's configuration: Horovod's keywords mapped, every default, every local check.

Owns :class:`RuntimeConfig` (the arguments of :func:`pgc_hvd.DistributedOptimizer` in one frozen
object), the mapping of Horovod's keywords (``compression=hvd.Compression.fp16`` to a typed
top-kappa setting and wire dtype, :func:`wire_format`; ``op=hvd.Sum``, the fusion options),
the keywords renamed, whose old spelling still works with a warning (:func:`renamed_keyword`:
``delays=`` is ``delay=``, the simulator's and the CLIs' name), every default (the straggler
budget's is the scheme's,
:meth:`pgc_hvd.schemes.protocol.Scheme.default_stragglers`, written once, below both engines)
and every check that needs no collective, each once and before any collective, each error
naming the argument and the fix; :meth:`RuntimeConfig.checked` returns the typed values the
encoder and codecs trust, and :meth:`RuntimeConfig.build_scheme` builds the scheme they name
(its construction is the one check of the straggler budget s), with the checks that need it. It also lists the fields every rank compares at construction
(:func:`cross_rank_fields`; the comparison itself is :mod:`pgc_hvd.runtime.consistency`'s).

Thread: the training thread, at construction and at a re-plan (the wiring's ``build_scheme``,
``rows_in_sum``); frozen, read-only after. (Module state: the renames already warned of.)
May import: ``options``, ``delays``, ``compress``, ``schemes``, ``control`` (layers below
the runtime) and torch; nothing of the runtime.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch

from pgc_hvd.compress import WIRE_DTYPES, TopK
from pgc_hvd.control.progress_model import POLICIES  # straggler_policy's values
from pgc_hvd.options import is_count
from pgc_hvd.schemes import default_stragglers, get_scheme, scheme_class

log = logging.getLogger("pgc_hvd.runtime")

#: ``control`` values (how control rows move: :mod:`pgc_hvd.runtime.channel`)
CONTROLS = ("allgather", "store", "log")
#: the default control plane: the ordered log, which does not poll, so pgc_hvd issues the same
#: Horovod ops on every rank whatever the arrival order (the user's unnamed collectives keep
#: matching; docs/architecture.md "The control plane and the user's collectives")
DEFAULT_CONTROL = "log"
#: the staleness cost lambda of the runtime's rule (progress per step 1 / (1 + lambda s) at
#: ring depth s, pgc_hvd.control.progress_model): measured on the runtime's own workload (the
#: time-to-accuracy benchmark's digits CNN, SGD momentum 0.9, the default remedy; fixed s = 0..3
#: with no stragglers, `benchmarks/tta/staleness_cost.py`, docs/figures/
#: runtime_staleness_cost.json; docs/control.md, "The staleness cost in the runtime"), where
#: deep rings cost steps; the simulator keeps progress_model.DEFAULT_STALENESS_COST (MNIST-1D:
#: no measurable cost)
RUNTIME_STALENESS_COST = 0.05
#: ``stragglers="auto"`` (:mod:`pgc_hvd.runtime.auto_s`): the runtime's defaults for the rule's
#: options the user did not set (a switch costs the runtime a barrier and a new control
#: channel, so boundaries are sparser than the simulator's); the others are AutoConfig's.
#: s starts at 0 (Horovod's and DDP's step: no redundancy until the delays show it pays); s is raised
#: to the smallest s predicted within min_gain of the best (the model misses costs of
#: redundancy the runtime has: docs/control.md, "s chosen online"); before the first regular
#: boundary every step is an early one, where a switch needs a predicted gain > early_gain
#: (100%: twice as fast), so a persistently slow rank is left out after one step while the
#: noise of a few samples cannot move s; the staleness cost is the runtime workload's,
#: :data:`RUNTIME_STALENESS_COST`
AUTO_DEFAULTS = {"every": 20, "first": 10, "cooldown": 20, "s_start": 0, "raise_to": "smallest",
                 "early_gain": 1.0, "staleness_cost": RUNTIME_STALENESS_COST}
#: names ``step(metrics=...)`` may not use (:attr:`DistributedOptimizer.metrics` has them)
RESERVED_METRICS = ("step", "loss", "ranks")
#: keywords of :func:`pgc_hvd.DistributedOptimizer` renamed: old name -> its one name now
RENAMED_KEYWORDS = {"delays": "delay"}
#: the old names this process has warned about (:func:`renamed_keyword` warns once for each)
WARNED_RENAMES: set = set()


def renamed_keyword(old: str, old_value, value, warned: set = WARNED_RENAMES):
    """The value of the keyword :data:`RENAMED_KEYWORDS` names ``old``'s new name: ``value``,
    or ``old_value`` given under the old name (None: not given), with a FutureWarning naming
    the fix the first time ``old`` is used (once a process: ``warned``). Both given: TypeError.
    The one place an old spelling is read (``pgc_hvd.DistributedOptimizer``; the DDP door and
    the Lightning strategy hand it their keywords)."""
    new = RENAMED_KEYWORDS[old]
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"{new}= and {old}= (its old name) are both given: pass {new}= only")
    if old not in warned:
        warned.add(old)
        warnings.warn(f"pgc_hvd: {old}= is now {new}= (one name with the simulator's {new}= "
                      f"and the CLIs' --{new}); pass {new}=... instead ({old}= still works)",
                      FutureWarning, stacklevel=3)
    return old_value


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


def _check_arguments(n: int, *, delay, records, timeout, poll_interval,
                     on_record, on_update, replay_arrivals, optimistic):
    """Type and range checks of the arguments that need nothing but n, before any collective,
    each error naming the argument. Returns delay as a DelayModel or None (a delay spec
    string, ``"exp:mean=0.1,seed=1"``, parsed as the simulator's ``--delay``)."""
    from pgc_hvd.delays import check_workers, parse_delay

    if optimistic is not None and not isinstance(optimistic, bool):
        raise TypeError(f"optimistic must be None (by message size), True or False, got "
                        f"{optimistic!r}")
    if isinstance(delay, str):
        delay = parse_delay(delay)
    if delay is not None and not callable(getattr(delay, "sample", None)):
        raise TypeError(f"delay must be None, a delay model (DelayModel, or any object with "
                        f"sample(worker, step) -> seconds) or a spec string such as "
                        f"'exp:mean=0.1,seed=1', got {delay!r}")
    if delay is not None:
        check_workers(delay, n)
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
    return delay


def wire_format(compression, wire_dtype: Optional[torch.dtype] = None
                ) -> tuple[Optional[TopK], torch.dtype]:
    """The ``compression`` keyword as ``(top-kappa setting or None, wire dtype)``, the typed
    pair the encoder and codecs take as it is:

    * None -> dense fp32 messages; :class:`~pgc_hvd.compress.TopK` -> top-kappa messages;
    * Horovod's ``hvd.Compression.none`` / ``hvd.Compression.fp16`` (or ``pgc_hvd.torch``'s
      names for them) -> dense messages on an fp32 / fp16 wire (:func:`horovod_wire_dtype`).

    ``wire_dtype`` (None: fp32 unless the compression says fp16) may ask for fp16 values with
    ``TopK``; anything else, or a Horovod compression that says another dtype, is refused."""
    if compression is None or isinstance(compression, TopK):
        topk, wire = compression, torch.float32 if wire_dtype is None else wire_dtype
    else:
        topk, wire = None, horovod_wire_dtype(compression)
        if wire_dtype is not None and wire_dtype != wire:
            raise ValueError(f"compression={compression!r} sends {wire} messages, but "
                             f"wire_dtype={wire_dtype!r} was also given: give one of them")
    if wire not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be torch.float32 (default) or torch.float16 (fp16 "
                         f"messages, as hvd.Compression.fp16), got {wire!r}")
    return topk, wire


def horovod_wire_dtype(compression) -> torch.dtype:
    """The wire dtype of one of Horovod's compression settings:

    * ``hvd.Compression.none`` (``horovod.torch.compression.NoneCompressor``) or None ->
      ``torch.float32``;
    * ``hvd.Compression.fp16`` (``FP16Compressor``) -> ``torch.float16``
      (:class:`~pgc_hvd.compress.Fp16Codec`: 2d + 4 bytes per payload row, the allreduce in
      fp16);
    * ``pgc_hvd.torch.Compression.none`` / ``.fp16``: the same, without Horovod.

    Anything else raises TypeError naming what works (Horovod's own compressors work on a
    tensor per collective; pgc_hvd codes messages and sparsifies them with its own
    :class:`~pgc_hvd.compress.TopK`). Horovod is imported only here, only when needed."""
    if compression is None:
        return torch.float32
    wire = getattr(compression, "pgc_wire_dtype", None)    # pgc_hvd.torch.Compression.*
    if wire in ("float32", "float16"):
        return getattr(torch, wire)
    works = ("use None or hvd.Compression.none (fp32 messages) or hvd.Compression.fp16 (fp16 "
             "messages, half the bytes); for sparsification use pgc_hvd's own "
             "compression=pgc_hvd.compress.TopK(ratio) (top-kappa with error feedback)")
    try:
        from horovod.torch.compression import FP16Compressor, NoneCompressor
    except ImportError as err:
        raise TypeError(f"compression={compression!r} is not pgc_hvd's, and horovod.torch "
                        f"cannot be imported to read it as Horovod's ({err}): {works}") from None

    def is_(cls) -> bool:
        return compression is cls or isinstance(compression, cls) or (
            isinstance(compression, type) and issubclass(compression, cls))

    if is_(FP16Compressor):      # checked first: a subclass of neither is refused below
        return torch.float16
    if is_(NoneCompressor):
        return torch.float32
    raise TypeError(f"compression={compression!r} is not supported by pgc_hvd: {works}")


@dataclass(frozen=True)
class RuntimeConfig:
    """The keyword arguments of :func:`DistributedOptimizer` (its docstring says what each
    means), in one object. :meth:`checked` validates them for a world of n ranks before any
    collective and returns the config the optimizer is built from, whose fields are typed and
    trusted from there on: ``stragglers`` resolved (the scheme's default, or auto's start; a
    given s is checked once, by :meth:`build_scheme`, which the optimizer asks next, still
    before any collective),
    ``compression`` a :class:`~pgc_hvd.compress.TopK` or None and ``wire_dtype`` a torch
    dtype (Horovod's ``compression`` keyword mapped, :func:`wire_format`), ``delay`` a delay
    model or None, the replayed arrivals as int pairs."""

    scheme: str = "pgc-cr"
    stragglers: Any = None     # None: the scheme's default; an int; "auto" (checked: an int)
    compression: Any = None              # checked: TopK or None (Horovod's mapped)
    delay: Any = None                    # checked: a delay model or None
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
    wire_dtype: Optional[torch.dtype] = None   # checked: torch.float32, or float16 (fp16 wire)
    metrics: tuple = ()                  # names of the user metrics step(metrics=) carries
    momentum_correction: bool = True     # pgc_hvd.control.momentum (stale gradients' momentum)
    overlap: Optional[bool] = None       # the data collective overlapped with backward
                                         # (None: on GPU parameters, off on the CPU)
    bucket_cap_mb: float = 25.0          # its buckets' size (DDP's name and default)
    #: stragglers="auto": the rule's options (a dict of pgc_hvd.control.auto_s.AutoConfig
    #: fields); checked: the AutoConfig with s_start and s_max resolved, None for a fixed s
    auto: Any = None

    def checked(self, n: int) -> "RuntimeConfig":
        """This config checked for n ranks, with typed fields (class doc); TypeError or
        ValueError naming the argument and the fix. ``stragglers`` None is the scheme's
        default (:meth:`~pgc_hvd.schemes.protocol.Scheme.default_stragglers`); one rank (n =
        1, e.g. ``python train.py`` to debug) has no straggler to tolerate, so the default is
        then s = 0, and a warning says so (once per optimizer); a given s is checked by the
        scheme's construction (:meth:`build_scheme`: an explicit ``stragglers`` >= 1 on one
        rank is refused there like any s > n - 1, with the fix). Checking a checked config
        changes nothing.
        ``stragglers="auto"``: s starts at the rule's ``s_start``, and ``auto`` becomes the
        checked rule settings (:func:`auto_setting`: ``s_max > n - 1`` is refused here, with
        the fix)."""
        auto, stragglers = auto_setting(self.stragglers, self.auto, self.scheme, n)
        # s resolved here, checked once: auto's range by auto_setting, a given s by the
        # scheme's construction (build_scheme, the one checker: Scheme.check_stragglers)
        s = scheme_class(self.scheme).default_stragglers(n) if stragglers is None else stragglers
        compression, wire_dtype = wire_format(self.compression, self.wire_dtype)
        delay = _check_arguments(
            n, delay=self.delay, records=self.records,
            timeout=self.timeout, poll_interval=self.poll_interval, on_record=self.on_record,
            on_update=self.on_update, replay_arrivals=self.replay_arrivals,
            optimistic=self.optimistic)
        if self.control not in CONTROLS:
            raise ValueError(f"control must be 'allgather', 'store' or 'log', "
                             f"got {self.control!r}")
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise TypeError(f"overlap must be None (default: on for GPU parameters, off on the "
                            f"CPU), True (the data collective overlapped with backward) or "
                            f"False, got {self.overlap!r}")
        cap = self.bucket_cap_mb
        if not (isinstance(cap, (int, float)) and not isinstance(cap, bool)
                and math.isfinite(cap) and cap > 0):
            raise ValueError(f"bucket_cap_mb must be a size in MiB > 0 (default 25, as DDP's), "
                             f"got {cap!r}")
        if self.straggler_policy not in POLICIES:
            raise ValueError(f"straggler_policy must be 'continue' or 'cancel', "
                             f"got {self.straggler_policy!r}")
        replay = ([(int(w), int(k)) for w, k in self.replay_arrivals]
                  if self.replay_arrivals else None)
        from pgc_hvd.control.momentum import parse_momentum_correction
        correction = parse_momentum_correction(self.momentum_correction)
        if self.stragglers is None and s < default_stragglers(self.scheme):
            # one rank (python train.py, to debug) has no straggler to tolerate: say so, once
            log.warning("pgc_hvd: %s runs with s = 0 stragglers on %d rank (the default s = %d "
                        "needs n >= 2 ranks); pass stragglers=0 to say so, or start more ranks",
                        self.scheme, n, default_stragglers(self.scheme))
        return dataclasses.replace(self, stragglers=s, auto=auto, compression=compression,
                                   wire_dtype=wire_dtype, delay=delay, name=str(self.name),
                                   momentum_correction=correction,
                                   scheme_options=dict(self.scheme_options or {}),
                                   timeout=float(self.timeout), replay_arrivals=replay,
                                   bucket_cap_mb=float(cap))

    def overlaps(self, scheme, codec, *, optimistic: bool, complex_code: bool,
                 device=None) -> bool:
        """Whether the data collective moves bucket by bucket, overlapped with backward
        (:mod:`pgc_hvd.runtime.overlap`): ``overlap`` and dense fp32 rows summed by an
        allreduce (no top-kappa, no fp16 wire, no payload riding with the control rows), a
        scheme that uses each step's own messages only (not bounded staleness's table) with
        real coefficients, no declared user metrics (a step's values must ride with its own
        message), and no replayed schedule or ``straggler_policy="cancel"``. The same on every
        rank (these fields are compared at construction). ``overlap=None`` (default): on when
        the parameters live on a GPU (``device``), off on the CPU, where the agent thread's
        bucket sums compete with the backward for the cores and the interpreter and measured
        no gain on 2 cores (docs/benchmarks.md, "The overlap")."""
        want = (self.overlap if self.overlap is not None
                else device is not None and torch.device(device).type == "cuda")
        return (want and not self.metrics and not codec.sparse
                and codec.wire_dtype == torch.float32
                and not optimistic and not scheme.late_usable and not self.cancel
                and not self.replay_arrivals and not complex_code)

    def rows_in_sum(self, scheme, codec, *, optimistic: bool, complex_code: bool) -> bool:
        """Whether a step needs no control round (:mod:`pgc_hvd.runtime.sum_rows`, the s = 0
        path): the scheme waits for every rank and its decision is known before any row
        (:meth:`~pgc_hvd.schemes.protocol.Scheme.full_round_weights`: dgd, any scheme with
        s = 0, where ``stragglers="auto"`` starts), on the default control plane (whose store
        names a dead or hung rank), with dense fp32 messages summed by one allreduce (not
        top-kappa, not the fp16 wire, no payload riding with the rows, real coefficients) and
        no replayed arrivals. The same on every rank (it follows from fields compared at
        construction); a re-plan to s >= 1 builds an agent on the control plane, and back."""
        return (self.control == "log" and not optimistic and not codec.sparse
                and codec.wire_dtype == torch.float32 and not complex_code
                and not self.replay_arrivals and scheme.full_round_weights() is not None)

    @property
    def cancel(self) -> bool:
        """``straggler_policy="cancel"``."""
        return self.straggler_policy == "cancel"

    def build_scheme(self, n: int, param_groups):
        """The scheme this checked config names for n ranks, with the momentum remedy's options
        (:func:`pgc_hvd.control.momentum.remedy_scheme_options`, from the optimizer's
        ``param_groups``). Its construction is the one check of the straggler budget s
        (:meth:`~pgc_hvd.schemes.protocol.Scheme.check_stragglers`: an int in [0, n - 1], 0
        for dgd, each error naming the fix); then :meth:`check_scheme`. The optimizer asks it
        right after :meth:`checked`, before any collective, and at each re-plan of
        ``stragglers="auto"`` (:func:`pgc_hvd.runtime.wiring.build_parts`)."""
        from pgc_hvd.control.momentum import remedy_scheme_options
        scheme = get_scheme(self.scheme, n, self.stragglers,
                            **remedy_scheme_options(self.scheme, self.scheme_options,
                                                    param_groups, self.momentum_correction))
        self.check_scheme(scheme)
        return scheme

    def check_scheme(self, scheme) -> None:
        """The checks that need the built scheme: the minimum-error decoder's need of
        compressed messages (:meth:`~pgc_hvd.schemes.protocol.Scheme.check_error_norms`) and
        ``straggler_policy="cancel"``'s limits."""
        scheme.check_error_norms(self.compression is not None,
                                 "pass compression=pgc_hvd.compress.TopK(...), or use "
                                 "decoder='n-s' for dense messages")
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

    def effective_optimistic(self, codec, device, n: int) -> bool:
        """``optimistic``, or by default: small payloads ride with the control rows
        (:func:`pgc_hvd.compress.optimistic_default`: CPU rows, n of them at most
        ``PGC_HVD_OPTIMISTIC_BYTES``), with ``control="allgather"`` only."""
        if self.optimistic is not None:
            return bool(self.optimistic)
        from pgc_hvd.compress import optimistic_default
        return self.control == "allgather" and optimistic_default(
            codec.payload_bytes, torch.device(device).type == "cpu", n)


def auto_setting(stragglers, options, scheme: str, n: int) -> tuple:
    """``(auto, stragglers)`` checked for n ranks: ``stragglers="auto"`` gives the rule's
    settings (:class:`pgc_hvd.control.auto_s.AutoConfig` from ``options`` over
    :data:`AUTO_DEFAULTS`, with s_start and s_max resolved) and s_start; a fixed budget gives
    ``(None, stragglers)`` and refuses auto options. ValueError naming the fix before any
    collective: ``s_max > n - 1``, ``s_start`` outside [0, s_max], a scheme that waits for
    every rank, fewer than 2 ranks, unknown options."""
    from pgc_hvd.control.auto_s import AutoConfig
    if isinstance(stragglers, str):
        if stragglers != "auto":
            raise TypeError(f"stragglers must be an int >= 0, None (the scheme's default) or "
                             f"'auto' (chosen while training), got {stragglers!r}")
        if options is not None and not isinstance(options, (dict, AutoConfig)):
            raise TypeError(f"auto must be a dict of stragglers='auto' options (e.g. "
                            f"{{'s_max': 2, 'every': 20}}), got {options!r}")
        if isinstance(options, AutoConfig):
            cfg = options
        else:
            cfg = AutoConfig.from_options({**AUTO_DEFAULTS, **dict(options or {})})
        s0, s_max = cfg.budget_range(scheme, n)
        return dataclasses.replace(cfg, s_start=s0, s_max=s_max), s0
    if isinstance(options, AutoConfig):     # a checked auto config, checked again
        s0, s_max = options.budget_range(scheme, n)
        if stragglers is not None and not 0 <= int(stragglers) <= s_max:
            raise ValueError(f"stragglers = {stragglers} lies outside the auto range [0, "
                             f"s_max = {s_max}]")
        return options, stragglers
    if options is not None:
        raise ValueError(f"auto={options!r} sets options of stragglers='auto'; pass "
                         f"stragglers='auto' with it, or drop auto for a fixed budget")
    return None, stragglers


def cross_rank_fields(config: RuntimeConfig) -> dict:
    """The configuration fields every rank compares at construction
    (:func:`pgc_hvd.runtime.consistency.optimizer_fingerprint`'s keywords; it adds the
    optimizer class, its hyper-parameters and the parameters). The effective optimistic
    setting follows from the payload size (the same on every rank once the rest agrees) and
    PGC_HVD_OPTIMISTIC_BYTES (per rank), so an unset one is compared as that rule."""
    from pgc_hvd.compress.codecs import optimistic_threshold
    optimistic_field = (bool(config.optimistic) if config.optimistic is not None else
                        f"by payload size (n payloads at most {optimistic_threshold()} bytes, "
                        f"PGC_HVD_OPTIMISTIC_BYTES)")
    return {"scheme": str(config.scheme), "stragglers": int(config.stragglers),
            "options": config.scheme_options, "compression": config.compression,
            "control": config.control, "name": config.name, "optimistic": optimistic_field,
            "replay": config.replay_arrivals,
            "extra": {"wire dtype": str(config.wire_dtype).replace("torch.", ""),
                      "overlap": config.overlap, "bucket_cap_mb": config.bucket_cap_mb,
                      "op (update factor)": config.op_scale,
                      "backward_passes_per_step": config.backward_passes_per_step,
                      "metrics (names)": list(config.metrics),
                      "momentum_correction": config.momentum_correction,
                      "auto (stragglers='auto' options)": (
                          None if config.auto is None else dataclasses.asdict(config.auto))}}


def check_parameters(params, names: dict) -> None:
    """Parameters must be real floating point. fp16, bf16 and fp64 parameters work: the ring,
    the coded messages and the decoded update are fp32 (the kernels' dtype; gradients are
    added into the fp32 ring slots as they arrive), and the update is cast to each
    parameter's dtype when it is applied (:mod:`pgc_hvd.runtime.step`), so an fp64 gradient
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


# -- Horovod's keywords --------------------------------------------------------------------
def from_horovod(hvd, *, backward_passes_per_step, op, gradient_predivide_factor, num_groups,
                 groups, sparse_as_dense, process_set, metrics) -> dict:
    """The :class:`RuntimeConfig` fields that Horovod's keywords map to: ``op_scale``
    (:func:`horovod_op`), ``backward_passes_per_step`` and ``metrics`` (checked); the fusion
    and sparse keywords are checked and otherwise accepted (:func:`horovod_fusion_options`).
    ``compression`` is mapped by :meth:`RuntimeConfig.checked` (:func:`wire_format`)."""
    op_scale = horovod_op(hvd, op, gradient_predivide_factor)
    horovod_fusion_options(hvd, backward_passes_per_step, num_groups, groups, sparse_as_dense,
                           process_set)
    return {"op_scale": op_scale, "backward_passes_per_step": int(backward_passes_per_step),
            "metrics": metric_names(metrics)}


def metric_names(metrics) -> tuple:
    if isinstance(metrics, str) or not all(isinstance(m, str) and m for m in metrics):
        raise TypeError(f"metrics must be a list of metric names (str), e.g. ['accuracy'], got "
                        f"{metrics!r}")
    if len(set(metrics)) != len(tuple(metrics)) or set(RESERVED_METRICS) & set(metrics):
        raise ValueError(f"metrics {list(metrics)}: names must be distinct and not 'step', "
                         f"'loss' or 'ranks'")
    return tuple(metrics)


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
