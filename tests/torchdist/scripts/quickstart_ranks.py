"""Runs launch/quickstart.py on every rank (under torchrun) and checks its ending: every rank
holds the same parameters (a SHA-256 of them, gathered), horovod was never imported."""
import hashlib
import runpy
import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[3] / "launch" / "quickstart.py"

done = runpy.run_path(str(QUICKSTART), run_name="__main__")
hvd, model, opt = done["hvd"], done["model"], done["opt"]
import torch  # noqa: E402

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
digest = int(hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:12], 16)
every = hvd.allgather(torch.tensor([digest], dtype=torch.int64), name="quickstart.hash").tolist()
assert len(set(every)) == 1, f"parameters differ across ranks: {every}"
assert "horovod" not in sys.modules or sys.modules["horovod"] is None or \
    not hasattr(sys.modules["horovod"], "torch"), "horovod was imported"
assert hvd.__name__ == "pgc_hvd.torch", hvd.__name__
assert opt.scheme.name == "pgc-cr" and opt.version == 60, (opt.scheme.name, opt.version)
print(f"QUICKSTART-OK rank={hvd.rank()} n={hvd.size()} hash={digest:x} "
      f"updates={opt.version}", flush=True)
