"""The train command's own checks, TopK's and the loaders' (they run before any collective, so
they are tested here without Horovod ranks); DistributedOptimizer's argument checks are
RuntimeConfig's (tests/runtime/test_config.py)."""

from __future__ import annotations

import os

import pytest

from pgc_hvd.compress import TopK
from pgc_hvd.apps.train import main as train_main


@pytest.mark.parametrize("kwargs, message", [
    ({"ratio": 0.0}, "must lie in \\(0, 1\\]"),
    ({"ratio": 1.5}, "must lie in \\(0, 1\\]"),
    ({"k": 0}, "an int >= 1"),
    ({"method": "fast"}, "'exact' or 'threshold'"),
])
def test_bad_topk(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TopK(**kwargs)
    assert TopK(k=5).kappa(3) == 3 and TopK(0.5).kappa(10) == 5


@pytest.mark.parametrize("bad, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--compression", "topk:0"], "topk:RATIO"),
    (["--compression", "topk:abc"], "topk:RATIO"),
    (["--compression", "gzip:0.1"], "topk:RATIO"),
    (["--progress-every", "0"], "--progress-every is a number of steps and must be >= 1"),
    (["--scheme", "dgd", "--stragglers", "1"], "--stragglers 1: dgd waits for all workers"),
    (["--stragglers", "-1"], "--stragglers -1: pgc-cr: s (stragglers tolerated) must be >= 0"),
    (["--scheme", "pgc"], "--scheme: unknown scheme 'pgc'"),
    (["--compute-time", "-1"], "--compute-time must be finite seconds >= 0"),
    (["--compute-time", "nan"], "--compute-time must be finite seconds >= 0"),
    (["--target-loss", "nan"], "--target-loss must be a finite loss"),
    (["--target-loss", "inf"], "--target-loss must be a finite loss"),
    (["--delay", "replay:no-such-trace.json"], "--delay 'replay:no-such-trace.json'"),
])
def test_train_rejects_bad_values_before_starting(tmp_path, usage_error, bad, message):
    assert message in usage_error(train_main, ["--out", str(tmp_path)] + bad)


def test_train_checks_its_out_folder_and_trace_before_the_run(unusable_runs, usage_error):
    """A file as --out, records.jsonl or summary.json that are folders, an earlier run, and a
    damaged --delay replay: trace are usage errors before Horovod starts."""
    for argv, message in unusable_runs:
        assert message in usage_error(train_main, ["--out"] + argv)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file")
def test_train_refuses_an_unwritable_summary_before_the_run(tmp_path, usage_error):
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "summary.json").chmod(0o444)
    assert "summary.json cannot be written" in usage_error(train_main, ["--out", str(tmp_path)])


def test_partition_loader_checks():
    import torch

    from pgc_hvd.runtime import PartitionLoader
    X, y = torch.randn(40, 3), torch.arange(40) % 2
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
            PartitionLoader(X, y, 2, batch_size=bad)
    loader = PartitionLoader(X, y, 2, batch_size=4)
    assert loader.batch(1, 0)[0].shape == (4, 3)
    for bad in (-1, 2):
        with pytest.raises(IndexError, match="is not in"):
            loader.batch(bad, 0)


def test_bounded_staleness_shard_sizes_are_checked():
    from pgc_hvd.schemes import get_scheme
    for bad in ([float("nan"), 1, 1, 1], [0, 1, 1, 1], "1234", [1, 1]):
        with pytest.raises(ValueError, match="shard_sizes"):
            get_scheme("bounded-staleness", 4, 1, shard_sizes=bad)
