"""The README's quick start, runnable: horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python launch/quickstart.py"""
import horovod.torch as hvd
import torch

import pgc_hvd
from pgc_hvd.data import load_dataset
from pgc_hvd.runtime import PartitionLoader

hvd.init()
torch.manual_seed(0)
ds = load_dataset("digits")                 # shipped with scikit-learn: 1797 8x8 images
X, y = torch.as_tensor(ds.X), torch.as_tensor(ds.y)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   scheme="pgc-cr", stragglers=1)   # or "bcgc", "gc-cr", "dgd", ...
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
loader = PartitionLoader(X, y, n=hvd.size(), batch_size=32)   # splits the data into n partitions
while opt.version < 60:                     # updates applied; a late rank catches up first
    for xb, yb in opt.batches(loader):      # the partition(s) the scheme wants from this rank now
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()                     # hooks put the gradient into the ring buffer
    opt.step(loss=loss.item())              # fires with the n-s fastest ranks
opt.close()

with torch.no_grad():
    accuracy = (model(X).argmax(1) == y).float().mean().item()
if hvd.rank() == 0:
    print(f"quickstart: {opt.version} updates, training accuracy {accuracy:.3f}")
