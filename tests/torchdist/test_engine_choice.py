"""Which engine DistributedOptimizer takes, and the torch engine without Horovod (one process)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pgc_hvd.runtime.engine import from_environment, resolve

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("env, want", [
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "horovod"),
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"}, "torch"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "torch"),
    ({"HOROVOD_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "horovod"),
])
def test_engine_from_the_launchers_environment(monkeypatch, env, want):
    for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE",
              "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert from_environment() == want


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be"):
        resolve("mpi")


@pytest.mark.slow
def test_torch_engine_without_horovod_in_one_process(tmp_path):
    """`import pgc_hvd` and `pgc_hvd.torch` need no horovod: with a horovod that raises
    ImportError first on the path, a world of one process (no torchrun) trains, and
    pgc_hvd.DistributedOptimizer picks the torch engine by itself."""
    hide = tmp_path / "hide" / "horovod"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden')\n")
    script = textwrap.dedent("""
        import sys
        import pgc_hvd
        assert "torch" not in sys.modules            # import pgc_hvd stays cheap
        import torch
        import torch.nn.functional as F
        import pgc_hvd.torch as hvd
        from pgc_hvd.runtime import PartitionLoader
        hvd.init()
        assert (hvd.rank(), hvd.size()) == (0, 1)
        X = torch.randn(32, 4); y = (X[:, 0] > 0).long()
        loader = PartitionLoader(X, y, 1, batch_size=8, seed=0)
        m = torch.nn.Linear(4, 2)
        opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                           m.named_parameters(), scheme="dgd")
        assert opt.hvd is sys.modules["pgc_hvd.torchdist"], opt.hvd
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        while opt.version < 3:
            for xb, yb in opt.batches(loader):
                F.cross_entropy(m(xb), yb).backward()
            opt.step()
        opt.close()
        hvd.shutdown()
        assert not any(k == "horovod.torch" for k in sys.modules)
        print("ONE-RANK-OK", opt.version)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RANK",
                                                                    "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(hide.parent), str(ROOT)] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))
    assert "ONE-RANK-OK 3" in proc.stdout, proc.stdout + proc.stderr
