"""The Lightning door: ``PGCStrategy``, Lightning's ``DDPStrategy`` on pgc_hvd's DDP door.

    import pgc_hvd.lightning                       # registers strategy="pgc"
    trainer = lightning.Trainer(strategy=pgc_hvd.lightning.PGCStrategy(scheme="pgc-cr",
                                                                       stragglers=1),
                                accelerator="cpu", devices=4)
    # or Trainer(strategy="pgc", ...): pgc-cr with the default straggler budget
    trainer.fit(model, train_loader, val_loader)    # the LightningModule trains unchanged

What the strategy changes, all in Lightning's own hooks (the rest is ``DDPStrategy``'s:
launching, the default process group, ``self.log(..., sync_dist=True)``, barriers,
checkpoints, early stopping):

* ``_setup_model``: the LightningModule is wrapped by :class:`pgc_hvd.DistributedDataParallel`
  (the scheme, s and the runtime's options of the strategy; DDP's own keywords pass through);
* ``setup_optimizers``: the optimizer ``configure_optimizers`` returns is wrapped by the model
  (``model.distributed_optimizer``); its LR schedulers keep working (the wrapper shares the
  param groups); one optimizer (manual optimization with several is refused);
* ``process_dataloader``: the training loader gets a :class:`pgc_hvd.CodedSampler` (batch size
  kept, the seed Lightning gives its ``DistributedSampler``: the same deal each epoch) in place
  of the ``DistributedSampler`` Lightning put in; validation and test loaders
  keep Lightning's.

* ``setup``: Lightning's per-batch broadcast of rank 0's SIGTERM flag (a collective every
  step: lockstep again) becomes each rank's own check (the rank that gets SIGTERM stops; the
  others stop with an ``AgentError`` naming it);
* ``teardown`` (the end of a fit) closes the optimizer: the ranks agree on the final version
  and compare the parameters' digests; ``on_exception`` aborts it (the other ranks stop with an
  error naming this rank).

Each ``optimizer.step(closure)`` runs the closure (``training_step`` and ``backward``), sends
this rank's coded message and applies the update decided with the n - s fastest ranks.
Checkpoints hold the optimizer's ``state_dict`` (with the model version); resuming
(``trainer.fit(..., ckpt_path=...)``) continues at that version on every rank. Refused:
DDP communication hooks and post-local-SGD model averaging (pgc_hvd does the gradient
communication), ``SyncBatchNorm`` (``Trainer(sync_batchnorm=True)``: the DDP door refuses it),
several optimizers.

May import: lightning, torch, ``runtime.ddp``, ``data.coded_sampler``.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _update_dataloader
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from pgc_hvd.data.coded_sampler import CodedSampler
from pgc_hvd.runtime.ddp import RUNTIME_OPTIONS, DistributedDataParallel

__all__ = ["PGCStrategy"]

_MISSING = object()


def _local_sigterm(trainer) -> None:
    """This rank's SIGTERM check, without Lightning's per-batch broadcast."""
    if getattr(trainer, "received_sigterm", False):
        raise SIGTERMException()


_REFUSED = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


class PGCStrategy(DDPStrategy):
    """``DDPStrategy`` whose model is :class:`pgc_hvd.DistributedDataParallel` (module doc).
    ``scheme``, ``stragglers`` and the runtime's options (:data:`pgc_hvd.runtime.ddp.
    RUNTIME_OPTIONS`: ``timeout``, ``delay``, ``control``, ...) are pgc_hvd's; every other
    keyword is ``DDPStrategy``'s (``find_unused_parameters``, ``process_group_backend``, ...)."""

    strategy_name = "pgc"

    def __init__(self, scheme: str = "pgc-cr", stragglers=None, **kwargs: Any) -> None:
        refused = [k for k in _REFUSED if kwargs.get(k) is not None]
        if refused:
            raise ValueError(
                f"PGCStrategy: {refused[0]} is a DDP communication hook / model averaging "
                f"setting; pgc_hvd does the gradient communication itself (the coded messages "
                f"of the n - s fastest ranks), so it cannot run one. Drop it, or use "
                f"strategy='ddp'")
        runtime = {k: kwargs.pop(k) for k in list(kwargs) if k in RUNTIME_OPTIONS}
        super().__init__(**kwargs)
        self.pgc_options = {"scheme": scheme, "stragglers": stragglers, **runtime}

    def _setup_model(self, model):
        return DistributedDataParallel(model, device_ids=self.determine_ddp_device_ids(),
                                       **self._ddp_kwargs, **self.pgc_options)

    def setup(self, trainer) -> None:
        super().setup(trainer)
        # Lightning's training loop broadcasts rank 0's SIGTERM flag on the default group
        # before EVERY batch: a collective per step, which puts the ranks back in lockstep (the
        # slowest rank sets every rank's pace). Under this strategy each rank checks its own
        # flag: the rank that gets SIGTERM stops, and pgc_hvd stops the others with an
        # AgentError naming it.
        loop = trainer.fit_loop.epoch_loop
        if hasattr(loop, "_broadcast_sigterm_tensor"):
            loop._broadcast_sigterm_tensor = lambda: _local_sigterm(trainer)

    def setup_optimizers(self, trainer) -> None:
        super().setup_optimizers(trainer)
        if len(self.optimizers) != 1:
            raise ValueError(f"PGCStrategy: configure_optimizers returned "
                             f"{len(self.optimizers)} optimizers; gradient coding steps one "
                             f"optimizer over the model's parameters")
        self.optimizers = [self.model.distributed_optimizer(self.optimizers[0])]

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's, then the module's ``forward`` as it was: Lightning redirects it to
        ``training_step`` for the DDP wrapper's call and the module's own forward call undoes
        that; at a step this rank does not compute (it catches up) the door returns its
        placeholder without calling the module, so the redirection would stay and a later
        ``module(x)`` would run ``training_step``."""
        module = self.lightning_module
        had = module.__dict__.get("forward", _MISSING)
        try:
            return super().training_step(*args, **kwargs)
        finally:
            if had is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = had

    def on_exception(self, exception: BaseException) -> None:
        """A failed fit: the optimizer tells the other ranks (they stop with an error naming
        this rank) instead of waiting for them at the teardown."""
        for opt in self.optimizers:
            if hasattr(opt, "abort"):
                opt.abort()
        super().on_exception(exception)

    def teardown(self) -> None:
        """The end of a fit: every rank's loop is over, so the optimizer closes (the ranks agree
        on the final version and compare the parameters' digests: a disagreement raises on
        every rank), and a later fit in this process can build its own."""
        for opt in self.optimizers:
            if hasattr(opt, "close") and not opt.closed:
                opt.close()
        super().teardown()

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer
        if (trainer.state.stage == RunningStage.TRAINING and isinstance(dataloader, DataLoader)
                and not isinstance(dataloader.sampler, CodedSampler)):
            if dataloader.batch_size is None:
                raise ValueError("PGCStrategy: the training DataLoader has no batch_size (a "
                                 "batch_sampler of its own); give it batch_size=B")
            # Lightning's DistributedSampler seed (seed_everything's): the same deal as
            # strategy="ddp" gives each epoch
            sampler = CodedSampler(dataloader.dataset, batch_size=dataloader.batch_size,
                                   seed=int(os.getenv("PL_GLOBAL_SEED", 0)))
            sampler.bind(self.model)
            dataloader = _update_dataloader(dataloader, sampler, mode=RunningStage.TRAINING)
        return dataloader

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if "pgc" not in strategy_registry:
            strategy_registry.register(
                "pgc", cls, description="gradient coding: each step with the n - s fastest "
                                        "ranks (pgc_hvd)")


PGCStrategy.register_strategies(StrategyRegistry)
