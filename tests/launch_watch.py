"""A launcher command run so that it cannot hang the test session (tests/conftest.py).

``subprocess.run(cmd, capture_output=True, timeout=T)`` waits until every process holding the
command's output pipes has closed them. Horovod's launcher forwards each rank's output until
end-of-file, and a rank's orphan keeps that pipe open: seen once, a DataLoader worker forked by
a rank deadlocked inside CPython's after-fork code (``PyOS_AfterFork_Child``), its rank exited,
and the launch of a group of entries then waited for its whole timeout (about 97 minutes),
longer than CI allows. Such an orphan is in no process tree of the launcher (it was reparented
to init) and in another session (Horovod's middleman calls ``setsid()``), so neither
``kill()`` nor a process-group kill reaches it.

:func:`run_watched` marks the command's environment with a token that every descendant
inherits, forks included (``/proc/<pid>/environ`` is the image's initial environment), and:

* when ``timeout`` seconds pass, or ``stall`` seconds pass without ``progress()`` moving (e.g.
  the newest file a grouped launch wrote), it kills every process carrying the token and raises
  :class:`subprocess.TimeoutExpired` with what the command printed;
* when the command itself has exited but its pipes are still open ``grace`` seconds later, it
  kills the token's processes (the orphans) and returns the command's result;
* at the end it kills whatever still carries the token, so no orphan loads the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from typing import Callable, Optional

TOKEN_VAR = "PGC_HVD_TEST_LAUNCH"


def processes_with(token: str, proc_root: str = "/proc") -> list[int]:
    """The pids whose initial environment holds ``TOKEN_VAR=token`` (this process excluded)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for name in os.listdir(proc_root):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(os.path.join(proc_root, name, "environ"), "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:   # gone meanwhile, or not ours to read
            continue
    return found


def kill_token(token: str) -> int:
    """SIGKILL every process carrying ``token``; returns how many were signalled."""
    n = 0
    for pid in processes_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


def run_watched(cmd: list, *, env: dict, cwd, timeout: float, stall: Optional[float] = None,
                progress: Optional[Callable[[], float]] = None,
                grace: float = 30.0) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` that cannot hang (module doc).
    ``progress()`` returns the time.time() of the command's latest sign of life."""
    token = uuid.uuid4().hex
    env = {**env, TOKEN_VAR: token}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(cwd))
    t0, exited_at = time.monotonic(), None
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=2.0)
                return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if proc.poll() is not None:          # exited; its pipes are held by an orphan
                exited_at = exited_at if exited_at is not None else now
                if now - exited_at > grace:
                    kill_token(token)
                continue
            quiet = time.time() - progress() if progress is not None else now - t0
            if now - t0 > timeout or (stall is not None and quiet > stall):
                kill_token(token)
                proc.kill()
                out, err = proc.communicate()
                why = (f"no progress for {quiet:.0f} s" if now - t0 <= timeout else
                       f"ran {now - t0:.0f} s")
                raise subprocess.TimeoutExpired(cmd, timeout, out + f"\n[launch_watch: {why}; "
                                                f"every process of the launch killed]", err)
    finally:
        kill_token(token)
