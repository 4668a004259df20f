"""The README's quick start, runnable: horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python launch/quickstart.py, or GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 4 launch/quickstart.py"""
import torch
from sklearn.datasets import load_digits

import pgc_hvd

hvd = pgc_hvd.engine()     # horovod.torch under horovodrun, pgc_hvd.torch under torchrun
hvd.init()
torch.manual_seed(0)
X, y = load_digits(return_X_y=True)         # shipped with scikit-learn: 1797 8x8 images
X, y = torch.tensor(X / 16, dtype=torch.float32), torch.tensor(y)
dataset = torch.utils.data.TensorDataset(X, y)   # any map-style torch Dataset (ImageFolder, ...)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   scheme="pgc-cr", stragglers=1)   # or "bcgc", "gc-cr", "dgd", ...
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
loader = pgc_hvd.CodedLoader(dataset, n=hvd.size(), batch_size=32,   # n partitions, fed by
                             num_workers=2)                  # a torch DataLoader
for step in range(60):                      # each step() applies one update on every rank
    for xb, yb in opt.batches(loader):      # the partition(s) the scheme wants from this rank now
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
    opt.step(loss=loss.item())              # fires with the n-s fastest ranks
    if hvd.rank() == 0 and step % 20 == 0:
        print(f"step {step}: mean loss of the messages used {opt.metrics['loss']:.3f}")
opt.close()    # optional (done at exit); here: every rank caught up before evaluating

with torch.no_grad():
    accuracy = (model(X).argmax(1) == y).float().mean().item()
if hvd.rank() == 0:
    print(f"quickstart: {opt.version} updates, training accuracy {accuracy:.3f}")
