"""Horovod's PyTorch MNIST example, ported to pgc_hvd (straggler-tolerant gradient coding).

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python launch/examples/pytorch_mnist.py \\
        --epochs 2 --slow-rank 1 --slow-seconds 0.2

Same command line, model and loop shape as Horovod's ``examples/pytorch/pytorch_mnist.py``;
what differs, and why:

* Data. Nothing is downloaded: torchvision's MNIST is read when ``--data-dir`` holds it
  (``<data-dir>/MNIST/raw``), else scikit-learn's bundled 8x8 digits (1797 images) are used,
  80/20 split, and the net's convolutions are sized for 8x8 inputs.
* The training ``DataLoader`` becomes a ``pgc_hvd.data.CodedLoader`` (``from_dataloader``: its
  dataset and settings, the sampler replaced by the scheme's partitions): gradient coding
  replicates the n data partitions over the ranks, so the optimizer says which
  partition(s) a rank evaluates at each step (``opt.batches(loader)``). ``len(loader)`` is the
  number of steps in an epoch.
* Each ``opt.step()`` applies exactly one decided update (the average gradient decoded from the
  n - s fastest ranks), so every rank runs ``len(loader)`` steps per epoch. A rank that is behind
  (a straggler) gets no batch in some iterations -- it only catches up -- so nothing after the
  inner loop assumes a batch was computed.
* Logging reads ``opt.metrics`` (the decided step's mean loss and accuracy, the same on every
  rank, no collective); an allreduce of the loss per batch would put the ranks back in lockstep.
* Dropout works unchanged: inside ``opt.batches()`` torch's generators are seeded by (seed,
  partition, step), so the replicas of a partition draw the same masks (pgc_hvd does it).
* No ``close()``: the end of the script closes the optimizer on every rank (catch-up and the
  parameters compared across ranks, as ``close()`` does).
* ``--use-adasum`` is kept, and refused: pgc_hvd raises a ValueError for ``op=hvd.Adasum``
  (Adasum needs every rank's gradient; gradient coding never waits for all of them).
* ``--use-mixed-precision`` also runs on the CPU (bfloat16 autocast), with a GradScaler
  handed to ``scaler.step(opt)`` without ``unscale_`` (pgc_hvd unscales each rank's gradients
  before they enter its ring; the ranks' scales may differ).
* New flags: ``--scheme`` (default pgc-cr), ``--stragglers`` (s), ``--slow-rank`` /
  ``--slow-seconds`` (inject a straggler: that rank sleeps before each of its messages),
  ``--num-workers`` (the loader's worker processes).

The last line on every rank is ``PARAMS digest=<hex> rank=<r>``: a digest of the trained
parameters, equal on every rank.
"""

import argparse
import time

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import horovod
import horovod.torch as hvd

import pgc_hvd
from pgc_hvd.runtime.consistency import tensors_digest

try:
    from pgc_hvd.data import CodedLoader
except ImportError:   # older trees: the module itself
    from pgc_hvd.data.coded_loader import CodedLoader

parser = argparse.ArgumentParser(description="PyTorch MNIST example on pgc_hvd",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=64, metavar="N",
                    help="input batch size per partition and step")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N",
                    help="input batch size for testing")
parser.add_argument("--epochs", type=int, default=10, metavar="N", help="epochs to train")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR",
                    help="learning rate (per rank; scaled by the number of ranks)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed")
parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                    help="how many steps to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="coded messages travel as float16 (hvd.Compression.fp16)")
parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                    help="autocast (float16 on CUDA, bfloat16 on the CPU) with a GradScaler")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="op=hvd.Adasum: refused by pgc_hvd (kept to show the error)")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="accepted for compatibility; pgc_hvd decodes in fp32, so it changes "
                         "nothing")
parser.add_argument("--data-dir",
                    help="folder holding torchvision's MNIST (MNIST/raw); without it, or when "
                         "it holds no MNIST, scikit-learn's 8x8 digits are used")
# pgc_hvd
parser.add_argument("--scheme", default="pgc-cr",
                    help="gradient-coding scheme (pgc-cr, bcgc, gc-cr, dgd, ...)")
parser.add_argument("--stragglers", type=int, default=None,
                    help="straggler budget s (default: 1, or 0 for dgd)")
parser.add_argument("--slow-rank", type=int, default=None,
                    help="inject a straggler: this rank sleeps --slow-seconds before each message")
parser.add_argument("--slow-seconds", type=float, default=0.1,
                    help="seconds the --slow-rank sleeps per message")
parser.add_argument("--num-workers", type=int, default=None,
                    help="DataLoader worker processes of the training loader "
                         "(default: 1 with CUDA, else 0)")
# arguments when not run through horovodrun (horovod.run starts the ranks itself)
parser.add_argument("--num-proc", type=int)
parser.add_argument("--hosts",
                    help="hosts to run on in notation: hostname:slots[,host2:slots[,...]]")
parser.add_argument("--communication", help="collaborative communication to use: gloo, mpi")


class Net(nn.Module):
    """Horovod's MNIST net: two conv + max-pool layers, dropout, two linear layers. For inputs
    smaller than 28x28 (the 8x8 digits) the convolutions are 3x3 with padding 1."""

    def __init__(self, image_size=28, num_classes=10):
        super().__init__()
        k, pad = (5, 0) if image_size >= 28 else (3, 1)
        self.conv1 = nn.Conv2d(1, 10, kernel_size=k, padding=pad)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=k, padding=pad)
        self.conv2_drop = nn.Dropout2d()
        with torch.no_grad():
            self.flat = self.features(torch.zeros(1, 1, image_size, image_size)).numel()
        self.fc1 = nn.Linear(self.flat, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def features(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))

    def forward(self, x):
        x = self.features(x).flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def load_data(args):
    """(train dataset, test dataset, image size): torchvision's MNIST from --data-dir when it is
    there, else the 8x8 digits as TensorDatasets."""
    if args.data_dir:
        from torchvision import datasets, transforms
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        try:
            train = datasets.MNIST(args.data_dir, train=True, download=False, transform=tf)
            test = datasets.MNIST(args.data_dir, train=False, download=False, transform=tf)
            return train, test, 28, "MNIST"
        except RuntimeError as err:   # "Dataset not found": fall back to the digits
            if hvd.rank() == 0:
                print(f"no MNIST in {args.data_dir} ({err}); using scikit-learn's digits",
                      flush=True)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    X = (X - 0.3) / 0.4   # roughly zero mean, unit variance, as MNIST's Normalize
    y = torch.tensor(y, dtype=torch.long)
    i_train, i_test = train_test_split(range(len(y)), test_size=0.2, random_state=args.seed,
                                       stratify=y.numpy())
    train = torch.utils.data.TensorDataset(X[i_train], y[i_train])
    train.targets = y[i_train]      # labels, should a loader want to sort partitions by them
    test = torch.utils.data.TensorDataset(X[i_test], y[i_test])
    return train, test, 8, "digits"


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if args.cuda else "cpu")
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())   # one GPU per local rank
        torch.cuda.manual_seed(args.seed)
    torch.set_num_threads(1)   # as Horovod's example: one CPU thread per rank

    train_dataset, test_dataset, image_size, data_name = load_data(args)
    workers = args.num_workers if args.num_workers is not None else (1 if args.cuda else 0)
    kwargs = {"num_workers": workers, "pin_memory": args.cuda}
    # as Horovod's example on GPU nodes: forkserver workers (fork is not safe with Infiniband)
    if (args.cuda and workers > 0 and hasattr(mp, "_supports_context") and mp._supports_context
            and "forkserver" in mp.get_all_start_methods()):
        kwargs["multiprocessing_context"] = "forkserver"
    # Horovod's loader, then the n partitions of the training set in the sampler's place
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler, **kwargs)
    train_loader = CodedLoader.from_dataloader(train_loader, n=hvd.size(), seed=args.seed,
                                               device=device)
    # testing: each rank evaluates its own shard; the sums are allreduced
    test_shard = torch.utils.data.Subset(test_dataset,
                                         range(hvd.rank(), len(test_dataset), hvd.size()))
    test_loader = torch.utils.data.DataLoader(test_shard, batch_size=args.test_batch_size)

    model = Net(image_size).to(device)
    # the decoded update is the average gradient of the n partitions (a batch n times larger),
    # as Horovod's allreduce: scale the learning rate by n as Horovod's example does
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # a straggler: --slow-rank sleeps before each message (a rank outside 0..n-1 is refused)
    delays = (None if args.slow_rank is None else
              pgc_hvd.delays.SlowWorker(args.slow_rank, args.slow_seconds))
    # op=hvd.Adasum raises ValueError here, on every rank (see the module docstring)
    optimizer = pgc_hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), scheme=args.scheme,
        stragglers=args.stragglers, compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
        metrics=["accuracy"], delay=delays, name="mnist")
    # the same start on every rank (after the wrap, as Horovod's examples do it)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    amp_device = "cuda" if args.cuda else "cpu"
    amp_dtype = torch.float16 if args.cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(amp_device) if args.use_mixed_precision else None

    if hvd.rank() == 0:
        print(f"{data_name}: {len(train_dataset)} training images in {hvd.size()} partitions, "
              f"{len(train_loader)} steps per epoch; scheme {optimizer.scheme.name}, "
              f"s={optimizer.scheme.s}", flush=True)

    def train_epoch(epoch):
        model.train()
        train_loader.set_epoch(epoch)
        for batch_idx in range(len(train_loader)):
            losses, accs = [], []
            # the partitions this rank evaluates now (none while it catches up)
            for data, target in optimizer.batches(train_loader):
                with torch.autocast(amp_device, dtype=amp_dtype, enabled=scaler is not None):
                    output = model(data)
                    loss = F.nll_loss(output, target)
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                losses.append(loss.item())
                accs.append((output.argmax(1) == target).float().mean().item())
            sent = {"loss": sum(losses) / len(losses),
                    "metrics": {"accuracy": sum(accs) / len(accs)}} if losses else {}
            if scaler is not None:
                # no unscale_(): pgc_hvd unscales this rank's gradients before they enter its
                # ring (each rank's scaler keeps its own scale)
                scaler.step(optimizer, **sent)
                scaler.update()
            else:
                optimizer.step(**sent)
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                m = optimizer.metrics   # the decided step: the same on every rank
                print(f"Train Epoch: {epoch} [{batch_idx}/{len(train_loader)} "
                      f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {m['loss']:.6f}"
                      f"\tAccuracy: {100.0 * m['accuracy']:.1f}%\tstep {m['step']} used ranks "
                      f"{m['ranks']}", flush=True)

    def metric_sum(values, name):
        return hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum,
                             name=name).tolist()

    def test(epoch):
        model.eval()
        loss_sum = correct = count = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                data, target = data.to(device), target.to(device)
                output = model(data)
                loss_sum += F.nll_loss(output, target, reduction="sum").item()
                correct += (output.argmax(1) == target).sum().item()
                count += len(target)
        # one collective at the epoch's end (every rank has run the epoch's steps)
        loss_sum, correct, count = metric_sum([loss_sum, correct, count], f"test.{epoch}")
        if hvd.rank() == 0:
            print(f"\nTest set: Average loss: {loss_sum / count:.4f}, "
                  f"Accuracy: {100.0 * correct / count:.2f}%\n", flush=True)
        return correct / count

    accuracy = float("nan")
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        accuracy = test(epoch)

    if hvd.rank() == 0:
        print(f"Final accuracy: {100.0 * accuracy:.2f}% after {optimizer.version} steps "
              f"({args.epochs} epochs)", flush=True)
        print(f"Training time: {time.perf_counter() - start:.1f}s", flush=True)
    print(f"rank {hvd.rank()}: {optimizer.catch_up_steps} catch-up steps (decided without "
          f"this rank)", flush=True)
    print(f"PARAMS digest={tensors_digest(model.parameters()):016x} rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    if args.num_proc:
        print("Running training through horovod.run")
        horovod.run(main, args=(args,), np=args.num_proc, hosts=args.hosts,
                    use_gloo=args.communication == "gloo", use_mpi=args.communication == "mpi")
    else:   # started by horovodrun
        main(args)
