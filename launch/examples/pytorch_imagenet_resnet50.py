"""Horovod's PyTorch ImageNet ResNet-50 example, ported to pgc_hvd (straggler-tolerant gradient
coding).

    horovodrun --gloo -np 4 -H localhost:4 .venv/bin/python \\
        launch/examples/pytorch_imagenet_resnet50.py \\
        --train-dir ~/imagenet/train --val-dir ~/imagenet/validation --scheme pgc-cr

torchvision's ``ImageFolder`` (``<dir>/<class>/<image>``) with the usual transforms, a
torchvision ResNet, SGD with momentum and weight decay, the learning-rate warm-up of Goyal et al.
(https://arxiv.org/abs/1706.02677) set per step, and a checkpoint per epoch from which a new
run resumes, as Horovod's ``examples/pytorch/pytorch_imagenet_resnet50.py``, with the same flags.
What differs, and why:

* The training set goes through ``pgc_hvd.data.CodedLoader`` (the n partitions of gradient
  coding, replicated over the ranks) instead of a DistributedSampler; ``opt.batches(loader)``
  yields the partition(s) this rank evaluates now. Random crops and flips are seeded by
  (seed, partition, step, sample), so every replica of a partition sees the same images.
* Each ``opt.step()`` applies exactly one decided update (the average gradient decoded from the
  n - s fastest ranks): the i-th step of the loop applies update i on every rank, so the learning
  rate set from (epoch, batch index) before it is the same everywhere. A rank that is behind gets
  no batch in some iterations (it catches up); nothing after the inner loop assumes one.
* ``--batches-per-allreduce k``: a batch of k x ``--batch-size`` images per partition, k backward
  passes over its sub-batches (``backward_passes_per_step=k``), as Horovod's.
* Training metrics come from ``opt.metrics`` (the decided step's mean loss and accuracy, the same
  on every rank, no collective) instead of an allreduce per batch, which would put the ranks back
  in lockstep. Validation (each rank its shard of ``--val-dir``) is summed by one allreduce at
  the epoch's end.
* Checkpoints: rank 0 saves ``{"model", "optimizer": opt.state_dict()}`` after the epoch's last
  step; the optimizer state carries the model version, so a resumed run (rank 0 loads, then
  ``broadcast_parameters`` and ``broadcast_optimizer_state``) continues from that version on
  every rank.
* ``--use-adasum`` is kept, and refused by pgc_hvd with a ValueError (Adasum needs every rank's
  gradient; gradient coding never waits for all of them).
* ``--log-dir``: rank 0 appends each epoch's metrics to ``<log-dir>/metrics.jsonl`` (and to
  TensorBoard when ``tensorboard`` is installed). No tqdm progress bars: one line per epoch.
* New flags: ``--model`` (any torchvision classifier, default resnet50), ``--image-size``
  (default 224), ``--scheme`` (default pgc-cr), ``--stragglers``, ``--slow-rank`` /
  ``--slow-seconds`` (inject a straggler), ``--num-workers``, ``--clip`` (clip the decoded update's
  norm: ``synchronize()``, ``clip_grad_norm_``, ``step()`` under ``skip_synchronize()``).

The last line on every rank is ``PARAMS digest=<hex> rank=<r>``, equal on every rank.
"""

import argparse
import json
import math
import os

import torch
import torch.backends.cudnn as cudnn
import torch.multiprocessing as mp
import torch.nn.functional as F
import torch.optim as optim
from torchvision import datasets, models, transforms

import horovod.torch as hvd

import pgc_hvd
from pgc_hvd.runtime.consistency import tensors_digest

try:
    from pgc_hvd.data import CodedLoader
except ImportError:   # older trees: the module itself
    from pgc_hvd.data.coded_loader import CodedLoader

parser = argparse.ArgumentParser(description="PyTorch ImageNet example on pgc_hvd",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--train-dir", default=os.path.expanduser("~/imagenet/train"),
                    help="path to training data (ImageFolder: <dir>/<class>/<image>)")
parser.add_argument("--val-dir", default=os.path.expanduser("~/imagenet/validation"),
                    help="path to validation data (ImageFolder)")
parser.add_argument("--log-dir", default=None,
                    help="rank 0 writes each epoch's metrics here (metrics.jsonl; TensorBoard "
                         "too when installed)")
parser.add_argument("--checkpoint-format", default="./checkpoint-{epoch}.pth.tar",
                    help="checkpoint file format")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="coded messages travel as float16 (hvd.Compression.fp16)")
parser.add_argument("--batches-per-allreduce", type=int, default=1,
                    help="number of sub-batches (backward passes) per partition and step; it "
                         "multiplies the batch size")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="op=hvd.Adasum: refused by pgc_hvd (kept to show the error)")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="accepted for compatibility; pgc_hvd decodes in fp32, so it changes "
                         "nothing")
# default settings from https://arxiv.org/abs/1706.02677
parser.add_argument("--batch-size", type=int, default=32,
                    help="input batch size for training (per partition and backward pass)")
parser.add_argument("--val-batch-size", type=int, default=32,
                    help="input batch size for validation")
parser.add_argument("--epochs", type=int, default=90, help="number of epochs to train")
parser.add_argument("--base-lr", type=float, default=0.0125,
                    help="learning rate for a single rank")
parser.add_argument("--warmup-epochs", type=float, default=5, help="number of warmup epochs")
parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
parser.add_argument("--wd", type=float, default=0.00005, help="weight decay")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, help="random seed")
# new here
parser.add_argument("--model", default="resnet50", help="torchvision model")
parser.add_argument("--image-size", type=int, default=224, help="training crop size")
parser.add_argument("--scheme", default="pgc-cr",
                    help="gradient-coding scheme (pgc-cr, bcgc, gc-cr, dgd, ...)")
parser.add_argument("--stragglers", type=int, default=None,
                    help="straggler budget s (default: 1, or 0 for dgd)")
parser.add_argument("--slow-rank", type=int, default=None,
                    help="inject a straggler: this rank sleeps --slow-seconds before each message")
parser.add_argument("--slow-seconds", type=float, default=0.1,
                    help="seconds the --slow-rank sleeps per message")
parser.add_argument("--num-workers", type=int, default=None,
                    help="DataLoader worker processes per loader (default: 4 with CUDA, else 2)")
parser.add_argument("--clip", type=float, default=None,
                    help="clip the decoded update to this L2 norm")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())   # one GPU per local rank
        torch.cuda.manual_seed(args.seed)
    device = torch.device("cuda" if args.cuda else "cpu")
    cudnn.benchmark = True
    verbose = hvd.rank() == 0

    # the latest checkpoint (rank 0 has them); its epoch goes to every rank
    resume_from_epoch = 0
    for try_epoch in range(args.epochs, 0, -1):
        if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
            resume_from_epoch = try_epoch
            break
    resume_from_epoch = int(hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                          name="resume_from_epoch").item())

    torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // hvd.local_size())))
    workers = args.num_workers if args.num_workers is not None else (4 if args.cuda else 2)
    kwargs = {"num_workers": workers, "pin_memory": args.cuda}
    # as Horovod's example on GPU nodes: forkserver workers (fork is not safe with Infiniband)
    if (args.cuda and workers > 0 and hasattr(mp, "_supports_context") and mp._supports_context
            and "forkserver" in mp.get_all_start_methods()):
        kwargs["multiprocessing_context"] = "forkserver"

    train_dataset = datasets.ImageFolder(
        args.train_dir,
        transform=transforms.Compose([transforms.RandomResizedCrop(args.image_size),
                                      transforms.RandomHorizontalFlip(),
                                      transforms.ToTensor(),
                                      transforms.Normalize(mean=MEAN, std=STD)]))
    # the n partitions (the DistributedSampler's place); a batch holds the sub-batches of
    # --batches-per-allreduce backward passes
    allreduce_batch_size = args.batch_size * args.batches_per_allreduce
    train_loader = CodedLoader(train_dataset, n=hvd.size(), batch_size=allreduce_batch_size,
                               seed=args.seed, device=device, **kwargs)

    val_dataset = datasets.ImageFolder(
        args.val_dir,
        transform=transforms.Compose([transforms.Resize(round(args.image_size * 256 / 224)),
                                      transforms.CenterCrop(args.image_size),
                                      transforms.ToTensor(),
                                      transforms.Normalize(mean=MEAN, std=STD)]))
    val_shard = torch.utils.data.Subset(val_dataset,
                                        range(hvd.rank(), len(val_dataset), hvd.size()))
    val_loader = torch.utils.data.DataLoader(val_shard, batch_size=args.val_batch_size,
                                             **kwargs)

    model = getattr(models, args.model)(num_classes=len(train_dataset.classes)).to(device)

    # the decoded update is the average gradient of n partitions, as Horovod's allreduce: scale
    # the learning rate by n and by the sub-batches (gradient accumulation)
    lr_scaler = args.batches_per_allreduce * hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.base_lr * lr_scaler,
                          momentum=args.momentum, weight_decay=args.wd)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # a straggler: --slow-rank sleeps before each message (a rank outside 0..n-1 is refused)
    delays = (None if args.slow_rank is None else
              pgc_hvd.delays.SlowWorker(args.slow_rank, args.slow_seconds))
    # op=hvd.Adasum raises ValueError here, on every rank
    optimizer = pgc_hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), scheme=args.scheme,
        stragglers=args.stragglers, compression=compression,
        backward_passes_per_step=args.batches_per_allreduce,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
        metrics=["accuracy"], delay=delays, name="imagenet")

    # resume: rank 0 loads the checkpoint, the broadcasts give every rank its parameters, the
    # optimizer state and the model version
    checkpoint_path = args.checkpoint_format.format(epoch=resume_from_epoch)
    if resume_from_epoch > 0 and hvd.rank() == 0:
        # weights_only=True: pgc_hvd's optimizer state (ring, RNG states) is tensors and plain
        # types, so nothing in the file runs code when it is read
        checkpoint = torch.load(checkpoint_path, map_location=device, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    # Horovod's order; the other ranks take rank 0's version from the optimizer-state broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if resume_from_epoch > 0:
        expected = resume_from_epoch * len(train_loader)
        if optimizer.version != expected:
            raise RuntimeError(f"{checkpoint_path} holds version {optimizer.version}, not "
                               f"{expected} = epoch {resume_from_epoch} x {len(train_loader)} "
                               f"steps: was it written with another batch size or data set?")
        print(f"rank {hvd.rank()}: resumed from {checkpoint_path} at epoch {resume_from_epoch}, "
              f"version {optimizer.version}", flush=True)

    log_writer = None
    if args.log_dir and verbose:
        os.makedirs(args.log_dir, exist_ok=True)
        try:
            from torch.utils.tensorboard import SummaryWriter
            log_writer = SummaryWriter(args.log_dir)
        except ImportError:   # tensorboard not installed: metrics.jsonl only
            pass

    def log_metrics(epoch, values):
        if not (args.log_dir and verbose):
            return
        with open(os.path.join(args.log_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, **values}) + "\n")
        if log_writer is not None:
            for k, v in values.items():
                log_writer.add_scalar(k, v, epoch)

    # Goyal et al.: lr = base_lr * n grows linearly from base_lr over the warm-up epochs, then
    # drops by 10 at epochs 30, 60 and 80. Set before each step from (epoch, batch index): the
    # same on every rank, since step i applies update i everywhere.
    def adjust_learning_rate(epoch, batch_idx):
        if epoch < args.warmup_epochs:
            epoch += float(batch_idx + 1) / len(train_loader)
            lr_adj = 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / args.warmup_epochs + 1)
        elif epoch < 30:
            lr_adj = 1.0
        elif epoch < 60:
            lr_adj = 1e-1
        elif epoch < 80:
            lr_adj = 1e-2
        else:
            lr_adj = 1e-3
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * hvd.size() * args.batches_per_allreduce * lr_adj

    def accuracy(output, target):
        return (output.argmax(1) == target).float().mean().item()

    def train(epoch):
        model.train()
        train_loader.set_epoch(epoch)
        decided_loss, decided_acc = [], []
        for batch_idx in range(len(train_loader)):
            adjust_learning_rate(epoch, batch_idx)
            losses, accs = [], []
            for data, target in optimizer.batches(train_loader):   # nothing while catching up
                subs = math.ceil(len(data) / args.batch_size)
                for i in range(0, len(data), args.batch_size):
                    data_batch = data[i:i + args.batch_size]
                    target_batch = target[i:i + args.batch_size]
                    output = model(data_batch)
                    loss = F.cross_entropy(output, target_batch)
                    losses.append(loss.item())
                    accs.append(accuracy(output, target_batch))
                    (loss / subs).backward()   # the partition's gradient: mean over sub-batches
            sent = {"loss": sum(losses) / len(losses),
                    "metrics": {"accuracy": sum(accs) / len(accs)}} if losses else {}
            if args.clip is not None:
                optimizer.synchronize(**sent)   # p.grad = the decoded update, same on all ranks
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step(**sent)
            m = optimizer.metrics    # the decided step's means: the same on every rank
            if m.get("loss") is not None and math.isfinite(m["loss"]):
                decided_loss.append(m["loss"])
            if math.isfinite(m.get("accuracy", math.nan)):
                decided_acc.append(m["accuracy"])
        loss = sum(decided_loss) / max(1, len(decided_loss))
        acc = sum(decided_acc) / max(1, len(decided_acc))
        if verbose:
            print(f"Train Epoch #{epoch + 1}: loss {loss:.4f}, accuracy {100.0 * acc:.2f}% "
                  f"(version {optimizer.version}, lr {optimizer.param_groups[0]['lr']:.5f})",
                  flush=True)
        log_metrics(epoch, {"train/loss": loss, "train/accuracy": acc})

    def validate(epoch):
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)   # loss sum, correct, count
        with torch.no_grad():
            for data, target in val_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                sums += torch.tensor([F.cross_entropy(output, target, reduction="sum").item(),
                                      (output.argmax(1) == target).sum().item(), len(target)],
                                     dtype=torch.float64)
        # one collective at the epoch's end
        loss_sum, correct, count = hvd.allreduce(sums, op=hvd.Sum, name=f"val.{epoch}").tolist()
        loss, acc = loss_sum / max(count, 1), correct / max(count, 1)
        if verbose:
            print(f"Validate Epoch #{epoch + 1}: loss {loss:.4f}, accuracy {100.0 * acc:.2f}%",
                  flush=True)
        log_metrics(epoch, {"val/loss": loss, "val/accuracy": acc})

    def save_checkpoint(epoch):
        # rank 0, after the epoch's last step: its version is (epoch + 1) x steps per epoch
        if hvd.rank() == 0:
            filepath = args.checkpoint_format.format(epoch=epoch + 1)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, filepath + ".tmp")
            os.replace(filepath + ".tmp", filepath)   # never a half-written checkpoint
            print(f"saved {filepath} (epoch {epoch + 1}, version {optimizer.version})",
                  flush=True)

    for epoch in range(resume_from_epoch, args.epochs):
        train(epoch)
        validate(epoch)
        save_checkpoint(epoch)

    optimizer.close()   # every rank at the same final version; parameters compared
    if log_writer is not None:
        log_writer.close()
    print(f"rank {hvd.rank()}: done at epoch {args.epochs}, version {optimizer.version}, "
          f"{optimizer.catch_up_steps} catch-up steps", flush=True)
    print(f"PARAMS digest={tensors_digest(model.parameters()):016x} rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    main(args)
