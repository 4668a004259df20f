"""save_checkpoint / load_checkpoint on 2 ranks (checkpoint_checks.py under horovodrun: the three
runs share one launch, ``launch_group``, each in a fresh folder). The restore round trip itself
is checked in test_runtime.py."""

from pathlib import Path

import pytest
from checks import passed

SCRIPT = Path(__file__).resolve().parent / "scripts" / "checkpoint_checks.py"
RUNS = [("refuse", "test_refused_checkpoints_name_the_file_and_change_nothing", SCRIPT, ["refuse"]),
        ("agree", "test_ranks_agree_on_the_restored_step_or_all_refuse", SCRIPT, ["agree"]),
        ("save", "test_save_fsyncs_and_removes_its_temporary_file", SCRIPT, ["save"])]


LAUNCH_GROUPS = [("horovodrun", 2, RUNS)]


def _ran(proc, check):
    out = proc.stdout
    assert out.count("ALL OK rank=") == 2, out + proc.stderr
    assert {0, 1} <= set(passed(out).get(check, [])), out


@pytest.mark.multirank
def test_refused_checkpoints_name_the_file_and_change_nothing(hvd2):
    """Empty, truncated, foreign, key-less and wrong-shape files, a missing file, and files of
    another model, s or compression are refused on every rank with a CheckpointError naming the
    file, before the model, optimizer or RNG changes; the same objects then restore a good one."""
    _ran(hvd2.ran("refuse"), "refused_checkpoints_change_nothing")


@pytest.mark.multirank
def test_ranks_agree_on_the_restored_step_or_all_refuse(hvd2):
    """Files holding different steps, or one rank's file missing or damaged: every rank raises
    the same message naming each rank's step or problem, and none restores anything."""
    _ran(hvd2.ran("agree"), "ranks_agree_or_all_refuse")


@pytest.mark.multirank
def test_save_fsyncs_and_removes_its_temporary_file(hvd2):
    """A save fsyncs the file and its folder; a save whose torch.save fails or is interrupted
    (KeyboardInterrupt) leaves no .tmp and the previous checkpoint intact; an object that is
    not a tensor or plain type in ``extra`` is refused before anything is written."""
    _ran(hvd2.ran("save"), "save_fsyncs_and_cleans_up")


def _state(s: int, ring: int, n: int = 4, scheme: str = "pgc-cr", rank: int = 1, groups=(2,)):
    """A ``pgc_state_dict()``'s shape: torch's state, the run's keys, a ring of ``ring`` slots."""
    import torch
    return {"optimizer": {"state": {}, "param_groups": [{"params": list(range(k))} for k in groups]},
            "version": 7, "scheme": scheme, "n": n, "s": s, "rank": rank,
            "ring": [torch.zeros(3)] * ring, "slot_versions": [0] * ring, "residual": None,
            "rng": {}}


def test_a_state_of_another_s_under_auto_needs_the_same_run_and_groups_only():
    """``load_checkpoint`` under ``stragglers="auto"`` checks a file of another s with
    ``other_s``: another s and ring pass (only torch's state and the step are restored); another
    world size, rank, scheme or parameter groups are still refused, and a fixed s refuses
    another s."""
    from pgc_hvd.runtime.checkpoint import CheckpointError, check_pgc_state
    current, saved = _state(0, 0), _state(1, 1)
    check_pgc_state(saved, current, "f", other_s=True)
    with pytest.raises(CheckpointError, match="saved with s=1, this run has s=0"):
        check_pgc_state(saved, current, "f")
    for bad, words in ((_state(1, 1, n=3), "n=3"), (_state(1, 1, rank=2), "rank=2"),
                       (_state(1, 1, scheme="bcgc"), "scheme='bcgc'"),
                       (_state(1, 1, groups=(3,)), "parameter groups")):
        with pytest.raises(CheckpointError, match=words):
            check_pgc_state(bad, current, "f", other_s=True)
