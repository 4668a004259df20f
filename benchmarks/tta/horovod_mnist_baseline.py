"""Horovod's own MNIST loop (``hvd.DistributedOptimizer``, a ``DistributedSampler`` shard per
rank) on the data and net of ``launch/examples/pytorch_mnist.py``, for the figures of
docs/from_horovod.md, "What changes in the numbers":

    horovodrun --gloo -np 2 -H localhost:2 python benchmarks/tta/horovod_mnist_baseline.py \\
        --epochs 3 --lr 0.1 [--slow-rank 1 --slow-seconds 0.1]

Same arguments as the port (``--slow-rank`` sleeps ``--slow-seconds`` before each step, as the
port's injected delay); prints the test accuracy after each epoch and the training time.
"""

import importlib.util
import time
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F

PORT = Path(__file__).resolve().parents[2] / "launch" / "examples" / "pytorch_mnist.py"
spec = importlib.util.spec_from_file_location("pytorch_mnist_port", PORT)
port = importlib.util.module_from_spec(spec)
spec.loader.exec_module(port)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_dataset, test_dataset, image_size, _ = port.load_data(args)
    sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=sampler)
    test_shard = torch.utils.data.Subset(test_dataset,
                                         range(hvd.rank(), len(test_dataset), hvd.size()))
    test_loader = torch.utils.data.DataLoader(test_shard, batch_size=args.test_batch_size)
    model = port.Net(image_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            if args.slow_rank == hvd.rank():
                time.sleep(args.slow_seconds)
            optimizer.step()
        model.eval()
        correct = count = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                correct += (model(data).argmax(1) == target).sum().item()
                count += len(target)
        correct, count = hvd.allreduce(torch.tensor([correct, count], dtype=torch.float64),
                                       op=hvd.Sum, name=f"test.{epoch}").tolist()
        if hvd.rank() == 0:
            print(f"Test set: Accuracy: {100.0 * correct / count:.2f}% (epoch {epoch})",
                  flush=True)
    if hvd.rank() == 0:
        print(f"Training time: {time.perf_counter() - start:.1f}s", flush=True)


if __name__ == "__main__":
    args = port.parser.parse_args()
    main(args)
