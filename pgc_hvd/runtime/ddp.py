"""``pgc_hvd.DistributedDataParallel``: the DDP door. A torchrun + DDP script changes three
lines -- the wrap, the sampler, the optimizer -- and keeps its loop:

    sampler = pgc_hvd.CodedSampler(dataset, batch_size=32)                 # was DistributedSampler
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = pgc_hvd.DistributedDataParallel(model, scheme="pgc-cr", stragglers=1)   # was DDP(model)
    optimizer = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                            momentum=0.9))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()          # fires with the n - s fastest ranks
        ... validation, dist.all_reduce(val_loss) on the default group, as before

A subclass of torch's ``DistributedDataParallel``: its constructor is DDP's (the default
process group, parameters and buffers broadcast from rank 0, shapes checked across ranks;
``model.module``, ``state_dict()`` keys with ``module.``, ``isinstance(model, DDP)``,
``no_sync()`` as a context), plus the scheme and the runtime's options (keyword-only, the names
of :func:`pgc_hvd.DistributedOptimizer`). What differs is who communicates:

* **forward**: in training (``model.train()`` and grad enabled), the step of this rank's model
  version begins (:meth:`~pgc_hvd.runtime.optimizer.PGCOptimizer.begin_loop_step`); the module
  runs on the batch the :class:`~pgc_hvd.data.coded_sampler.CodedSampler` gave (checked: B
  rows), and where the step's batch holds several partitions (GC, BCGC: c = s + 1) or a
  coefficient other than 1, the gradient of each output row is scaled by its partition's
  w_j B / b (:func:`~pgc_hvd.data.coded_sampler.batch_layout`), so the one backward gives the
  coded message. A rank whose step was decided without it (it is catching up) computes
  nothing: the forward returns zeros shaped like the last output (no parameter in their graph),
  so ``backward()`` costs nothing and ``step()`` applies the decided update. DDP's reducer is
  not used (its per-bucket allreduce is the lockstep gradient coding removes): the forward calls
  ``self.module`` directly, so no collective runs on the default group during training --
  ``broadcast_buffers`` included (each rank's buffers, e.g. BatchNorm statistics, are its own
  after the construction's broadcast, as under Horovod).
* **optimizer**: :meth:`distributed_optimizer` wraps the user's optimizer as
  :func:`pgc_hvd.DistributedOptimizer` on the torch engine does, fed by the loop
  (:meth:`~pgc_hvd.runtime.optimizer.PGCOptimizer.feed_from_loop`): ``step()`` forms this
  rank's coded message from ``p.grad`` (and the ring), hands it to the agent, waits for the
  step's decision and applies the decoded update with the user's rule; every rank applies the
  same updates in the same order.

Refused at the wrap, with the fix: ``SyncBatchNorm`` (a collective inside every forward),
complex-coefficient codes (``rs``), a model on several devices (``device_ids`` of more than one
device). Limits (docs/architecture.md, "The DDP door"): the data collective overlaps the
backward pass only with ``overlap=`` on (by default on GPUs, for a gradient of several
buckets); ``clip_grad_norm_`` between ``backward()`` and ``step()`` clips this
rank's message, not the decoded update (clip that with ``synchronize()`` /
``skip_synchronize()``); a pipelined scheme's ring starts with zeros (its first c - 1 messages
hold the gradients computed so far); dropout masks and augmentations come from each rank's own
generators.

Owns :class:`DistributedDataParallel` (the wrap's checks, the forward, the rows' scaling hooks,
a catching-up rank's placeholder output, :meth:`distributed_optimizer`). Thread: the training
thread (the scaling hooks inside its ``backward()``).
May import: torch, ``data.coded_sampler``, ``runtime.distributed``, ``torchdist`` (the
engine).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import pgc_hvd.torchdist as engine
from pgc_hvd.data.coded_sampler import batch_layout, register_source

__all__ = ["DistributedDataParallel", "RUNTIME_OPTIONS"]

#: the keyword-only options of :func:`pgc_hvd.DistributedOptimizer` the wrap takes (the same
#: names); the others go to torch's DDP
RUNTIME_OPTIONS = ("scheme", "stragglers", "compression", "delay", "records", "scheme_options",
                   "timeout", "poll_interval", "on_record", "on_update", "straggler_policy",
                   "control", "name", "metrics", "momentum_correction", "op", "overlap",
                   "auto", "delays")   # delays: delay's old name (it warns)


def _scale_hook(door, output):
    return None if door is None else door.scale_rows(output)


def _first_tensor(args: tuple, kwargs: dict):
    """The first tensor of a forward's arguments (in tree order): the first argument when it
    is one, without torch's ``tree_flatten`` (it builds a recursive closure, a reference cycle,
    at every call: two a step made the garbage collector run every ~20 steps)."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    leaves, _ = tree_flatten((args, kwargs))
    for x in leaves:
        if isinstance(x, torch.Tensor):
            return x
    return None


class _TensorSpec(NamedTuple):
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


class _Placeholder:
    """The last output's structure: zeros of its shapes for a step this rank does not compute."""

    def __init__(self, output):
        if isinstance(output, torch.Tensor):    # one tensor: no tree_flatten (its cycle)
            leaves, self.spec = [output], None
        else:
            leaves, self.spec = tree_flatten(output)
        self.leaves = [_TensorSpec(x.shape, x.dtype, x.device, x.requires_grad)
                       if isinstance(x, torch.Tensor) else x for x in leaves]

    def make(self):
        out = []
        for x in self.leaves:
            if isinstance(x, _TensorSpec):
                z = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
                out.append(z.requires_grad_() if x.requires_grad and z.is_floating_point() else z)
            else:
                out.append(x)
        return out[0] if self.spec is None else tree_unflatten(out, self.spec)


def _scale_rows(output, scale: torch.Tensor, rows: int, hit: list):
    """Every tensor of ``output`` with ``rows`` rows and a gradient gets its rows' gradients
    multiplied by ``scale`` (forward values unchanged); ``hit[0]`` counts them."""
    leaves, spec = tree_flatten(output)
    out = []
    for x in leaves:
        if (isinstance(x, torch.Tensor) and x.requires_grad and x.dim() >= 1
                and x.shape[0] == rows):
            w = scale.to(device=x.device, dtype=x.dtype).view(-1, *([1] * (x.dim() - 1)))
            x = x.clone()      # a fresh node: the hook is this output's only
            x.register_hook(lambda g, w=w: g * w)
            hit[0] += 1
        out.append(x)
    return tree_unflatten(out, spec)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP constructor (positional and keyword arguments as there) plus the runtime's
    options, keyword-only, named as in :func:`pgc_hvd.DistributedOptimizer` (``scheme``,
    ``stragglers``, ``compression``, ``delay``, ``timeout``, ``control``, ...; see
    :data:`RUNTIME_OPTIONS`). Initialises the torch engine (:func:`pgc_hvd.torch.init`) when the
    script has not: torchrun's environment, or a world of one process."""

    def __init__(self, module, *args, **kwargs):
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in RUNTIME_OPTIONS}
        for bad in ("hvd", "engine", "named_parameters"):
            if bad in kwargs:
                raise TypeError(f"pgc_hvd.DistributedDataParallel takes no {bad}=: it runs on "
                                f"the torch engine over the wrapped module's parameters")
        sync_bn = [n for n, m in module.named_modules()
                   if isinstance(m, torch.nn.SyncBatchNorm)]
        if sync_bn:
            raise ValueError(
                f"pgc_hvd.DistributedDataParallel: {sync_bn[0] or 'the model'} is a "
                f"SyncBatchNorm, which runs a collective in every forward pass (every rank in "
                f"lockstep again, and a rank that catches up skips its forward: a hang). Keep "
                f"torch.nn.BatchNorm (each rank's own batch statistics) or use GroupNorm")
        if not engine.is_initialized():
            engine.init()
        super().__init__(module, *args, **kwargs)
        self._pgc_options = options
        self._pgc_opt = None
        self._pgc_placeholder = None
        self._pgc_batch = None        # B, told by the sampler (loop_partitions' caller)
        self._pgc_layouts: dict = {}  # (parts, rows) -> the rows' gradient scales
        self._pgc_scale = None        # the scales while a weighted step's forward runs
        self._pgc_scaled = 0          # outputs weighted in that forward
        # through a weak reference: the module must not keep its wrapper alive (a dropped
        # wrapper would stay a sampler source until the cycle collector runs)
        me = weakref.ref(self)
        self.module.register_forward_hook(
            lambda module, args, output: _scale_hook(me(), output))
        register_source(self)

    # -- the sampler's source ---------------------------------------------------------------
    @property
    def n(self) -> int:
        return engine.size()

    @property
    def version(self) -> int:
        """The model version: updates applied (0 before the optimizer is wrapped)."""
        return 0 if self._pgc_opt is None else int(self._pgc_opt.version)

    @property
    def optimizer(self):
        """The optimizer :meth:`distributed_optimizer` built (None before)."""
        return self._pgc_opt

    def _wrapped(self):
        """The optimizer, which the sampler's questions need (else the error with the fix)."""
        if self._pgc_opt is None:
            raise RuntimeError(
                "pgc_hvd.DistributedDataParallel: wrap the optimizer before iterating the "
                "loader: optimizer = model.distributed_optimizer(torch.optim.SGD(...))")
        return self._pgc_opt

    def loop_partitions(self, step: int) -> tuple:
        """``((partition, weight), ...)`` of the batch of ``step`` (the sampler asks)."""
        return self._wrapped().loop_partitions(step)

    @property
    def loop_width(self) -> int:
        """The most partitions any rank's batch holds at a step (the sampler gives each
        partition B // width rows on every rank)."""
        return self._wrapped().loop_width

    def expect_batch_size(self, batch_size: int) -> None:
        """The sampler's B: every training batch must have B rows (the sampler tells it)."""
        self._pgc_batch = int(batch_size)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer):
        """Wrap ``optimizer`` (built on ``model.parameters()``) as pgc_hvd's: the scheme and
        options of the wrap, fed by this model's loop; returns it (one per model)."""
        if self._pgc_opt is not None:
            raise RuntimeError("pgc_hvd.DistributedDataParallel: distributed_optimizer() was "
                               "called twice; one optimizer per model")
        from pgc_hvd.runtime.distributed import DistributedOptimizer
        # the overlap's buckets are DDP's: its bucket_cap_mb (default 25 MiB)
        opt = DistributedOptimizer(optimizer, named_parameters=self.module.named_parameters(),
                                   hvd=engine, bucket_cap_mb=self.bucket_bytes_cap / 2 ** 20,
                                   **self._pgc_options)
        try:
            opt.feed_from_loop()
        except BaseException:
            opt.close()          # every rank refuses alike: none is left waiting
            raise
        self._pgc_opt = opt
        return opt

    # -- the forward ------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self.module(*inputs, **kwargs)
        opt = self._pgc_opt
        if opt is None:
            raise RuntimeError(
                "pgc_hvd.DistributedDataParallel: a training forward pass before the optimizer "
                "was wrapped; its gradient would be applied by a plain optimizer on each rank "
                "alone. Call optimizer = model.distributed_optimizer(torch.optim.SGD(...)) "
                "first (or run the pass under torch.no_grad() / model.eval())")
        if not opt.begin_loop_step():
            if self._pgc_placeholder is not None:
                return self._pgc_placeholder.make()
        x = _first_tensor(inputs, kwargs)
        rows = None if x is None or x.dim() == 0 else int(x.shape[0])
        if self._pgc_batch is not None and rows is not None and rows != self._pgc_batch:
            raise ValueError(
                f"pgc_hvd.DistributedDataParallel: a training batch of {rows} rows, but the "
                f"CodedSampler cuts steps of batch_size={self._pgc_batch}: give the DataLoader "
                f"the sampler's batch_size (one batch is one step; drop_last is not needed)")
        parts = opt.loop_partitions(opt.version)
        self._pgc_scale = self._row_scale(parts, rows, opt.loop_width)
        self._pgc_scaled = 0
        try:
            output = self.module(*inputs, **kwargs)
        finally:
            scale, self._pgc_scale = self._pgc_scale, None
        if scale is not None and not self._pgc_scaled:
            raise ValueError(
                f"pgc_hvd.DistributedDataParallel: this step's batch holds partitions "
                f"{[k for k, _ in parts]} with weights {[w for _, w in parts]}, which weight the "
                f"gradients of the output's {rows} rows, but no output of the module had {rows} "
                f"rows (a loss computed inside forward?). Return per-sample outputs from "
                f"forward and compute the loss outside it, or use a scheme that evaluates one "
                f"partition a step (pgc-cr, pgc-fr, dgd, bounded-staleness)")
        self._pgc_placeholder = _Placeholder(output)
        return output

    def scale_rows(self, output):
        """While a step's rows are weighted, ``output`` with their number of rows gets its
        rows' gradients scaled (the forward hook on the wrapped module calls this: also a call
        made inside a Lightning ``training_step``); None otherwise."""
        scale = self._pgc_scale
        if scale is None:
            return None
        hit = [0]
        out = _scale_rows(output, scale, scale.numel(), hit)
        self._pgc_scaled += hit[0]
        return out

    @property
    def closed(self) -> bool:
        """Whether its optimizer is closed (a closed door feeds no sampler)."""
        return self._pgc_opt is not None and self._pgc_opt.closed

    def _row_scale(self, parts: tuple, rows, width: int):
        """The rows' gradient scales of a batch holding ``parts`` (None: all 1)."""
        if width == 1 and float(parts[0][1]) == 1.0:
            return None
        if rows is None:
            raise ValueError("pgc_hvd.DistributedDataParallel: this step's batch holds "
                             f"{len(parts)} partitions, but the forward got no tensor with "
                             "a batch dimension to weight")
        key = (parts, rows)
        hit = self._pgc_layouts.get(key)
        if hit is None:
            _, layout = batch_layout(parts, rows, width)
            hit = torch.empty(rows)
            for start, stop, s in layout:
                hit[start:stop] = s
            if len(self._pgc_layouts) > 64:
                self._pgc_layouts.clear()
            self._pgc_layouts[key] = hit
        return hit
