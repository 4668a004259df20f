"""The ResNet-18 / CIFAR-10 launch script on tiny CIFAR-format files written by the test."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pgc_hvd.ops._ext import cuda_compiled

ROOT = Path(__file__).resolve().parents[2]


def write_tiny_cifar(folder: Path, per_batch: int = 24) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ["data_batch_1", "data_batch_2", "test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = [int(i % 10) for i in range(per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)


@pytest.mark.multirank
def test_resnet18_cifar10_script_runs_on_tiny_files(horovodrun, tmp_path):
    data = tmp_path / "cifar-10-batches-py"
    write_tiny_cifar(data)
    out = tmp_path / "run"
    horovodrun(2, ROOT / "launch" / "resnet18_cifar10.py", "--data-dir", str(tmp_path),
               "--scheme", "pgc-cr", "--stragglers", "1", "--steps", "3", "--batch-size", "4",
               "--out", str(out), timeout=240)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "resnet18" and summary["steps"] == 3
    # --device auto: a GPU when torch sees one and _C has CUDA kernels, else the CPU
    usable_gpu = torch.cuda.is_available() and cuda_compiled()
    assert summary["device"] == ("cuda" if usable_gpu else "cpu")
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3
