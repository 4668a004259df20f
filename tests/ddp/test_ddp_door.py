"""The DDP door under torchrun (horovod hidden from the ranks): PyTorch's DDP tutorial shape
(launch/ddp_tutorial.py) with its three changed lines for every scheme family, a slowed rank, the
habits of DDP scripts, the refusals, and a dead rank."""

from pathlib import Path

import pytest
from checks import all_ok, passed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TUTORIAL = ROOT / "launch" / "ddp_tutorial.py"
CHECKS = HERE / "ddp_checks.py"
#: a rank that dies mid-run or before its first step: side by side with the other faults
FAULT_LAUNCHES = [("torchrun", 3, m, "test_dead_rank_every_survivor_raises_agent_error_naming_it",
                   CHECKS, [m]) for m in ("dead", "dead-first")]


def _params(proc):
    lines = [l.split("PARAMS ", 1)[1] for l in proc.stdout.splitlines() if "PARAMS " in l]
    assert len(lines) == 1, proc.stdout + proc.stderr
    fields = dict(f.split("=") for f in lines[0].split()[1:])
    return lines[0].split()[0], fields


def _checks(proc, np_):
    """The checks any rank passed, once every rank got to the end (tests/checks.py)."""
    assert all_ok(proc.stdout) == np_, proc.stdout + proc.stderr
    return set(passed(proc.stdout))


@pytest.mark.multirank
@pytest.mark.parametrize("np_,args", [
    (4, ["--scheme", "pgc-cr", "--slow-rank", "3", "--slow", "0.03"]),
    (3, ["--scheme", "bcgc"]),
    (2, ["--scheme", "gc-cr"]),
    (3, ["--scheme", "bounded-staleness", "--slow-rank", "1", "--slow", "0.03"]),
])
def test_ddp_tutorial_three_lines_identical_parameters(torchrun, np_, args):
    """The tutorial's loop, validation and dist.all_reduce of the validation loss on the default
    group, unchanged but for the wrap, the sampler and the optimizer: every rank ends with the
    same parameters (the script compares their digests and exits non-zero otherwise), every
    step applied (E steps an epoch, B = 32), and it learns."""
    proc = torchrun(np_, TUTORIAL, "--door", "pgc", "--epochs", "2", *args, timeout=240)
    _, fields = _params(proc)
    assert int(fields["steps"]) == 2 * int(fields["per_epoch"]), fields
    if args[1] in ("pgc-cr", "dgd", "bounded-staleness"):    # one partition a step, B rows
        assert int(fields["per_epoch"]) == (1440 // np_) // 32, fields
    assert float(fields["acc"]) > 0.6, proc.stdout


@pytest.mark.multirank
def test_ddp_tutorial_diff_is_three_lines():
    """The porting guide's promise, read off the script itself: the pgc branch differs from the
    DDP branch in three lines (wrap, sampler, optimizer), all marked ``# pgc``."""
    text = TUTORIAL.read_text()
    assert text.count("  # pgc") == 3
    assert "pgc_hvd.CodedSampler(" in text and "pgc_hvd.DistributedDataParallel(" in text
    assert "model.distributed_optimizer(" in text


@pytest.mark.multirank
def test_ddp_door_refusals(torchrun):
    """Each refusal on every rank with its fix, the run going on after them; then two models
    one after the other with unbound samplers (a closed door feeds no sampler); at s = 0 the
    door trains DDP's model with DistributedSampler's batches."""
    proc = torchrun(2, CHECKS, "refusals", timeout=180)
    assert {"syncbatchnorm_refused", "forward_before_optimizer_refused",
            "batch_size_mismatch_refused", "accumulation_refused", "trains_after_refusals",
            "complex_scheme_refused", "sequential_models", "no_reference_cycles_per_step",
            "auto_switch_through_the_door", "same_as_ddp"} <= _checks(proc, 2)


@pytest.mark.multirank
def test_ddp_door_habits_amp_compile_checkpoint(torchrun, tmp_path):
    """model.module, state_dict keys, no_sync(), bf16 autocast with a GradScaler,
    torch.compile(model), a per-step LR scheduler, a DataLoader with workers, rank 0's checkpoint
    resumed on every rank; identical parameters at the end."""
    proc = torchrun(2, CHECKS, "habits", tmp_path, timeout=300)
    assert {"amp_compile_no_sync_scheduler", "checkpoint_resume"} <= _checks(proc, 2)
    params = {l.split("PARAMS ")[1] for l in proc.stdout.splitlines() if "PARAMS " in l}
    assert len(params) == 1, proc.stdout


@pytest.mark.multirank
@pytest.mark.parametrize("mode", ["dead", "dead-first"])
def test_dead_rank_every_survivor_raises_agent_error_naming_it(fault, mode):
    """A rank that exits mid-run, or before its first step (the engine's groups not yet
    connected to it): every survivor raises AgentError naming it, within the timeout (8 s)."""
    proc = fault(mode)
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("rank 2 (pid" in l or "rank(s) [2]" in l for l in clear), clear
    assert all(float(l.split(" after ")[1].split("s:")[0]) < 30 for l in clear), clear
    assert "NO-ERROR" not in proc.stdout


QUICKSTART = ROOT / "launch" / "ddp_quickstart.py"


def test_readme_shows_the_ddp_quickstart_code():
    body = QUICKSTART.read_text().split("\n", 1)[1]
    body = body[: body.index("\nwith torch.no_grad()")]
    assert body.strip() in (ROOT / "README.md").read_text()


@pytest.mark.multirank
def test_ddp_quickstart_trains_on_two_ranks(torchrun):
    import re
    proc = torchrun(2, QUICKSTART, timeout=180)
    got = re.findall(r"ddp quickstart: (\d+) updates, training accuracy ([0-9.]+)", proc.stdout)
    assert len(got) == 2, proc.stdout + proc.stderr
    assert all(int(u) == 5 * ((1797 // 2) // 32) and float(a) > 0.85 for u, a in got), got
