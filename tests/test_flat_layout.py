"""FlatLayout: parameters <-> segments of one flat vector (shared by the simulator and runtime)."""

from __future__ import annotations

import pytest
import torch

from pgc_hvd.flat_layout import FlatLayout


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_module_layout_round_trip():
    model = small_model()
    lay = FlatLayout.of_module(model)
    assert lay.names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert lay.dim == lay.numel == 3 * 4 + 4 + 4 * 2 + 2
    flat = lay.flatten()
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    named = lay.unflatten(flat)
    for name, p in model.named_parameters():
        assert torch.equal(named[name], p.detach())
    new = torch.arange(lay.dim, dtype=torch.float32)
    lay.load(new)
    assert torch.equal(lay.flatten(), new)
    # views write through to the flat vector
    buf = lay.zeros()
    for p, v in lay.views(buf):
        v.fill_(1.0)
    assert torch.equal(buf, torch.ones(lay.dim))


def test_frozen_parameters_are_left_out():
    model = small_model()
    model[0].weight.requires_grad_(False)
    lay = FlatLayout.of_module(model)
    assert lay.names == ["0.bias", "2.weight", "2.bias"]
    assert lay.signature() == [3, 4 + 8 + 2]
    with pytest.raises(KeyError):
        lay.view(lay.zeros(), model[0].weight)


def test_bad_input_is_named():
    model = small_model()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter requires a gradient"):
        FlatLayout.of_module(model)
    with pytest.raises(ValueError, match="2 names for 1 parameters"):
        FlatLayout([torch.nn.Parameter(torch.zeros(2))], ["a", "b"])
