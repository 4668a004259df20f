"""Single-process checks of pgc_hvd.runtime.elastic.cascade (the fast leaving of a broken elastic
world): the /proc parsing, the choice of the world's sockets, and the shutdown itself on
real loopback sockets (Linux); the elastic state's use of it."""

from __future__ import annotations

import os
import socket
import sys
from types import SimpleNamespace

import pytest

from pgc_hvd.runtime.elastic import cascade as gc

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0
   1: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0
   2: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0
   3: 0100007F:C000 0100007F:2EE0 06 00000000:00000000 03:00000a2b 00000000     0        0 0 3 0
   4: 0100007F:C001 0100007F:2EE0 08 00000000:00000000 00:00000000 00000000     0        0 1004 1 0
   5: 0100007F:C002 0100007F:2EE0 01 00000000:00000000 00:00000000 00000000     0        0 1005 1 0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D000 01 00000000:00000000 00:00000000 00000000     0        0 2001 1 0
   1: 0000000000000000FFFF00000100007F:1F91 0000000000000000FFFF00000200007F:D001 01 00000000:00000000 00:00000000 00000000     0        0 2002 1 0
"""


def test_parse_proc_net_tcp_keeps_state_and_addresses_by_inode():
    t = gc.parse_proc_net_tcp(TCP)
    assert set(t) == {1001, 1002, 1003, 1004, 1005}     # the TIME_WAIT row (inode 0) left out
    assert t[1001] == ("0A", "0100007F:1F90", "00000000:0000")
    assert t[1002][0] == gc.ESTABLISHED and t[1004][0] == "08"
    assert gc.parse_proc_net_tcp("header only\n") == {}


def test_endpoints_ipv4_ipv6_and_mapped():
    assert gc.endpoint("0100007F:1F90") == ("127.0.0.1", 8080)
    assert gc.endpoint("0500007F:0016") == ("127.0.0.5", 22)
    t6 = gc.parse_proc_net_tcp(TCP6)
    assert gc.endpoint(t6[2001][1]) == ("::1", 8080)
    assert gc.endpoint(t6[2002][2]) == ("127.0.0.2", 0xD001)   # v4-mapped: the v4 address


def test_socket_inode_of_fd_links():
    assert gc.socket_inode("socket:[12345]") == 12345
    assert gc.socket_inode("pipe:[7]") is None
    assert gc.socket_inode("/dev/null") is None
    assert gc.socket_inode("socket:[x]") is None


def test_select_world_takes_new_established_connections_only():
    table = gc.parse_proc_net_tcp(TCP)
    fds = {1001: 3, 1002: 4, 1003: 5, 1004: 6, 1005: 7, 9999: 8}   # 9999: a unix socket
    # 1001 listening, 1004 CLOSE_WAIT, 1005 opened before the mark
    assert gc.select_world(before={1005}, table=table, fds=fds) == {1002, 1003}
    assert gc.select_world(before=set(), table=table, fds=fds) == {1002, 1003, 1005}
    # the rendezvous server's connections are never the world's
    assert gc.select_world(before=set(), table=table, fds=fds,
                           exclude=[("127.0.0.1", 12000)]) == {1002, 1003}
    # another process's sockets (not among this process's fds) are not either
    assert gc.select_world(before=set(), table=table, fds={1002: 4}) == {1002}


def test_rendezvous_endpoints_from_the_environment():
    assert gc.rendezvous_endpoints({}) == []
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242"}
    assert ("127.0.0.1", 4242) in gc.rendezvous_endpoints(env)


def test_without_proc_every_method_is_a_no_op(tmp_path):
    s = gc.GlooSockets(proc=str(tmp_path / "none"))
    assert not s.available
    s.mark()
    assert s.adopt() == 0 and s.world == set() and s.cascade() == 0


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    return srv, cli, acc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_cascade_shuts_down_the_worlds_sockets_and_nothing_else():
    old_srv, old_cli, old_acc = _pair()       # opened before the mark: not the world's
    s = gc.GlooSockets()
    assert s.available
    srv, cli, acc = _pair()                   # the "world" (both ends live in this process)
    try:
        found = s.adopt()
        assert s.world == {os.fstat(cli.fileno()).st_ino, os.fstat(acc.fileno()).st_ino}, found
        cli.settimeout(5)
        assert s.cascade() == 2
        assert cli.recv(1) == b""             # end-of-file at once, not after a timeout
        with pytest.raises(OSError):
            acc.send(b"x")                    # shut for writing too
        # the descriptors stay open (they are Horovod's to close); the duplicates are gone
        os.fstat(cli.fileno())
        os.fstat(acc.fileno())
        assert s.cascade() == 0               # the world is forgotten: a second call is a no-op
        # untouched: the connection from before the mark, and the listening socket
        old_cli.sendall(b"ok")
        assert old_acc.recv(2) == b"ok"
        srv.settimeout(0.01)
        with pytest.raises(socket.timeout):
            srv.accept()                      # still listening, no error
    finally:
        for sock in (old_srv, old_cli, old_acc, srv, cli, acc):
            sock.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_a_reused_descriptor_is_not_shut_down():
    s = gc.GlooSockets()
    srv, cli, acc = _pair()
    try:
        s.adopt()
        ino = os.fstat(cli.fileno()).st_ino
        assert not gc._shutdown(cli.fileno(), ino + 1)   # fd now names another socket
        assert gc._shutdown(cli.fileno(), ino)
    finally:
        for sock in (srv, cli, acc):
            sock.close()


class _Tracker:
    available = True

    def __init__(self):
        self.calls = []

    def cascade(self):
        self.calls.append("cascade")
        return 0

    def mark(self):
        self.calls.append("mark")

    def adopt(self, exclude=()):
        self.calls.append("adopt")
        return 0


def _state(cascade=True):
    torch = pytest.importorskip("torch")
    pytest.importorskip("horovod.common.elastic")
    from pgc_hvd.runtime.elastic import ElasticState

    model = torch.nn.Linear(2, 1)
    hvd = SimpleNamespace(rank=lambda: 0, size=lambda: 1)
    return ElasticState(model, torch.optim.SGD(model.parameters(), lr=0.1),
                        make_optimizer=lambda base: None, hvd=hvd, cascade=cascade)


def test_elastic_state_leaves_a_broken_world_from_the_agent_thread():
    exc = pytest.importorskip("horovod.common.exceptions")
    from pgc_hvd.runtime import AgentError

    state = _state()
    assert state._sockets is gc.SOCKETS       # on by default
    state._sockets = tracker = _Tracker()
    state._world_id = 3
    state._agent_stopped(AgentError("rank 1: the other ranks did not finish"), 3)
    assert tracker.calls == []                # not a broken world: nothing shut down
    try:
        raise AgentError("collective failed") from exc.HorovodInternalError("reset by peer")
    except AgentError as err:
        broken = err
    state._agent_stopped(broken, 2)           # an agent that outlived world 2: not this world's
    assert tracker.calls == []
    state._agent_stopped(broken, 3)
    assert tracker.calls == ["cascade", "mark"]
    state.restore()                           # Horovod's restore after the error: again, a no-op
    assert tracker.calls[2:] == ["cascade", "mark"]


def test_elastic_state_without_cascade_has_no_tracker():
    state = _state(cascade=False)
    assert state._sockets is None
    state._leave_world(broken=True)           # nothing to do, no error


def test_a_world_whose_sockets_were_not_found_is_said_with_the_fix(caplog):
    """Imported after hvd.init(), the module's mark already holds the first world's sockets:
    adopt finds none, and the state says so (the cascade cannot work in that world)."""
    state = _state()
    state._sockets = tracker = _Tracker()
    with caplog.at_level("WARNING", logger="pgc_hvd.runtime.elastic.state"):
        state._adopt_world(n=1, rank=0)          # alone: no peer sockets expected
        assert not caplog.records
        state._adopt_world(n=4, rank=2)
    assert tracker.calls == ["adopt", "adopt"] and state._world_id == 2
    assert "rank 2 found none of this world's gloo sockets" in caplog.text
    assert "import it before hvd.init()" in caplog.text
