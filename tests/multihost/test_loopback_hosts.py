"""The ssh "remote" hosts of launch/local_hosts.py keep gloo on the loopback interface.

``LocalHosts.horovodrun_args()`` carries ``--network-interface lo``. Without it horovodrun
(0.28.1) probes the hosts' common interfaces and takes the first of a set: on a machine with
``lo`` and ``eth0`` that is ``eth0`` in about half the runs, depending on the string hash seed
(``PYTHONHASHSEED=1`` gives ``eth0`` here), and the ranks talk over the machine's network
address. The test fixes that seed, runs tests/multirank/scripts/loopback_checks.py on two such hosts and
requires every rank's connections on loopback with gloo pinned to ``lo``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "launch"))
from checks import on_loopback  # noqa: E402

SCRIPT = ROOT / "tests" / "multirank" / "scripts" / "loopback_checks.py"


@pytest.mark.multirank
def test_local_ssh_hosts_keep_ranks_on_loopback(tmp_path, two_hosts):
    exe, lh = two_hosts
    assert lh.horovodrun_args()[-2:] == ["--network-interface", "lo"]
    env = lh.env()
    env.update(OMP_NUM_THREADS="1", PYTHONHASHSEED="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    before = lh.accepted_logins()
    cmd = [str(exe), "--gloo", "-np", "2", "-H", lh.spec(1), *lh.horovodrun_args(),
           sys.executable, str(SCRIPT)]
    proc = run_watched(cmd, env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    on_loopback(proc.stdout, 2, "lo")
    assert lh.accepted_logins() >= before + 2, "horovodrun did not go through ssh"
