"""save_checkpoint / load_checkpoint on 2 ranks (each test launches checkpoint_checks.py under
horovodrun in a fresh folder). The restore round trip itself is checked in test_runtime.py."""

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "checkpoint_checks.py"


def _ran(proc, check):
    out = proc.stdout
    assert out.count("ALL OK rank=") == 2, out + proc.stderr
    assert all(f"CHECK {check} ok rank={r}" in out for r in (0, 1)), out


@pytest.mark.multirank
def test_refused_checkpoints_name_the_file_and_change_nothing(horovodrun):
    """Empty, truncated, foreign, key-less and wrong-shape files, a missing file, and files of
    another model, s or compression are refused on every rank with a CheckpointError naming the
    file, before the model, optimizer or RNG changes; the same objects then restore a good one."""
    _ran(horovodrun(2, SCRIPT, "refuse", timeout=240), "refused_checkpoints_change_nothing")


@pytest.mark.multirank
def test_ranks_agree_on_the_restored_step_or_all_refuse(horovodrun):
    """Files holding different steps, or one rank's file missing or damaged: every rank raises
    the same message naming each rank's step or problem, and none restores anything."""
    _ran(horovodrun(2, SCRIPT, "agree", timeout=240), "ranks_agree_or_all_refuse")


@pytest.mark.multirank
def test_save_fsyncs_and_removes_its_temporary_file(horovodrun):
    """A save fsyncs the file and its folder; a save whose torch.save fails or is interrupted
    (KeyboardInterrupt) leaves no .tmp and the previous checkpoint intact; an object that is
    not a tensor or plain type in ``extra`` is refused before anything is written."""
    _ran(horovodrun(2, SCRIPT, "save", timeout=240), "save_fsyncs_and_cleans_up")
