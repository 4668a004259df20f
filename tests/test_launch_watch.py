"""The test launchers cannot hang on an orphan that holds their output open, nor on a launch
that stopped making progress (tests/launch_watch.py). Plain Python commands, no Horovod."""

import subprocess
import sys
import time

import pytest
from launch_watch import run_watched

# the parent exits at once; its forked child keeps stdout open and sleeps (an orphan, as a
# DataLoader worker stuck after fork was)
ORPHAN = ("import os, sys, time\n"
          "if os.fork() == 0:\n"
          "    open('orphan.pid', 'w').write(str(os.getpid()))\n"
          "    time.sleep(600)\n"
          "print('parent done', flush=True)\n")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_an_orphan_holding_the_output_is_killed_after_the_grace(tmp_path):
    t0 = time.monotonic()
    proc = run_watched([sys.executable, "-c", ORPHAN], env={"PATH": "/usr/bin:/bin"},
                       cwd=tmp_path, timeout=120, grace=1.0)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 0 and "parent done" in proc.stdout
    pid = int((tmp_path / "orphan.pid").read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the orphan outlived the launch"


def test_a_launch_without_progress_is_killed_with_its_output(tmp_path):
    start = time.time()
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(600)"]
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_watched(cmd, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=120, stall=2.0,
                    progress=lambda: start)
    assert "started" in err.value.output and "no progress" in err.value.output
