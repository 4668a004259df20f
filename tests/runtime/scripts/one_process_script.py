"""A Horovod script as a user debugs it, on one process: ``python
one_process_script.py`` (no launcher, n = 1), ``horovodrun -np 1`` or ``torchrun
--nproc-per-node 1`` (the engine follows the launcher, ``pgc_hvd.engine()``), with
``pgc_hvd.DistributedOptimizer(opt, model.named_parameters(), hvd.Compression.fp16)`` and every
other default: it trains with s = 0 and says so once (a warning on stderr). ``python
one_process_script.py explicit``: an explicit ``stragglers=1`` is refused, naming the fix."""
import sys

import torch

import pgc_hvd

hvd = pgc_hvd.engine()
hvd.init()
torch.manual_seed(0)
X = torch.randn(256, 8)
y = X @ torch.randn(8, 1)
dataset = torch.utils.data.TensorDataset(X, y)
model = torch.nn.Linear(8, 1)
base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
if "explicit" in sys.argv:
    try:
        pgc_hvd.DistributedOptimizer(base, model.named_parameters(), hvd.Compression.fp16,
                                     stragglers=1)
    except ValueError as err:
        print(f"REFUSED {err}", flush=True)
        sys.exit(0)
    sys.exit("stragglers=1 on one process was not refused")

opt = pgc_hvd.DistributedOptimizer(base, model.named_parameters(), hvd.Compression.fp16)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
loader = pgc_hvd.CodedLoader(dataset, n=hvd.size(), batch_size=32)
with torch.no_grad():
    first = torch.nn.functional.mse_loss(model(X), y).item()
for step in range(30):
    for xb, yb in opt.batches(loader):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
    opt.step(loss=loss.item())
opt.close()
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(X), y).item()
assert hvd.size() == 1 and opt.scheme.name == "pgc-cr" and opt.scheme.s == 0, opt.scheme
assert opt.config.stragglers == 0 and opt.config.wire_dtype == torch.float16
assert opt.config.compression is None and opt.version == 30, opt.version
assert final < 0.1 * first, (first, final)
print(f"ONE-PROCESS-OK engine={hvd.__name__} s={opt.scheme.s} updates={opt.version} "
      f"loss {first:.3f} -> {final:.4f}", flush=True)
