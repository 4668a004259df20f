"""The package's threads a test left running (tests/conftest.py's session end reads it)."""

from __future__ import annotations

import threading
import time


#: the package's thread names end so (``runtime/agent.py``, ``runtime/control_log.py``)
PGC_THREAD_SUFFIXES = ("-agent", "-log-reader")
#: how long the session's end waits for a package thread still ending (an agent stopping)
THREAD_GRACE_S = 10.0


def leftover_threads(grace: float = THREAD_GRACE_S) -> list:
    """The package's threads still alive after ``grace`` seconds: an agent or a control-log
    reader that a test started and never stopped. One that outlives the session is stopped by
    the interpreter's exit in the middle of a wait, which aborts the process ("terminate called
    without an active exception", status 134) after every test passed."""
    deadline = time.monotonic() + grace
    while True:
        alive = [t for t in threading.enumerate()
                 if t is not threading.main_thread() and t.name.endswith(PGC_THREAD_SUFFIXES)]
        if not alive or time.monotonic() >= deadline:
            return alive
        alive[0].join(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
