"""A Horovod script run as one process trains with the defaults: ``python
train.py`` (n = 1) with ``DistributedOptimizer(opt, model.named_parameters(),
hvd.Compression.fp16)`` runs with s = 0 and says so once, under no launcher, ``horovodrun -np
1`` and ``torchrun --nproc-per-node 1`` alike; an explicit ``stragglers=1`` is still refused
with the fix (tests/runtime/scripts/one_process_script.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "one_process_script.py"
REPO = Path(__file__).resolve().parents[2]
NOTE = "pgc-cr runs with s = 0 stragglers on 1 rank (the default s = 1 needs n >= 2 ranks)"


def plain_python(*args, timeout=120):
    """``python one_process_script.py ARGS``: no launcher, as a user debugs a script."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "TORCHELASTIC_", "OMPI_", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "")
                                                        .split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def trained_and_said_so_once(proc, engine):
    assert f"ONE-PROCESS-OK engine={engine} s=0 updates=30" in proc.stdout, \
        proc.stdout + proc.stderr
    assert proc.stderr.count(NOTE) == 1, proc.stderr


def test_a_horovod_script_trains_as_one_plain_process():
    pytest.importorskip("horovod.torch")
    trained_and_said_so_once(plain_python(), "horovod.torch")


@pytest.mark.slow
def test_an_explicit_budget_is_still_refused_on_one_process():
    pytest.importorskip("horovod.torch")
    proc = plain_python("explicit")
    assert "REFUSED pgc-cr: needs 0 <= s <= n-1" in proc.stdout and \
        "use s in [0, 0]" in proc.stdout, proc.stdout + proc.stderr
    assert NOTE not in proc.stderr


@pytest.mark.multirank
def test_one_rank_under_horovodrun(horovodrun):
    trained_and_said_so_once(horovodrun(1, SCRIPT, timeout=120), "horovod.torch")


@pytest.mark.multirank
def test_one_rank_under_torchrun(torchrun):
    trained_and_said_so_once(torchrun(1, SCRIPT, timeout=120), "pgc_hvd.torch")
