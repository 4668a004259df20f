"""The ported Horovod examples in launch/examples/ run on two ranks, on tiny data, with a slowed
rank, and every rank ends with the same parameters (the ``PARAMS digest=... rank=...`` lines).

The MNIST run on the digits has its own launch (its process's exit closes the optimizer: checked);
the other runs are entries of the session's np 2 launch (``launch_group``), the ImageNet
example's two runs (train, then resume) one after the other."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "launch" / "examples"
MNIST = EXAMPLES / "pytorch_mnist.py"
BENCHMARK = EXAMPLES / "pytorch_synthetic_benchmark.py"
IMAGENET = EXAMPLES / "pytorch_imagenet_resnet50.py"


def same_params_on_every_rank(out: str, np: int = 2) -> str:
    """The hash every rank printed (asserting there is one line per rank and one hash)."""
    lines = re.findall(r"PARAMS digest=([0-9a-f]{16}) rank=(\d+)", out)
    assert sorted(int(r) for _, r in lines) == list(range(np)), out
    hashes = {h for h, _ in lines}
    assert len(hashes) == 1, f"the ranks' parameters differ: {lines}"
    return hashes.pop()


def write_image_folder(root: Path, classes: int, per_class: int, size: int, seed: int) -> Path:
    """``root/c<k>/<i>.jpg``: small RGB JPEGs, class k bright in channel k."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for k in range(classes):
        (root / f"c{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = rng.integers(0, 90, size=(size, size, 3))
            arr[..., k % 3] += 150
            Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(root / f"c{k}" / f"{i}.jpg")
    return root


@pytest.mark.multirank
def test_mnist_port_trains_on_digits_with_a_slow_rank(horovodrun):
    proc = horovodrun(2, MNIST, "--epochs", "3", "--lr", "0.1", "--log-interval", "5",
                      "--slow-rank", "1", "--slow-seconds", "0.05", timeout=150)
    out = proc.stdout
    assert "digits: 1437 training images in 2 partitions, 11 steps per epoch" in out, out
    assert len(re.findall(r"Test set: Average loss: [0-9.]+, Accuracy: [0-9.]+%", out)) == 3, out
    m = re.search(r"Final accuracy: ([0-9.]+)% after (\d+) steps \(3 epochs\)", out)
    assert m, out + proc.stderr
    assert int(m.group(2)) == 33
    assert float(m.group(1)) > 30.0, out   # 10 classes: chance is 10% (about 55% here)
    assert re.search(r"rank 1: \d+ catch-up steps", out), out
    # no close() in the script: the exit closes the optimizer, no rank reports a dead one
    assert "has died" not in proc.stderr and "agent on rank" not in proc.stderr, proc.stderr
    same_params_on_every_rank(out)


def write_mnist(root: Path, train: int, test: int, seed: int = 0) -> Path:
    """torchvision's MNIST layout, ``root/MNIST/raw/*-ubyte`` (IDX files), of random 28x28
    images: what ``datasets.MNIST(root, download=False)`` reads."""
    import struct

    import numpy as np

    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">4i", 0x803, count, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">2i", 0x801, count) + labels.tobytes())
    return root


def _mnist_data(cwd):
    data = write_mnist(cwd / "data", train=40, test=12)
    return ["--data-dir", data, "--batch-size", "8", "--epochs", "1", "--slow-rank", "1",
            "--slow-seconds", "0.05"]


def _imagenet(epochs):
    """The ImageNet example's arguments; the first run writes the image folders and the
    checkpoints' folder (``IMAGENET_ROOT``), the second resumes from there."""
    def args(cwd):
        if not IMAGENET_ROOT:
            write_image_folder(cwd / "train", classes=3, per_class=6, size=40, seed=0)
            write_image_folder(cwd / "val", classes=3, per_class=2, size=40, seed=1)
            IMAGENET_ROOT.append(cwd)
        return [*imagenet_args(IMAGENET_ROOT[0]), "--epochs", epochs]
    return args


def imagenet_args(root):
    # 18 images in 2 partitions of 9, batches of 2 x 2 sub-batches: 2 steps per epoch
    return ["--train-dir", root / "train", "--val-dir", root / "val", "--model", "resnet18",
            "--image-size", "32", "--batch-size", "2", "--batches-per-allreduce", "2",
            "--val-batch-size", "4", "--warmup-epochs", "1",
            "--checkpoint-format", root / "ck-{epoch}.pth.tar", "--num-workers", "1",
            "--slow-rank", "1", "--slow-seconds", "0.05", "--clip", "5.0",
            "--log-dir", root / "logs"]


IMAGENET_ROOT: list = []
LAUNCH_GROUPS = [("horovodrun", 2, [
    ("mnist-data-dir", "test_mnist_port_reads_torchvision_mnist_from_data_dir", MNIST,
     _mnist_data),
    ("mnist-amp", "test_mnist_port_mixed_precision_and_fp16_messages", MNIST,
     ["--epochs", "1", "--lr", "0.1", "--use-mixed-precision", "--fp16-allreduce",
      "--slow-rank", "0", "--slow-seconds", "0.05"]),
    ("benchmark", "test_synthetic_benchmark_port_resnet18", BENCHMARK,
     ["--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--num-iters", "2",
      "--num-batches-per-iter", "2", "--num-warmup-batches", "1", "--num-classes", "10",
      "--slow-rank", "1", "--slow-seconds", "0.1"]),
    ("imagenet-first", "test_imagenet_port_checkpoints_and_resumes", IMAGENET, _imagenet("2")),
    ("imagenet-resume", "test_imagenet_port_checkpoints_and_resumes", IMAGENET, _imagenet("3"))])]


@pytest.mark.multirank
def test_mnist_port_reads_torchvision_mnist_from_data_dir(hvd2):
    proc = hvd2.ran("mnist-data-dir")
    assert "MNIST: 40 training images in 2 partitions, 2 steps per epoch" in proc.stdout, \
        proc.stdout
    assert re.search(r"Final accuracy: [0-9.]+% after 2 steps", proc.stdout), proc.stdout
    same_params_on_every_rank(proc.stdout)


@pytest.mark.multirank
def test_mnist_port_mixed_precision_and_fp16_messages(hvd2):
    # bf16 autocast on the CPU with a GradScaler handed to scaler.step(opt); fp16 wire
    proc = hvd2.ran("mnist-amp")
    assert re.search(r"Final accuracy: [0-9.]+% after 11 steps", proc.stdout), proc.stdout
    same_params_on_every_rank(proc.stdout)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod not installed")
def test_mnist_port_use_adasum_is_refused():
    # one rank (hvd.init() without horovodrun): pgc_hvd refuses op=hvd.Adasum at construction
    proc = subprocess.run([sys.executable, str(MNIST), "--use-adasum", "--epochs", "1"],
                          capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT),
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT),
                               "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0, proc.stdout
    assert "ValueError: op=hvd.Adasum is refused" in proc.stderr, proc.stderr


@pytest.mark.multirank
@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="horovod not installed")
def test_mnist_port_through_horovod_run(tmp_path):
    # Horovod's --num-proc path: the script starts its ranks itself with horovod.run
    proc = run_watched([sys.executable, str(MNIST), "--num-proc", "2", "--communication",
                        "gloo", "--epochs", "1", "--lr", "0.1"], timeout=150, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Running training through horovod.run" in proc.stdout
    assert re.search(r"Final accuracy: [0-9.]+% after 11 steps", proc.stdout), proc.stdout
    same_params_on_every_rank(proc.stdout)


@pytest.mark.multirank
def test_synthetic_benchmark_port_resnet18(hvd2):
    proc = hvd2.ran("benchmark")
    out = proc.stdout
    assert "Model: resnet18" in out and "Number of CPUs: 2" in out, out
    assert len(re.findall(r"Iter #\d: [0-9.]+ img/sec per CPU", out)) == 2, out
    assert re.search(r"Img/sec per CPU: [0-9.]+ \+-[0-9.]+", out), out
    assert re.search(r"Total img/sec on 2 CPU\(s\): [0-9.]+ \+-[0-9.]+", out), out
    # 1 warm-up + 2 x 2 timed steps, every rank at the same version
    assert sorted(re.findall(r"rank (\d): version 5,", out)) == ["0", "1"], out
    same_params_on_every_rank(out)


@pytest.mark.multirank
def test_imagenet_port_checkpoints_and_resumes(hvd2):
    import torch

    root = hvd2.ran("imagenet-first").cwd
    fmt = str(root / "ck-{epoch}.pth.tar")
    first = hvd2.ran("imagenet-first").stdout
    assert len(re.findall(r"Train Epoch #\d: loss [0-9.]+, accuracy", first)) == 2, first
    assert len(re.findall(r"Validate Epoch #\d: loss [0-9.]+, accuracy", first)) == 2, first
    assert f"saved {fmt.format(epoch=1)} (epoch 1, version 2)" in first, first
    assert f"saved {fmt.format(epoch=2)} (epoch 2, version 4)" in first, first
    assert sorted(re.findall(r"rank (\d): done at epoch 2, version 4,", first)) == ["0", "1"]
    assert "resumed" not in first
    hash1 = same_params_on_every_rank(first)
    ck = torch.load(fmt.format(epoch=2), weights_only=True)
    assert ck["optimizer"]["param_groups"][0]["pgc_version"] == 4
    # train + val of epochs 1-2 (the first run), then of epoch 3 (the second: it appends)
    epochs = [json.loads(l)["epoch"] for l in
              (root / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert len(epochs) == 6 and len(set(epochs[:4])) == 2 and len(set(epochs[4:])) == 1, epochs
    assert max(epochs[:4]) < epochs[4], epochs

    second = hvd2.ran("imagenet-resume").stdout
    resumed = re.findall(r"rank (\d): resumed from (\S+) at epoch 2, version 4", second)
    assert sorted(r for r, _ in resumed) == ["0", "1"], second
    assert {p for _, p in resumed} == {fmt.format(epoch=2)}
    assert "Train Epoch #3:" in second and "Train Epoch #2:" not in second, second
    assert f"saved {fmt.format(epoch=3)} (epoch 3, version 6)" in second, second
    assert sorted(re.findall(r"rank (\d): done at epoch 3, version 6,", second)) == ["0", "1"]
    assert same_params_on_every_rank(second) != hash1
