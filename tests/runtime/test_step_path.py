"""The path of one step: one steady-state step of dense pgc-cr on the default control
plane, from ``opt.batches(loader)`` to the return of ``opt.step()``, both threads, the loader
and the kernels' Python side included, enters at most :data:`MAX_MODULES` pgc_hvd modules (the
union over the ranks of np 2; tests/runtime/scripts/step_path_checks.py profiles it with
``sys.setprofile`` / ``threading.setprofile``). A newcomer follows a step through that many
files; docs/architecture.md, "The path of one step", says why each is on it."""

import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "step_path_checks.py"

#: the pinned bound (14; it was 28 before the runtime was split into parts)
MAX_MODULES = 14
#: the DDP door's step: the same path plus the door (runtime/ddp.py), its sampler
#: (data/coded_sampler.py) and the torch engine's two modules (torchdist/ops.py, world.py:
#: Horovod's own modules, on the Horovod door's path, are not pgc_hvd's and not counted)
MAX_DDP_MODULES = MAX_MODULES + 4


def entered(stdout: str) -> dict[str, str]:
    """``{module: threads}`` over every rank's ``STEP-PATH-MODULE`` lines."""
    out: dict[str, set] = {}
    for m in re.finditer(r"STEP-PATH-MODULE rank=\d+ (\S+) (\S+)", stdout):
        out.setdefault(m.group(2), set()).update(m.group(1).split("+"))
    return {mod: "+".join(sorted(kinds)) for mod, kinds in sorted(out.items())}


@pytest.mark.multirank
def test_one_step_enters_few_modules(horovodrun):
    proc = horovodrun(2, SCRIPT, timeout=240)
    assert proc.stdout.count("ALL OK rank=") == 2, proc.stdout + proc.stderr
    mods = entered(proc.stdout)
    listing = "\n".join(f"  {threads:12s} {mod}" for mod, threads in mods.items())
    print(f"one step of dense pgc-cr enters {len(mods)} pgc_hvd modules:\n{listing}")
    assert "runtime/optimizer.py" in mods and "runtime/agent.py" in mods, listing  # it profiled
    assert len(mods) <= MAX_MODULES, (
        f"one step enters {len(mods)} pgc_hvd modules (at most {MAX_MODULES}): merge a small "
        f"part into the part it serves (docs/architecture.md, 'The path of one step'):\n{listing}")


@pytest.mark.multirank
def test_one_ddp_door_step_enters_few_modules(torchrun):
    proc = torchrun(2, SCRIPT, "ddp", timeout=240)
    assert proc.stdout.count("ALL OK rank=") == 2, proc.stdout + proc.stderr
    mods = entered(proc.stdout)
    listing = "\n".join(f"  {threads:12s} {mod}" for mod, threads in mods.items())
    print(f"one step of the DDP door (pgc-cr) enters {len(mods)} pgc_hvd modules:\n{listing}")
    assert "runtime/ddp.py" in mods and "runtime/agent.py" in mods, listing
    assert len(mods) <= MAX_DDP_MODULES, (
        f"one DDP-door step enters {len(mods)} pgc_hvd modules (at most {MAX_DDP_MODULES}):\n"
        f"{listing}")
