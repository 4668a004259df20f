"""A LightningModule trained unchanged with ``PGCStrategy`` under torchrun (np 2, CPU): fit with
validation and a checkpoint, then a second Trainer (``strategy="pgc"``) resumed from it; each
phase ends with a cross-rank digest of the parameters. The last rank is slowed during the fit.
Then ``same_as_ddp``: ``strategy="ddp"`` and ``PGCStrategy(scheme="dgd")`` from the same initial
model, two epochs: the same parameters to float rounding (the strategy's sampler deals each
epoch as Lightning's DistributedSampler, with its seed). Then ``auto``: ``stragglers="auto"``
with the last rank slowed, fit and checkpoint, resumed by a second Trainer. Prints
``CHECK <name> ok rank=<r>``."""

import sys
import time

import lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import pgc_hvd
import pgc_hvd.lightning
from checks import ok, params_digest, same_on_every_rank


class Digits(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32),
                                       torch.nn.ReLU(), torch.nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.StepLR(opt, 10, 0.5), "interval": "step"}}


class Seen(L.Callback):
    """What the strategy put in place, looked at while training runs (teardown unwraps it)."""

    def on_train_start(self, trainer, pl_module):
        self.model = type(trainer.strategy.model)
        self.train_sampler = type(trainer.train_dataloader.sampler)
        self.val_sampler = type(trainer.val_dataloaders.sampler)


class SlowRank(L.Callback):
    """The last rank sleeps before every training batch: a straggler (the others go on;
    validation's sync_dist and the checkpoint's barrier meet it at the epoch's end)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == trainer.world_size - 1:
            time.sleep(0.03)


def main(out_dir):
    torch.manual_seed(0)
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor(X / 16, dtype=torch.float32), torch.tensor(y)
    train = DataLoader(TensorDataset(X[:1400], y[:1400]), batch_size=32, shuffle=True)
    val = DataLoader(TensorDataset(X[1400:], y[1400:]), batch_size=64)
    model = Digits()
    ckpt = ModelCheckpoint(dirpath=out_dir, save_last=True)
    seen = Seen()
    trainer = L.Trainer(strategy=pgc_hvd.lightning.PGCStrategy(scheme="pgc-cr", stragglers=1,
                                                               timeout=60),
                        accelerator="cpu", devices=2, max_epochs=2,
                        callbacks=[ckpt, seen, SlowRank()],
                        logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train, val)
    rank = trainer.global_rank
    assert seen.model is pgc_hvd.DistributedDataParallel, seen.model
    assert seen.train_sampler is pgc_hvd.CodedSampler, seen.train_sampler
    assert seen.val_sampler is DistributedSampler, seen.val_sampler
    opt = trainer.strategy.optimizers[0]
    steps = len(trainer.train_dataloader)
    assert opt.version == trainer.global_step == 2 * steps, (opt.version, trainer.global_step)
    assert abs(opt.param_groups[0]["lr"] - 0.1 * 0.5 ** (2 * steps // 10)) < 1e-12
    acc = float(trainer.callback_metrics["val_acc"])
    assert acc > 0.6, acc
    print(f"FIT version={opt.version} val_acc={acc:.3f} PARAMS "
          f"{same_on_every_rank(params_digest(model), 'parameters after fit')}", flush=True)
    ok("fit", rank)

    resumed = Digits()
    trainer2 = L.Trainer(strategy="pgc", accelerator="cpu", devices=2, max_epochs=3,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer2.fit(resumed, train, val, ckpt_path=f"{out_dir}/last.ckpt")
    opt2 = trainer2.strategy.optimizers[0]
    assert isinstance(trainer2.strategy, pgc_hvd.lightning.PGCStrategy)
    assert opt2.version == trainer2.global_step == 3 * steps, (opt2.version, trainer2.global_step)
    print(f"RESUMED version={opt2.version} PARAMS "
          f"{same_on_every_rank(params_digest(resumed), 'parameters after the resume')}",
          flush=True)
    ok("resume", rank)

    # s = 0 is Lightning's DDP, batch for batch (21 full batches an epoch on both: the
    # CodedSampler drops DistributedSampler's last, partial one)
    out = []
    for strategy in ("ddp", pgc_hvd.lightning.PGCStrategy(scheme="dgd", timeout=60)):
        torch.manual_seed(1)
        m = Digits()
        init = parameters_to_vector(m.parameters()).detach()
        L.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=2,
                  limit_train_batches=21, num_sanity_val_steps=0, limit_val_batches=0,
                  logger=False, enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False).fit(m, train)
        out.append(parameters_to_vector(m.parameters()).detach())
    gap, moved = float((out[0] - out[1]).abs().max()), float((out[0] - init).abs().max())
    assert gap < 1e-5 and moved > 1e-2, (gap, moved)
    ok("same_as_ddp", rank)

    # stragglers="auto" (the README's quick start): the last rank slowed, one epoch and a
    # checkpoint, then a second Trainer resumed from it for another
    for epochs, resume in ((1, None), (2, f"{out_dir}/auto/last.ckpt")):
        m = Digits()
        t = L.Trainer(strategy=pgc_hvd.lightning.PGCStrategy(scheme="pgc-cr", stragglers="auto",
                                                             timeout=60),
                      accelerator="cpu", devices=2, max_epochs=epochs, logger=False,
                      callbacks=[ModelCheckpoint(dirpath=f"{out_dir}/auto", save_last=True),
                                 SlowRank()],
                      enable_progress_bar=False, enable_model_summary=False)
        t.fit(m, train, val, ckpt_path=resume)
        opt = t.strategy.optimizers[0]
        assert opt.version == t.global_step == epochs * steps, (opt.version, t.global_step)
        assert opt.auto_stragglers is not None
        print(f"AUTO version={opt.version} s={opt.auto_stragglers.s} PARAMS "
              f"{same_on_every_rank(params_digest(m), 'parameters under auto')}", flush=True)
    ok("auto", rank)


if __name__ == "__main__":
    main(sys.argv[1])
