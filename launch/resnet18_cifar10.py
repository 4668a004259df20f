"""The source papers' workload as a ready script: torchvision ResNet-18 on CIFAR-10.

Reads CIFAR-10 with torchvision's ``CIFAR10`` from a local folder (``--data-dir``: the folder
holding ``cifar-10-batches-py``, or that folder; nothing is downloaded) and feeds it through
``pgc_hvd.data.CodedLoader`` (2 DataLoader workers per rank, ``--workers``; ``--augment`` for
RandomCrop + RandomHorizontalFlip), batch 256 per partition and step, SGD with lr 0.01, any
scheme and s. Runs on every rank under horovodrun (see launch/README.md)::

    bash launch/run_local.sh ... or
    horovodrun --gloo -np 4 -H localhost:4 .venv/bin/python launch/resnet18_cifar10.py \\
        --data-dir ~/data/cifar-10-batches-py --scheme pgc-cr --stragglers 1 --steps 2000 --out runs/r18

Any ``pgc-hvd train`` option may be given (``--delay``, ``--compression topk:0.01``, ...);
the defaults below only set the workload. Batch-norm running statistics are per rank (they are
buffers, not gradients); the reported test accuracy uses rank 0's.
"""

import sys

from pgc_hvd.apps.train import main

DEFAULTS = ["--dataset", "cifar10", "--model", "resnet18", "--batch-size", "256", "--lr", "0.01",
            "--momentum", "0.0", "--target-loss", "1.5", "--progress-every", "20"]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--data-dir" not in argv:
        raise SystemExit("resnet18_cifar10.py needs --data-dir DIR (the folder holding "
                         "cifar-10-batches-py, extracted from cifar-10-python.tar.gz)")
    sys.exit(main(DEFAULTS + argv))  # later options override the defaults
