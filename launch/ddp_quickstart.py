"""The README's DDP quick start, runnable: GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 4 launch/ddp_quickstart.py"""
import torch, torch.distributed as dist, torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
import pgc_hvd

dist.init_process_group("gloo")
torch.manual_seed(0)
X, y = load_digits(return_X_y=True)
dataset = TensorDataset(torch.tensor(X / 16, dtype=torch.float32), torch.tensor(y))
sampler = pgc_hvd.CodedSampler(dataset, batch_size=32)               # was DistributedSampler
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
model = pgc_hvd.DistributedDataParallel(model, scheme="pgc-cr",           # was DDP(model)
                                        stragglers="auto")   # s chosen online; or an int
optimizer = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
for epoch in range(5):
    sampler.set_epoch(epoch)
    for xb, yb in loader:                       # one batch = one step of this rank
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()                        # fires with the n - s fastest ranks
with torch.no_grad():
    acc = (model(dataset.tensors[0]).argmax(1) == dataset.tensors[1]).float().mean().item()
print(f"ddp quickstart: {optimizer.version} updates, training accuracy {acc:.3f}", flush=True)
