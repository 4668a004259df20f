"""Simulator settings are checked when they are made, with the fix in the message."""

import pytest

from pgc_hvd.schemes import get_scheme
from pgc_hvd.sim.comm import CommModel
from pgc_hvd.sim.engine import SimConfig
from pgc_hvd.sim.run import simulate


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "run at least one step"),
    ({"steps": 2.5}, "run at least one step"),
    ({"compress": 0.0}, r"must lie in \(0, 1\]"),
    ({"compress": 1.5}, r"must lie in \(0, 1\]"),
    ({"partition_time": -1.0}, "finite seconds >= 0"),
    ({"partition_time": float("inf")}, "finite seconds >= 0"),
    ({"batch_size": 0}, "an int >= 1"),
    ({"straggler_policy": "wait"}, "'continue' or 'cancel'"),
    ({"error_feedback": True}, "needs top-kappa compression"),
])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_bad_network():
    with pytest.raises(ValueError, match="bytes per second > 0"):
        CommModel(bandwidth=0)
    with pytest.raises(ValueError, match="latency"):
        CommModel(alpha=-1e-3)


def test_min_error_decoder_needs_compression(tmp_path):
    assert get_scheme("bcgc", 6, 2, decoder="min-error").decoder == "min-error"
    with pytest.raises(ValueError, match="needs top-kappa compression"):
        simulate("bcgc", 6, 2, model="softmax", steps=2, partition_time=0.1,
                 scheme_options={"decoder": "min-error"}, records_path=tmp_path / "r.jsonl")
    assert not (tmp_path / "r.jsonl").exists()  # refused before the records file is opened


def test_optimizer_specs():
    from pgc_hvd.sim.run import make_optimizer
    import torch
    opt = make_optimizer("nesterov:lr=0.1")([torch.nn.Parameter(torch.zeros(2))])
    assert opt.defaults["nesterov"] and opt.defaults["momentum"] == 0.9
    with pytest.raises(ValueError, match="is not KEY=NUMBER"):
        make_optimizer("sgd:lr")
    with pytest.raises(ValueError, match="is not KEY=NUMBER"):
        make_optimizer("sgd:lr=fast")
    with pytest.raises(ValueError, match="unknown optimizer 'sdg'"):
        make_optimizer("sdg:lr=0.1")
