"""``pgc-hvd train --device``: which device a rank trains on, and a clear error when cuda cannot
be had (the run itself is covered by the multirank tests, on the CPU here)."""

from __future__ import annotations

import pytest
import torch

from pgc_hvd.ops._ext import cuda_compiled
from pgc_hvd.apps.train import build_parser, resolve_device

HAVE_CUDA = torch.cuda.is_available() and cuda_compiled()


def test_default_is_auto_and_choices_are_checked():
    assert build_parser().parse_args(["--out", "x"]).device == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--out", "x", "--device", "tpu"])


def test_cpu_is_always_cpu():
    assert resolve_device("cpu", 3) == torch.device("cpu")


@pytest.mark.skipif(HAVE_CUDA, reason="checks the machine without a usable GPU")
def test_without_gpu_auto_falls_back_and_cuda_names_the_fix():
    assert resolve_device("auto", 0) == torch.device("cpu")
    with pytest.raises(SystemExit, match="--device cpu"):
        resolve_device("cuda", 0)


@pytest.mark.gpu
def test_cuda_pins_local_rank_modulo_the_gpus():
    count = torch.cuda.device_count()
    dev = resolve_device("cuda", count + 1)
    assert dev == torch.device("cuda", (count + 1) % count)
    assert torch.cuda.current_device() == dev.index
    assert resolve_device("auto", 0).type == "cuda"
    torch.cuda.set_device(0)
