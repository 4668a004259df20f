"""The session's guard against a package thread left running (tests/session_guards.py, read by tests/conftest.py): a test that
starts an agent or a control-log reader and never stops it fails the session by name, instead
of the interpreter aborting at its exit after every test passed."""

import threading

from session_guards import leftover_threads


def test_a_thread_named_as_the_package_names_its_own_is_reported_until_it_ends():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="pgc-test-guard-agent", daemon=True)
    t.start()
    try:
        assert t in leftover_threads(grace=0.05)
    finally:
        stop.set()
    assert t not in leftover_threads(grace=5.0)       # the grace waits for one that is ending


def test_other_threads_are_not_the_guards_business():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="someone-elses-worker", daemon=True)
    t.start()
    try:
        assert t not in leftover_threads(grace=0.0)
    finally:
        stop.set()
        t.join()
