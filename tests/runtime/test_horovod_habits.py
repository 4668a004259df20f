"""Multi-rank tests of Horovod users' habits (each launches horovod_habits_checks.py under horovodrun,
one rank slowed): schedulers, clipping, AMP, Horovod's keywords and fp16 compression,
broadcast_optimizer_state and the rank-0 resume, the user's own DataLoader, a rank-local lr.
Every training check ends with a cross-rank parameter hash (in the script). The runs share one
launch per world size (the ``launch_group`` fixture: np 3 and np 2), each run in the order
below."""

import re
from pathlib import Path

import pytest
from checks import passed_everywhere

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "horovod_habits_checks.py"

# runs that end on a refused step (clipping, broadcast, diverge; own_loader at np 2) come after
# the clean ones: the optimizers they leave are closed or aborted when the run ends
NP3 = [(mode, test, SCRIPT, [mode]) for mode, test in (
    ("schedulers", "test_schedulers_step_once_per_update_on_every_rank"),
    ("amp", "test_amp_bf16_autocast_and_grad_scaler"),
    ("metrics", "test_metrics_read_from_the_control_rows"),
    ("cancel", "test_cancel_policy_in_the_runtime"),
    ("clipping", "test_clipping_the_horovod_way_and_the_plain_way"),
    ("broadcast", "test_broadcast_optimizer_state_and_rank0_resume"),
    ("diverge", "test_different_step_counts_and_rank_local_lr_are_named_at_close"))]
NP2 = [(mode, test, SCRIPT, [mode]) for mode, test in (
    ("surface", "test_horovod_keywords_fp16_and_refusals"),
    ("zero_grad", "test_zero_grad_between_backward_and_step_raises"),
    ("own_loader", "test_own_dataloader_works_with_dgd_and_is_refused_with_pgc"))]


LAUNCH_GROUPS = [("horovodrun", 3, NP3), ("horovodrun", 2, NP2)]


def _checks(proc, np_):
    """The checks every one of the np_ ranks reported ok."""
    return passed_everywhere(proc.stdout, np_)


def _clear_errors(proc):
    assert "NO-ERROR" not in proc.stdout, proc.stdout + proc.stderr
    return [m.group(2) for m in re.finditer(r"CLEAR-ERROR rank=(\d+): (.*)", proc.stdout)]


@pytest.mark.multirank
def test_schedulers_step_once_per_update_on_every_rank(hvd3):
    """StepLR built before the wrap, MultiStepLR after it, both stepped once per step() call,
    and an lr set from the loop counter, with a straggler that catches up: every rank applies
    update i with lr(i); N step() calls end at version N; parameters identical."""
    proc = hvd3.ran("schedulers")
    assert _checks(proc, 3) >= {"scheduler_before_wrap", "scheduler_per_step_call",
                                "lr_from_loop_counter"}, proc.stdout + proc.stderr


@pytest.mark.multirank
def test_clipping_the_horovod_way_and_the_plain_way(hvd3):
    proc = hvd3["clipping"]
    assert _checks(proc, 3) >= {"clip_decoded_update", "clip_partition_gradient",
                                "clip_after_multi_partition_loop_refused"}, \
        proc.stdout + proc.stderr
    errors = _clear_errors(proc)
    assert errors and all("synchronize()" in e for e in errors if "p.grad was changed" in e)


@pytest.mark.multirank
def test_amp_bf16_autocast_and_grad_scaler(hvd3):
    """bf16 autocast + GradScaler on the CPU: an overflowing rank's messages are left out like
    a straggler's; with an exact (power-of-two) scale the run equals the unscaled one."""
    proc = hvd3.ran("amp")
    assert _checks(proc, 3) >= {"amp_overflow_is_a_straggler", "amp_scale_exact"}, \
        proc.stdout + proc.stderr


@pytest.mark.multirank
def test_horovod_keywords_fp16_and_refusals(hvd2):
    assert_surface(hvd2["surface"])


def assert_surface(proc):
    assert _checks(proc, 2) >= {"horovod_keywords_accepted", "fp16_compression", "op_sum",
                                "backward_passes_per_step", "refused_keywords",
                                "extra_backward_refused"}, proc.stdout + proc.stderr
    errors = " ".join(_clear_errors(proc))
    for phrase in ("Adasum is refused", "backward_passes_per_step must be",
                   "needs op=hvd.Average", "more than backward_passes_per_step=1"):
        assert phrase in errors, errors


@pytest.mark.multirank
def test_broadcast_optimizer_state_and_rank0_resume(hvd3):
    assert_broadcast(hvd3["broadcast"])


def assert_broadcast(proc):
    assert _checks(proc, 3) >= {"broadcast_optimizer_state_before_wrap",
                                "broadcast_optimizer_state_after_wrap",
                                "resume_rank0_loads_then_broadcasts", "resume_refusals"}, \
        proc.stdout + proc.stderr
    errors = _clear_errors(proc)
    assert sum("start at different model versions" in e for e in errors) == 3, errors
    assert any("scheme='bcgc'" in e for e in errors), errors


@pytest.mark.multirank
def test_own_dataloader_works_with_dgd_and_is_refused_with_pgc(hvd2):
    proc = hvd2["own_loader"]
    assert _checks(proc, 2) >= {"own_loader_dgd", "own_loader_pgc_refused"}, \
        proc.stdout + proc.stderr
    errors = _clear_errors(proc)
    assert any("outside optimizer.batches(loader)" in e for e in errors), errors


@pytest.mark.multirank
def test_different_step_counts_and_rank_local_lr_are_named_at_close(hvd3):
    proc = hvd3["diverge"]
    assert _checks(proc, 3) >= {"different_step_counts_named", "rank_local_lr_named"}, \
        proc.stdout + proc.stderr
    errors = _clear_errors(proc)
    assert len(errors) == 3 and all("hyper-parameters" in e for e in errors), errors


@pytest.mark.multirank
def test_metrics_read_from_the_control_rows(hvd3):
    """opt.metrics: the decided step's mean loss and a user metric, the same on every rank and
    equal to the mean over the used messages of what their ranks sent, with no collective."""
    assert_metrics(hvd3.ran("metrics"))


def assert_metrics(proc):
    assert _checks(proc, 3) >= {"metrics_from_control_rows"}, proc.stdout + proc.stderr


@pytest.mark.multirank
def test_zero_grad_between_backward_and_step_raises(hvd2):
    """zero_grad() after the last backward and before step() raises as Horovod's does, instead
    of a zero update (dgd) or a message without the last partition (gc-cr); the gradient is
    kept and step() applies it: the parameters move, identically on every rank."""
    proc = hvd2.ran("zero_grad")
    errors = _clear_errors(proc)
    assert _checks(proc, 2) >= {"zero_grad_before_step_refused"}, proc.stdout + proc.stderr
    assert len(errors) == 4 and all("AssertionError" in e for e in errors), errors


@pytest.mark.multirank
def test_cancel_policy_in_the_runtime(hvd3):
    """straggler_policy="cancel" on real ranks: the slow rank abandons the steps that fire
    without it, its injected delays cut short; every rank ends at the same version with the
    same parameters."""
    proc = hvd3.ran("cancel")
    assert _checks(proc, 3) >= {"cancel_policy_runtime"}, proc.stdout + proc.stderr
