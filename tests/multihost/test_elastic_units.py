"""Single-process checks of pgc_hvd.runtime.elastic and launch/local_hosts (no horovodrun)."""

from __future__ import annotations

import sys
from pathlib import Path

from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "launch"))

hvd_exc = pytest.importorskip("horovod.common.exceptions")


def test_world_error_follows_the_cause_chain():
    from pgc_hvd.runtime import AgentError
    from pgc_hvd.runtime.elastic import world_error

    try:
        try:
            raise hvd_exc.HorovodInternalError("gloo: connection reset by peer")
        except Exception as err:
            inner = AgentError("rank 1: collective pgc.ctl #4 failed")
            raise inner from err
    except AgentError as agent_err:
        try:
            raise AgentError(str(agent_err)) from agent_err   # the agent's re-raise
        except AgentError as outer:
            assert world_error(outer)
    assert not world_error(AgentError("rank(s) [2] failed (their training thread raised)"))
    # control='log': rank 0's store gone (the decider died), a census naming dead ranks
    assert world_error(AgentError("rank 1: control log: store unreachable", dead_ranks=(0,)))
    try:
        try:
            raise AgentError("collective failed", broken_world=True)
        except AgentError as inner:
            raise AgentError("census", hung_ranks=(2,)) from inner
    except AgentError as outer:
        assert world_error(outer)
    assert not world_error(AgentError("census over a live store", hung_ranks=(2,)))
    assert not world_error(ValueError("x"))


def test_optimizer_timeout_must_exceed_gloo_timeout(monkeypatch):
    from pgc_hvd.runtime.elastic import check_timeouts

    class Opt:
        config = SimpleNamespace(timeout=20.0, control="allgather")

    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "30")
    with pytest.raises(ValueError, match=r"timeout \(20 s\) must be longer than "
                                         r"HOROVOD_GLOO_TIMEOUT_SECONDS \(30 s\)"):
        check_timeouts(Opt())
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "8")
    check_timeouts(Opt())

    class StoreOpt(Opt):
        config = SimpleNamespace(timeout=60.0, control="store")

    with pytest.raises(ValueError, match="control='store' polls rows"):
        check_timeouts(StoreOpt())

    class LogOpt(Opt):   # the default plane is elastic-ready
        config = SimpleNamespace(timeout=60.0, control="log")

    check_timeouts(LogOpt())


def test_local_hosts_spec_and_hostfile(tmp_path):
    from local_hosts import LocalHosts

    lh = LocalHosts(count=3, workdir=str(tmp_path / "lh"))
    assert lh.hosts == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert lh.spec(2, count=2) == "127.0.0.2:2,127.0.0.3:2"
    path = lh.hostfile(tmp_path / "hf", slots=2, count=2)
    assert Path(path).read_text() == "127.0.0.2 slots=2\n127.0.0.3 slots=2\n"
    # horovodrun --hostfile reads it as the -H spec the launched test uses (test_multihost.py):
    # Horovod's own parser, so the hostfile recipe needs no launch of its own
    hosts = pytest.importorskip("horovod.runner.common.util.hosts")
    assert hosts.parse_host_files(path) == lh.spec(2, count=2)
    with pytest.raises(ValueError, match="addresses out of"):
        LocalHosts(count=300)
