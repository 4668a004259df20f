"""Run by tests/multihost/test_warm_worker.py under horovodrun, through warm workers: each
rank says whether it is a warm worker's child and checks an allreduce."""

import os

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
n = hvd.size()
assert total == n * (n + 1) / 2, total
print(f"WARM rank={hvd.rank()} size={n} warm={os.environ.get('PGC_WARM_WORKER')} "
      f"host={os.environ.get('HOROVOD_HOSTNAME')} ok", flush=True)
