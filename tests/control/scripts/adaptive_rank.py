"""Run on every rank: an AdaptiveController and a too-large lr; rank 0 writes what every rank saw.

    adaptive_rank.py OUT LR STEPS [SCHEME [KNOB]]     (default pgc-cr, knob auto)
"""
import json, sys, time
from pathlib import Path

import horovod.torch as hvd
import torch

from pgc_hvd.control.rule import ControlConfig
from pgc_hvd.control.runtime import AdaptiveController
from pgc_hvd.data import load_dataset, train_test_split
from pgc_hvd.metrics.records import RecordWriter, read_records
from pgc_hvd.models import build_task
from pgc_hvd.runtime import DistributedOptimizer, PartitionLoader

out, lr, steps = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
scheme = sys.argv[4] if len(sys.argv) > 4 else "pgc-cr"
knob = sys.argv[5] if len(sys.argv) > 5 else "auto"
torch.set_num_threads(1)
hvd.init()
tr, te = train_test_split(load_dataset("digits"), 0.2, seed=0)
task = build_task("softmax", tr, seed=0)
hvd.broadcast_parameters(task.model.state_dict(), root_rank=0)
loader = PartitionLoader(tr.X, tr.y, hvd.size(), batch_size=32, seed=0)
writer = RecordWriter(out / "records.jsonl", overwrite=True) if hvd.rank() == 0 else None
val = (torch.as_tensor(te.X[:128]), torch.as_tensor(te.y[:128]))
ctl = AdaptiveController(task.model, task.loss, val, ControlConfig(window=3, patience=1000, knob=knob), max_age=1,
                         writer=writer)
opt = DistributedOptimizer(torch.optim.SGD(task.model.parameters(), lr=lr), task.model.named_parameters(),
                           scheme=scheme, stragglers=1, records=None, on_update=ctl.on_update,
                           # bounded staleness: the note's rule, whose table entries are stale
                           # (the engines' default steps on gradients of the current model, so
                           # the rule has no staleness to lower c for)
                           scheme_options={"replay": "mean"} if scheme == "bounded-staleness"
                           else None,
                           on_record=ctl.on_record, timeout=60)
ctl.attach(opt)
while opt.version < steps:
    for xb, yb in opt.batches(loader):
        loss = task.loss(task.model(xb), yb)
        loss.backward()
    opt.step(loss=loss.item())
opt.close()
levels = hvd.allgather_object(ctl.rule.level)
lrs = hvd.allgather_object(opt.param_groups[0]["lr"])
staleness_bounds = hvd.allgather_object(opt.staleness_bound)
staleness_changes = hvd.allgather_object(list(opt.agent.staleness_changes))
if hvd.rank() == 0:
    writer.close()
    recs = list(read_records(out / "records.jsonl"))
    json.dump({"levels": levels, "lrs": lrs, "staleness_bounds": staleness_bounds, "staleness_changes": staleness_changes,
               "records": [{"step": r["step"], "c": r["extra"].get("c"), "max_age": r["max_age"],
                            "versions": r["versions"]} for r in recs],
               "n_records": len(recs),
               "actions": [a for r in recs for a in r["extra"].get("control", [])],
               "n_diag": sum(len(r["extra"].get("diag", [])) for r in recs)},
              open(out / "result.json", "w"))
