"""Horovod's PyTorch synthetic benchmark, ported to pgc_hvd (straggler-tolerant gradient coding).

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python \\
        launch/examples/pytorch_synthetic_benchmark.py --model resnet18 --image-size 64 \\
        --batch-size 8 --slow-rank 1 --slow-seconds 0.5      # compare with --scheme dgd

A torchvision model trained with SGD on random images, timed as Horovod's
``examples/pytorch/pytorch_synthetic_benchmark.py`` does (warm-up steps, then ``--num-iters``
iterations of ``--num-batches-per-iter`` steps), with the same flags. What differs:

* The random images form a small map-style dataset fed through ``pgc_hvd.data.CodedLoader``:
  gradient coding needs the batches named by (partition, step), so that every replica of a
  partition computes the same gradient. The dataset holds one batch per partition (fixed data,
  like Horovod's single fixed batch); it is copied to the device each step.
* One step = one ``opt.step()``, the update decided by the n - s fastest ranks. A rank that is
  behind computes nothing in some steps (it catches up), so with ``--slow-rank`` the timing
  shows what gradient coding is for: compare ``--scheme pgc-cr`` with ``--scheme dgd``, which
  waits for every rank.
* img/sec per rank counts ``--batch-size`` images per step, the rank's share of an update
  (an update averages n partitions of ``--batch-size`` images); under ``gc-cr`` / ``bcgc`` a rank
  computes s + 1 partitions per step, so its compute per image is higher.
* ``--use-adasum`` is kept, and refused by pgc_hvd with a ValueError: Adasum needs every rank's
  gradient, which gradient coding does not wait for.
* New flags: ``--scheme``, ``--stragglers``, ``--slow-rank`` / ``--slow-seconds``,
  ``--num-workers``, ``--image-size``, ``--num-classes``, ``--lr``, ``--seed``.

The last line on every rank is ``PARAMS digest=<hex> rank=<r>``, equal on every rank.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.backends.cudnn as cudnn
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import horovod.torch as hvd

import pgc_hvd
from pgc_hvd.runtime.consistency import tensors_digest

try:
    from pgc_hvd.data import CodedLoader
except ImportError:   # older trees: the module itself
    from pgc_hvd.data.coded_loader import CodedLoader

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark on pgc_hvd",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="coded messages travel as float16 (hvd.Compression.fp16)")
parser.add_argument("--model", type=str, default="resnet50",
                    help="torchvision model to benchmark")
parser.add_argument("--batch-size", type=int, default=32,
                    help="input batch size per partition and step")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up steps that don't count towards the benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of steps per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="op=hvd.Adasum: refused by pgc_hvd (kept to show the error)")
# pgc_hvd and the synthetic data
parser.add_argument("--image-size", type=int, default=224, help="height and width of the images")
parser.add_argument("--num-classes", type=int, default=1000, help="classes of the model's output")
parser.add_argument("--lr", type=float, default=0.01,
                    help="learning rate (per rank; scaled by the number of ranks)")
parser.add_argument("--seed", type=int, default=42, help="random seed (model and data)")
parser.add_argument("--scheme", default="pgc-cr",
                    help="gradient-coding scheme (pgc-cr, bcgc, gc-cr, dgd, ...)")
parser.add_argument("--stragglers", type=int, default=None,
                    help="straggler budget s (default: 1, or 0 for dgd)")
parser.add_argument("--slow-rank", type=int, default=None,
                    help="inject a straggler: this rank sleeps --slow-seconds before each message")
parser.add_argument("--slow-seconds", type=float, default=0.1,
                    help="seconds the --slow-rank sleeps per message")
parser.add_argument("--num-workers", type=int, default=0,
                    help="DataLoader worker processes of the loader")


class SyntheticImages(torch.utils.data.Dataset):
    """``length`` random images (a pool of at most ``pool`` distinct ones) with random labels,
    the same on every rank (drawn from ``seed``)."""

    def __init__(self, length, image_size, num_classes, seed, pool=64):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(min(length, pool), 3, image_size, image_size, generator=g)
        self.labels = torch.randint(0, num_classes, (length,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i % len(self.images)], self.labels[i]


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())   # one GPU per local rank
    device = torch.device("cuda" if args.cuda else "cpu")
    cudnn.benchmark = True

    model = getattr(models, args.model)(num_classes=args.num_classes).to(device)
    # the decoded update averages the n partitions' gradients, as Horovod's allreduce does
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # a straggler: --slow-rank sleeps before each message (a rank outside 0..n-1 is refused)
    delays = (None if args.slow_rank is None else
              pgc_hvd.delays.SlowWorker(args.slow_rank, args.slow_seconds))
    # op=hvd.Adasum raises ValueError here, on every rank
    optimizer = pgc_hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), scheme=args.scheme,
        stragglers=args.stragglers, compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average, delay=delays, name="bench")

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # fixed fake data: one batch per partition
    dataset = SyntheticImages(hvd.size() * args.batch_size, args.image_size, args.num_classes,
                              args.seed)
    loader = CodedLoader(dataset, n=hvd.size(), batch_size=args.batch_size, seed=args.seed,
                         device=device, num_workers=args.num_workers, pin_memory=args.cuda)

    def benchmark_step():
        losses = []
        for data, target in optimizer.batches(loader):   # nothing while catching up
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            losses.append(loss.item())
        optimizer.step(loss=sum(losses) / len(losses) if losses else None)

    def log(s, nl=True):
        if hvd.rank() != 0:
            return
        print(s, end="\n" if nl else "", flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    kind = "GPU" if args.cuda else "CPU"
    log(f"Number of {kind}s: {hvd.size()}")
    log(f"Scheme: {optimizer.scheme.name}, s={optimizer.scheme.s}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {kind}")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per {kind}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {kind}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")

    optimizer.close()   # every rank at the same final version; parameters compared
    print(f"rank {hvd.rank()}: version {optimizer.version}, {optimizer.catch_up_steps} catch-up "
          f"steps (decided without this rank)", flush=True)
    print(f"PARAMS digest={tensors_digest(model.parameters()):016x} rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    main(args)
