"""The GPU check's training runs, rehearsed on the CPU: ``benchmarks/gpu/gpu_check_runs.py --device
cpu`` launches the same torchrun commands a GPU session will (``pgc-hvd train --device``, dense
and top-kappa, and ``gpu_train_check.py``: AMP with a GradScaler, fp16 messages, a CodedLoader
feeding the model's device), so a session lent a device spends its minutes measuring, not
debugging the script. The whole rehearsal (every step of ``gpu_check.sh``) is
``bash benchmarks/gpu/gpu_check.sh --rehearse``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multirank
def test_gpu_check_runs_rehearsed_on_the_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_check_runs.py"), "--device", "cpu",
         "--parts", "train,nccl,amp", "--schemes", "pgc-cr", "--steps", "60",
         "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 of 3 runs passed" in proc.stdout, proc.stdout
    got = json.loads((tmp_path / "out" / "gpu_runs.json").read_text())
    runs = {r["run"]: r for r in got["results"]}
    assert set(runs) == {"train-pgc-cr-none", "train-pgc-cr-topk0.01", "amp-fp16-pinned-nvml"}
    assert runs["train-pgc-cr-topk0.01"]["mean_bytes"] < runs["train-pgc-cr-none"]["mean_bytes"]
    amp = runs["amp-fp16-pinned-nvml"]["figures"]
    assert amp["amp"] == "bfloat16" and amp["device"] == "cpu"
    # fp16 messages: the wire carries half the fp32 ring's bytes
    assert amp["bytes_per_step"] == pytest.approx(amp["fp32_ring_bytes"] / 2, rel=0.01)
    assert amp["gpu_record"]["available"] is False and amp["gpu_record"]["reason"]
    assert (tmp_path / "out" / "gpu_runs.log").read_text().count("=====") == 3
