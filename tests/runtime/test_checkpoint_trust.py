"""Checkpoints hold tensors and plain types and are read without running code:
pgc_hvd.runtime.plain, read_checkpoint, convert_checkpoint and the RNG states in one
process; load_checkpoint on 2 ranks (checkpoint_trust_checks.py under horovodrun)."""

from __future__ import annotations

import enum
import os
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import passed

from pgc_hvd.runtime.checkpoint import CheckpointError, convert_checkpoint, read_checkpoint
from pgc_hvd.runtime.optim_state import rng_state, set_rng_state
from pgc_hvd.runtime.plain import NotPlain, check_plain, dumps, loads

SCRIPT = Path(__file__).resolve().parent / "scripts" / "checkpoint_trust_checks.py"
# an entry of the session's horovodrun -np 2 launch (launch_group, tests/conftest.py)
TEST = "test_load_checkpoint_on_two_ranks_refuses_code_and_resumes_identically"
LAUNCH_GROUPS = [("horovodrun", 2, [("trust", TEST, SCRIPT, [])])]


class RunsCode:
    """Unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Colour(enum.IntEnum):
    RED = 1


def test_plain_accepts_state_dicts_and_names_what_it_refuses():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    ok = {"model": model.state_dict(), "opt": opt.state_dict(), "p": torch.nn.Parameter(
        torch.ones(2)), "misc": [None, True, 1, 2.5, 1j, "s", b"b", (1, 2), {3}, torch.Size([2]),
                                torch.float16, torch.device("cpu")], 7: OrderedDict(a=1)}
    check_plain(ok)
    assert loads(dumps(ok))["misc"][-3:] == [torch.Size([2]), torch.float16, torch.device("cpu")]
    cases = [({"best": np.float64(0.5)}, "extra['best'] is a numpy.float64", "float(x)"),
             ({"a": [1, {"arr": np.zeros(2)}]}, "extra['a'][1]['arr'] is a numpy.ndarray",
              "torch.from_numpy"),
             ({"c": Colour.RED}, "extra['c'] is a", "int(x)"),
             ({"f": len}, "extra['f'] is a builtins.builtin_function_or_method",
              "cannot be stored"),
             ({np.int64(3): 1}, "extra key np.int64(3)", "int(x)"),
             ({"o": object()}, "extra['o'] is a builtins.object", "state_dict()")]
    for obj, where, fix in cases:
        with pytest.raises(NotPlain) as err:
            check_plain(obj, "extra")
        assert where in str(err.value) and fix in str(err.value), str(err.value)
        assert "reading them runs no code" in str(err.value)


def test_rng_states_survive_a_weights_only_round_trip():
    random.gauss(0, 1), np.random.randn(3), torch.rand(2)
    state = loads(dumps(rng_state()))
    assert isinstance(state["numpy"]["key"], torch.Tensor) and state["numpy"]["key"].numel() == 624
    assert isinstance(state["python"]["state"], torch.Tensor)
    first = (torch.rand(4).tolist(), np.random.randn(4).tolist(), random.gauss(0, 1),
             [random.random() for _ in range(3)])
    set_rng_state(state)
    again = (torch.rand(4).tolist(), np.random.randn(4).tolist(), random.gauss(0, 1),
             [random.random() for _ in range(3)])
    assert first == again


def _a_checkpoint(path, extra=None, legacy=False):
    rng = rng_state()
    if legacy:   # what save_checkpoint wrote before: the generators' own tuples
        rng = {**rng, "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save({"model": {"w": torch.ones(2)}, "pgc": {"version": 3, "rng": rng},
                "extra": extra or {}}, path)
    return str(path)


def test_a_checkpoint_carrying_a_pickled_callable_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "code-ran"
    file = _a_checkpoint(tmp_path / "evil.rank0", extra={"x": RunsCode(marker)})
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(file)
    msg = str(err.value)
    assert f"checkpoint file {file} holds the globals ['posix.system']" in msg, msg
    assert "weights_only=True" in msg and "Do not load a file of unknown origin" in msg
    assert "save again with save_checkpoint" in msg
    with pytest.raises(CheckpointError):   # nor does the converter run it
        convert_checkpoint(file)
    assert not marker.exists(), "reading the checkpoint ran its command"


def test_an_earlier_checkpoint_is_refused_with_the_fix_and_converts_without_running_code(
        tmp_path):
    file = _a_checkpoint(tmp_path / "old.rank0", extra={"epoch": 3}, legacy=True)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(file)
    assert "written by an earlier pgc_hvd" in str(err.value)
    assert f"convert_checkpoint('{file}')" in str(err.value), str(err.value)
    before = torch.load(file, weights_only=False)["pgc"]["rng"]
    assert convert_checkpoint(file) == file
    state = read_checkpoint(file)
    assert state["extra"] == {"epoch": 3} and state["pgc"]["version"] == 3
    np.random.set_state(before["numpy"]), random.setstate(before["python"])
    want = (np.random.rand(3).tolist(), random.random())
    set_rng_state(state["pgc"]["rng"])
    assert (np.random.rand(3).tolist(), random.random()) == want
    # numpy scalars in an earlier file's extra become Python numbers; an array is named
    other = _a_checkpoint(tmp_path / "old2.rank0", extra={"best": np.float64(0.5)}, legacy=True)
    convert_checkpoint(other)
    best = read_checkpoint(other)["extra"]["best"]
    assert best == 0.5 and type(best) is float
    third = _a_checkpoint(tmp_path / "old3.rank0", extra={"hist": np.zeros(2)}, legacy=True)
    with pytest.raises(CheckpointError, match=r"\['extra'\]\['hist'\] is a numpy.ndarray"):
        convert_checkpoint(third)


@pytest.mark.multirank
def test_load_checkpoint_on_two_ranks_refuses_code_and_resumes_identically(launch_group, request):
    out = launch_group(request, "horovodrun", 2).ran("trust").stdout
    assert out.count("ALL OK rank=") == 2, out
    for check in ("resume_identical", "pickled_callable_refused", "legacy_converted"):
        assert {0, 1} <= set(passed(out).get(check, [])), out
