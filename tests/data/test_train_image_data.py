"""``pgc-hvd train --dataset imagefolder|cifar10``: torchvision's datasets through CodedLoader (the
2-rank run is an entry of the session's np 2 launch, ``launch_group``)."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from image_folder import write_image_folder
from pgc_hvd.apps.train import main

TRAIN = Path(__file__).resolve().parents[1] / "control" / "scripts" / "train_cli.py"


def _args(cwd):
    folder = write_image_folder(cwd / "images", classes=3, per_class=20, size=8, seed=2)
    return ["--dataset", "imagefolder", "--data-dir", folder, "--image-size", "8",
            "--model", "softmax", "--lr", "0.5", "--momentum", "0", "--non-iid",
            "--augment", "--workers", "2", "--batch-size", "4", "--steps", "24",
            "--scheme", "pgc-cr", "--delay", "exp:mean=0.01,seed=1", "--out", cwd / "run"]


LAUNCH_GROUPS = [("horovodrun", 2, [("imagefolder", "test_train_cli_on_an_image_folder", TRAIN,
                                     _args)])]


@pytest.mark.multirank
def test_train_cli_on_an_image_folder(launch_group, request):
    """2 ranks, PGC-CR, label-sorted shards, 2 workers per rank, augmentation: the run learns
    the colour-coded classes on the held-out 20% and reports rank 0's loader counts."""
    out = launch_group(request, "horovodrun", 2).ran("imagefolder").cwd / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "imagefolder" and summary["steps"] == 24
    assert summary["final_test_accuracy"] > 0.8, summary
    assert summary["loader_stats_rank0"]["prefetched"] > 0, summary


def test_train_cli_refuses_image_sets_without_a_folder(usage_error, tmp_path):
    for argv, message in [
            (["--dataset", "cifar10"], "--dataset cifar10 reads a local folder: pass --data-dir"),
            (["--dataset", "imagefolder", "--workers", "-1", "--data-dir", "x"],
             "--workers is a number of DataLoader processes and must be >= 0")]:
        assert message in usage_error(main, argv + ["--out", str(tmp_path / "run")])
