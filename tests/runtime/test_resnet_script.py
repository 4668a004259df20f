"""The ResNet-18 / CIFAR-10 launch script on tiny CIFAR-format files written by the test, read
by torchvision's CIFAR10 through CodedLoader's DataLoader workers (an entry of the session's np 2
launch, ``launch_group``)."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pgc_hvd.ops._ext import cuda_compiled

ROOT = Path(__file__).resolve().parents[2]


def write_tiny_cifar(folder: Path, per_batch: int = 5) -> None:
    """cifar-10-python.tar.gz's layout with tiny random batches (str keys, as the published
    pickles load); torchvision reads them with --no-verify-data (their MD5s differ)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3 * 32 * 32), dtype=np.uint8)
        labels = [int(i % 10) for i in range(per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def _args(cwd):
    write_tiny_cifar(cwd / "cifar-10-batches-py")
    return ["--data-dir", str(cwd), "--no-verify-data", "--augment", "--scheme", "pgc-cr",
            "--stragglers", "1", "--steps", "3", "--batch-size", "4", "--out", str(cwd / "run")]


TEST = "test_resnet18_cifar10_script_runs_on_tiny_files"
LAUNCH_GROUPS = [("horovodrun", 2, [("resnet18", TEST, ROOT / "launch" / "resnet18_cifar10.py",
                                     _args)])]


@pytest.mark.multirank
def test_resnet18_cifar10_script_runs_on_tiny_files(launch_group, request):
    out = launch_group(request, "horovodrun", 2).ran("resnet18").cwd / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "resnet18" and summary["steps"] == 3
    assert summary["dataset"] == "cifar10" and summary["loader_stats_rank0"]["here"] >= 1
    # --device auto: a GPU when torch sees one and _C has CUDA kernels, else the CPU
    usable_gpu = torch.cuda.is_available() and cuda_compiled()
    assert summary["device"] == ("cuda" if usable_gpu else "cpu")
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3
