"""Time to a target validation accuracy of the user's own loop: ``hvd.DistributedOptimizer``
against pgc_hvd on one model, one data split, one initialisation and one delay schedule.

Runs on every rank under ``horovodrun`` (engine ``horovod``) or ``torchrun`` (engine ``torch``:
no Horovod import; the caller passes :mod:`pgc_hvd.torchdist` as ``hvd`` after
``dist.init_process_group("gloo")``); shared by ``pgc-hvd demo`` (the main job,
``launch/demo.sh``) and ``benchmarks/tta/time_to_accuracy.py`` (patterns x optimizers x seeds).

The workload is the README's quick-start pattern as a user writes it: the 3-layer CNN
(:class:`pgc_hvd.models.SmallCNN`) on scikit-learn's digits, an 80/20 stratified split, a batch
of b per rank and step (per partition for pgc_hvd: the same n b samples per step as Horovod's
``DistributedSampler`` of b per rank), and ``compute`` seconds of emulated GPU work per batch (a
sleep, which leaves the CPU free as a GPU would; the real forward/backward runs too). Rank r's
straggler delay d_{r,t} of step t (:func:`pgc_hvd.delays.parse_delay`) is slept once per step
with the first batch's compute, between its forward and its backward: a slow GPU is slow before
its gradients exist, so Horovod's hooks, which start the allreduce during the backward, wait
for it. Validation accuracy is measured every ``eval_every`` steps on every rank (the
parameters are identical, so every rank sees the same accuracy and, with ``stop_at_target``,
stops at the same step); evaluation is not timed.

A *variant* is the engine's baseline -- ``hvd`` (``hvd.DistributedOptimizer`` with its usual
DataLoader + ``DistributedSampler`` loop; engine ``horovod``) or ``ddp`` (torch's own
``torch.nn.parallel.DistributedDataParallel`` with the same loop; engine ``torch``) -- or a
pgc_hvd scheme name with its defaults (``pgc-cr``, ``bcgc``, ``dgd``, ...), ``NAME:off`` with
``momentum_correction=False``, ``NAME:cancel`` with ``straggler_policy="cancel"``,
``NAME:s=N`` / ``NAME:s=auto`` with that straggler budget (``stragglers=``; ``auto``: chosen
while it trains), ``NAME:KEY=VALUE`` with a scheme option (``pgc-cr:decay=0.5``; flags chain:
``pgc-cr:off:decay=0.5``, ``pgc-cr:s=auto``). A scheme runs through pgc_hvd's ``DistributedOptimizer`` +
``CodedLoader`` under Horovod (:class:`_PgcLoop`), through the DDP door under torchrun
(:class:`_DoorLoop`: ``pgc_hvd.DistributedDataParallel`` + ``pgc_hvd.CodedSampler`` +
``model.distributed_optimizer(...)``, the user's DDP loop kept). The door's batch holds every
partition of the rank's step in one forward (B = b x ``loop_width`` rows, b per partition as
above), so its emulated compute is ``loop_width`` x compute, once per step; a rank catching up
(its step decided without it) computes nothing and sleeps nothing, as in :class:`_PgcLoop`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

#: the user's optimizers by name, with their default learning rates (SGD's momentum: 0.9)
DEFAULT_LR = {"sgd": 0.05, "adam": 3e-3}
OPTIMIZERS = tuple(DEFAULT_LR)
#: the engines and their baseline variant (the lockstep data-parallel loop users run there)
ENGINES = ("horovod", "torch")
BASELINES = {"horovod": "hvd", "torch": "ddp"}


@dataclasses.dataclass
class Trial:
    """What every variant of one comparison shares (module doc): the user's optimizer
    (``lr`` None: :data:`DEFAULT_LR`; ``momentum`` None: 0.9, SGD only), the seed of the
    initialisation and the data order, seconds of emulated compute per batch, the delay spec
    (None: no injected delay), the batch per rank (partition), the steps, the evaluation
    cadence and the target accuracy; ``stop_at_target``: end a run at the first evaluation that
    reaches the target (else run every step)."""

    optimizer: str = "sgd"
    lr: Optional[float] = None
    momentum: Optional[float] = None
    seed: int = 0
    compute: float = 0.1
    delay: Optional[str] = None
    batch_size: int = 16
    steps: int = 300
    eval_every: int = 5
    target: float = 0.95
    stop_at_target: bool = True

    def describe(self) -> str:
        """The optimizer as the user wrote it, e.g. ``SGD lr 0.05 momentum 0.9``."""
        lr = DEFAULT_LR[self.optimizer] if self.lr is None else self.lr
        if self.optimizer == "adam":
            return f"Adam lr {lr:g}"
        return f"SGD lr {lr:g} momentum {0.9 if self.momentum is None else self.momentum:g}"


def delay_spec(pattern: str, n: int, compute: float, seed: int,
               steps: int = 300) -> Optional[str]:
    """Named straggler pattern ``pattern`` (:data:`pgc_hvd.delays.PATTERNS`, or an alias such
    as ``slow``) for ``n`` ranks, ``compute`` seconds a batch and a run of about ``steps`` steps,
    as a delay spec (:func:`pgc_hvd.delays.pattern_spec`), or None for ``none``. The delays'
    seed is the trial's seed + 1: a trial of seed 0 draws ``exp:mean=COMPUTE,seed=1`` and slows
    rank 1 under ``slow``, as the recorded figures of seed 0 were measured."""
    from pgc_hvd.delays import pattern_spec
    spec = pattern_spec(pattern, n, compute, steps, seed=seed + 1)
    return None if spec == "none" else spec


def make_optimizer(name: str, params, lr: Optional[float] = None,
                   momentum: Optional[float] = None):
    """The user's optimizer: ``sgd`` (lr 0.05, momentum 0.9 unless given) or ``adam`` (lr 3e-3
    unless given; ``momentum`` is SGD's and refused here)."""
    import torch
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    lr = DEFAULT_LR[name] if lr is None else lr
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9 if momentum is None else momentum)
    if momentum is not None:
        raise ValueError("momentum is SGD's; Adam keeps its betas (0.9, 0.999)")
    return torch.optim.Adam(params, lr=lr)


def digits_split(split_seed: int = 0):
    """Digits' 80/20 stratified split: (train TensorDataset, X_val, y_val)."""
    import torch
    from pgc_hvd.data import load_dataset, train_test_split
    tr, te = train_test_split(load_dataset("digits"), 0.2, seed=split_seed)
    return (torch.utils.data.TensorDataset(torch.from_numpy(tr.X), torch.from_numpy(tr.y)),
            torch.from_numpy(te.X), torch.from_numpy(te.y))


def accuracy(model, X, y) -> float:
    """The share of ``X`` that ``model`` classifies as ``y``."""
    import torch
    with torch.no_grad():
        return float((model(X).argmax(1) == y).float().mean())


def _emulate(compute: float, delays, rank: int, step: int, first: bool) -> None:
    """The GPU's forward/backward time (``compute``), plus this rank's straggler delay of the
    step with the step's first batch (module doc)."""
    time.sleep(compute + (float(delays.sample(rank, step)) if (delays is not None and first)
                          else 0.0))


class _EpochLoader:
    """A DataLoader over a sampler with ``set_epoch``, re-iterated each epoch as users write
    it (``sampler.set_epoch(epoch)`` before every pass)."""

    def __init__(self, loader, sampler):
        self.loader, self.sampler, self.epoch = loader, sampler, 0
        self.sampler.set_epoch(0)
        self.batches = iter(self.loader)

    def next_batch(self):
        try:
            return next(self.batches)
        except StopIteration:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.batches = iter(self.loader)
            return next(self.batches)


class _HorovodLoop:
    """Horovod's own: ``hvd.DistributedOptimizer`` fed by a DataLoader over a
    ``DistributedSampler`` (a new shuffle every epoch, as users write it)."""

    def __init__(self, hvd, model, inner, train, trial: Trial):
        import torch
        self.opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
        sampler = torch.utils.data.distributed.DistributedSampler(
            train, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=trial.seed)
        self.data = _EpochLoader(torch.utils.data.DataLoader(
            train, batch_size=trial.batch_size, sampler=sampler, drop_last=True), sampler)
        self.s = None            # waits for every rank

    def compute(self, model, loss_fn, emulate, step: int) -> None:
        self.opt.zero_grad()
        xb, yb = self.data.next_batch()
        loss = loss_fn(model(xb), yb)
        emulate(step - 1, True)
        loss.backward()          # Horovod's hooks start the allreduce here

    def close(self) -> None:
        pass


class _PgcLoop:
    """pgc_hvd's: its ``DistributedOptimizer`` (the scheme's defaults) fed by ``CodedLoader``;
    the partitions the scheme asks this rank for, each with a forward and a backward."""

    def __init__(self, model, inner, train, trial: Trial, n: int, scheme: str, flags: list,
                 name: str, **options):
        from pgc_hvd.data.coded_loader import CodedLoader
        from pgc_hvd.runtime.distributed import DistributedOptimizer
        scheme_options = dict(f.split("=", 1) for f in flags if "=" in f)
        self.opt = DistributedOptimizer(
            inner, named_parameters=model.named_parameters(), scheme=scheme, name=name,
            scheme_options=scheme_options or None, momentum_correction=("off" not in flags),
            straggler_policy="cancel" if "cancel" in flags else "continue", **options)
        self.s = self.opt.config.stragglers
        self.loader = CodedLoader(train, n=n, batch_size=trial.batch_size, seed=trial.seed)

    def compute(self, model, loss_fn, emulate, step: int) -> None:
        for i, (xb, yb) in enumerate(self.opt.batches(self.loader)):
            loss = loss_fn(model(xb), yb)
            emulate(self.opt.version, i == 0)
            loss.backward()

    def close(self) -> None:
        self.opt.close()


class _DDPLoop:
    """torch's own (engine ``torch``): ``torch.nn.parallel.DistributedDataParallel`` on the
    default process group, the user's optimizer as it is, fed by a DataLoader over a
    ``DistributedSampler`` (a new shuffle every epoch); DDP's reducer averages the gradients
    during ``backward()`` (bucket by bucket, as Horovod's hooks do)."""

    def __init__(self, model, inner, train, trial: Trial, n: int, rank: int):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        self.ddp = DDP(model)
        self.opt = inner
        sampler = torch.utils.data.distributed.DistributedSampler(
            train, num_replicas=n, rank=rank, shuffle=True, seed=trial.seed)
        self.data = _EpochLoader(torch.utils.data.DataLoader(
            train, batch_size=trial.batch_size, sampler=sampler, drop_last=True), sampler)
        self.s = None            # waits for every rank

    def compute(self, model, loss_fn, emulate, step: int) -> None:
        self.opt.zero_grad()
        xb, yb = self.data.next_batch()
        loss = loss_fn(self.ddp(xb), yb)      # through the wrapper: DDP prepares its reducer
        emulate(step - 1, True)
        loss.backward()          # DDP's reducer allreduces bucket by bucket here

    def close(self) -> None:
        pass


class _DoorLoop:
    """pgc_hvd's DDP door (engine ``torch``): ``pgc_hvd.DistributedDataParallel`` with the
    scheme's defaults, ``model.distributed_optimizer(...)`` of the user's optimizer, fed by the
    user's DataLoader over a ``pgc_hvd.CodedSampler`` -- DDP's loop with three lines changed.
    One batch of B = b x ``loop_width`` rows a step (b per partition, as :class:`_PgcLoop`'s
    batches), one forward through the wrapper, one backward; the compute (``loop_width`` x
    compute, and the step's delay) is emulated only when the rank computes at the step
    (``opt.computes`` after the forward: a rank catching up gets zeros and skips it)."""

    def __init__(self, model, inner, train, trial: Trial, scheme: str, flags: list, name: str,
                 **options):
        import torch
        from pgc_hvd.data.coded_sampler import CodedSampler
        from pgc_hvd.runtime.ddp import DistributedDataParallel
        scheme_options = dict(f.split("=", 1) for f in flags if "=" in f)
        self.ddp = DistributedDataParallel(
            model, scheme=scheme, name=name, scheme_options=scheme_options or None,
            momentum_correction=("off" not in flags),
            straggler_policy="cancel" if "cancel" in flags else "continue", **options)
        self.opt = self.ddp.distributed_optimizer(inner)
        self.s = self.opt.config.stragglers
        self.width = self.ddp.loop_width
        rows = trial.batch_size * self.width
        sampler = CodedSampler(train, batch_size=rows, seed=trial.seed).bind(self.ddp)
        self.data = _EpochLoader(torch.utils.data.DataLoader(train, batch_size=rows,
                                                             sampler=sampler), sampler)

    def compute(self, model, loss_fn, emulate, step: int) -> None:
        self.opt.zero_grad()
        xb, yb = self.data.next_batch()
        loss = loss_fn(self.ddp(xb), yb)      # begins this rank's step (the door's forward)
        if self.opt.computes:                 # False: catching up, the forward gave zeros
            emulate(self.opt.version, True, self.width)
        loss.backward()

    def close(self) -> None:
        self.opt.close()


def parse_variant(variant: str) -> tuple:
    """``NAME[:FLAG...]`` -> (scheme, flags, stragglers): ``s=N`` / ``s=auto`` is the straggler
    budget (None: the scheme's default), the other flags (``off``, ``cancel``, ``KEY=VALUE``)
    stay flags (module doc)."""
    scheme, *flags = variant.split(":")
    budget = [f.split("=", 1)[1] for f in flags if f.startswith("s=")]
    if len(budget) > 1:
        raise ValueError(f"variant {variant!r} gives s twice")
    stragglers = None
    if budget:
        if budget[0] == "auto":
            stragglers = "auto"
        elif budget[0].isdigit():
            stragglers = int(budget[0])
        else:
            raise ValueError(f"variant {variant!r}: s must be a number >= 0 or auto, "
                             f"got {budget[0]!r}")
    return scheme, [f for f in flags if not f.startswith("s=")], stragglers


def train_one(variant: str, index: int, trial: Trial, hvd, data,
              on_eval: Optional[Callable[[int, float, float], None]] = None,
              pgc_options: Optional[dict] = None, engine: str = "horovod") -> dict:
    """Train a fresh model (seeded, broadcast from rank 0) under ``variant`` (module doc) for
    ``trial``; the same delays, data and initialisation for every variant. ``hvd``: the
    engine's module for the broadcast and the closing allgathers (``horovod.torch`` under
    horovodrun; :mod:`pgc_hvd.torchdist` under torchrun, ``engine="torch"``, after
    ``dist.init_process_group("gloo")`` and ``hvd.init()``). ``data``: from
    :func:`digits_split`; ``on_eval(step, seconds, accuracy)`` after each evaluation (every
    rank); ``pgc_options``: more keyword arguments of pgc_hvd's optimizer (``records=``).

    Returns (every rank alike but ``step_times``, rank-local): ``steps`` and ``time`` to the
    target (None when not reached), ``steps_run``, ``seconds_run`` (training seconds, not
    evaluating), ``time_per_step``, ``accuracy`` (the last evaluation), ``evals`` [(step,
    seconds, accuracy)], ``step_times`` (this rank's seconds per step), ``busy`` (each rank's
    seconds from a step's start to its ``optimizer.step()``: forward, emulated compute and
    delay, backward) and ``same_params`` (one parameter digest on every rank at the end).
    """
    import torch
    import torch.nn.functional as F

    from pgc_hvd.delays import parse_delay
    from pgc_hvd.models import SmallCNN
    from pgc_hvd.runtime.consistency import tensors_digest

    train, Xte, yte = data
    rank = hvd.rank()
    torch.manual_seed(trial.seed)
    model = SmallCNN()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = make_optimizer(trial.optimizer, model.parameters(), trial.lr, trial.momentum)
    delays = parse_delay(trial.delay) if trial.delay else None
    scheme, flags, stragglers = parse_variant(variant)
    if stragglers is not None:
        pgc_options = {**(pgc_options or {}), "stragglers": stragglers}
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    other = {b for e, b in BASELINES.items() if e != engine}
    if scheme in other:
        raise ValueError(f"variant {scheme!r} is engine "
                         f"{next(e for e, b in BASELINES.items() if b == scheme)}'s baseline; "
                         f"engine {engine}'s is {BASELINES[engine]!r}")
    if scheme == "hvd":
        loop = _HorovodLoop(hvd, model, inner, train, trial)
    elif scheme == "ddp":
        loop = _DDPLoop(model, inner, train, trial, hvd.size(), rank)
    elif engine == "torch":
        loop = _DoorLoop(model, inner, train, trial, scheme, flags, f"tta{index}",
                         **(pgc_options or {}))
    else:
        loop = _PgcLoop(model, inner, train, trial, hvd.size(), scheme, flags, f"tta{index}",
                        **(pgc_options or {}))

    def emulate(step: int, first: bool, batches: int = 1) -> None:
        _emulate(batches * trial.compute, delays, rank, step, first)

    acc = accuracy(model, Xte, yte)
    evals, step_times, busy, reached, step = [(0, 0.0, acc)], [], 0.0, None, 0
    for step in range(1, trial.steps + 1):
        t0 = time.perf_counter()
        loop.compute(model, F.cross_entropy, emulate, step)
        busy += time.perf_counter() - t0
        loop.opt.step()
        step_times.append(time.perf_counter() - t0)
        if step % trial.eval_every == 0 or step == trial.steps:
            acc = accuracy(model, Xte, yte)
            evals.append((step, sum(step_times), acc))
            if on_eval is not None:
                on_eval(step, sum(step_times), acc)
            if reached is None and acc >= trial.target:
                reached = step
                if trial.stop_at_target:
                    break
    auto = getattr(loop.opt, "auto_stragglers", None)   # s=auto: its switches, before close
    auto = auto.summary() if auto is not None else None
    loop.close()
    trained = sum(step_times)
    digests = hvd.allgather(torch.tensor([tensors_digest(list(model.parameters()))],
                                         dtype=torch.int64), name=f"tta.digest{index}").tolist()
    busy_all = hvd.allgather(torch.tensor([busy], dtype=torch.float64),
                             name=f"tta.busy{index}").tolist()
    return {"variant": variant, "s": loop.s, "steps": reached,
            "time": next(s for st, s, _ in evals if st == reached) if reached else None,
            "steps_run": step, "seconds_run": trained, "time_per_step": trained / max(step, 1),
            "accuracy": acc, "evals": evals, "step_times": step_times, "busy": busy_all,
            "same_params": len(set(digests)) == 1, "auto": auto}
