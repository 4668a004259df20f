"""Ranks started on one machine keep their traffic on the loopback interface.

Each test starts ranks through one of the project's local launchers -- the ``horovodrun`` and
``torchrun`` fixtures, ``pgc_hvd.apps.local_ranks.run_ranks`` (the benchmarks' launcher) and ``launch/run_local.sh`` -- with
``loopback_checks.py``, which reads on every rank the addresses of its own established TCP
connections after a collective (from ``/proc``) and fails when one is outside 127.0.0.0/8 or
::1. The ssh "remote" hosts of ``launch/local_hosts.py`` are checked in
``tests/multihost/test_loopback_hosts.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from checks import on_loopback
from launch_watch import run_watched

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = HERE / "scripts" / "loopback_checks.py"
# the torchrun fixture's check is an entry of the session's torchrun -np 2 launch (last: the
# script ends with hvd.shutdown()), through the fixture's launcher: it sees that launch's
# connections; the horovodrun one keeps its own launch (that group's last entry is taken)
LAUNCH_GROUPS = [("torchrun", 2, [("loopback", "test_torchrun_fixture_keeps_ranks_on_loopback",
                                   SCRIPT, [])], "last")]

needs_horovod = pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                                   reason="horovod is not installed (run bash launch/setup.sh)")


@pytest.mark.multirank
def test_horovodrun_fixture_keeps_ranks_on_loopback(horovodrun):
    proc = horovodrun(2, SCRIPT, timeout=180)
    assert "--network-interface lo" in " ".join(proc.args)
    on_loopback(proc.stdout, 2, "lo")


@pytest.mark.multirank
def test_torchrun_fixture_keeps_ranks_on_loopback(launch_group, request):
    proc = launch_group(request, "torchrun", 2).ran("loopback")
    on_loopback(proc.stdout, 2, "lo")


@pytest.mark.multirank
@needs_horovod
def test_benchmark_launcher_keeps_ranks_on_loopback():
    from pgc_hvd.apps.local_ranks import run_ranks
    lines = []
    res = run_ranks(2, str(SCRIPT), [], timeout=180, on_line=lines.append)
    assert res["n"] == 2 and res["outside"] == [] and res["pinned"] == "lo", res
    on_loopback("\n".join(lines), 2, "lo")


@pytest.mark.multirank
@needs_horovod
def test_run_local_sh_keeps_ranks_on_loopback(tmp_path):
    if not Path(sys.executable).with_name("horovodrun").exists():
        pytest.skip("run_local.sh runs the venv's horovodrun; this python's folder has none")
    env = dict(os.environ, SCRIPT=str(SCRIPT), TIMEOUT="180",
               PGC_HVD_VENV=str(Path(sys.executable).parent.parent))
    proc = run_watched(["bash", str(ROOT / "launch" / "run_local.sh"), "2"], env=env,
                       timeout=200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    on_loopback(proc.stdout, 2, "lo")
