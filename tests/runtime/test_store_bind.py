"""The control store (control="store" / "log") listens only on the address the ranks use
: pgc_hvd.runtime.store_address in one process, open_store on 2 ranks
(store_bind_checks.py under horovodrun)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from checks import passed

from pgc_hvd.runtime.store_address import (bind_address, check_reachable, interface_ipv4,
                                           listen)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "store_bind_checks.py"
# an entry of the session's horovodrun -np 2 launch (launch_group, tests/conftest.py)
TEST = "test_open_store_listens_on_the_ranks_address_only"
LAUNCH_GROUPS = [("horovodrun", 2, [("store-bind", TEST, SCRIPT, [])])]


def test_the_address_is_the_users_then_gloos_interface_then_master_addr():
    assert interface_ipv4("lo") == "127.0.0.1"
    both = {"PGC_HVD_STORE_ADDR": "localhost", "HOROVOD_GLOO_IFACE": "lo"}
    assert bind_address(both) == ("127.0.0.1", "PGC_HVD_STORE_ADDR=localhost")
    assert bind_address({"HOROVOD_GLOO_IFACE": "lo", "MASTER_ADDR": "localhost"})[0] == "127.0.0.1"
    assert "the interface gloo uses" in bind_address({"GLOO_SOCKET_IFNAME": "lo,eth9"})[1]
    assert bind_address({"MASTER_ADDR": "localhost"}) == ("127.0.0.1", "MASTER_ADDR=localhost")
    host = socket.gethostname()
    assert bind_address({}) == (socket.gethostbyname(host), f"rank 0's host name {host}")
    with pytest.raises(ValueError, match=r"HOROVOD_GLOO_IFACE: network interface 'nosuch0' has "
                                         r"no IPv4 address .*set PGC_HVD_STORE_ADDR"):
        bind_address({"HOROVOD_GLOO_IFACE": "nosuch0"})


def test_listening_is_on_that_address_only_and_an_unbindable_one_is_named():
    fd, port = listen("127.0.0.1", "test")
    with socket.socket(fileno=fd) as s:
        assert s.getsockname() == ("127.0.0.1", port)
    with pytest.raises(ValueError, match=r"rank 0 cannot listen on 203.0.113.7 \(why\).*"
                                         r"Set PGC_HVD_STORE_ADDR"):
        listen("203.0.113.7", "why")


def test_a_loopback_address_on_another_host_is_refused():
    check_reachable("127.0.0.1", socket.gethostname())
    check_reachable("203.0.113.7", "elsewhere")
    with pytest.raises(ValueError, match=r"listens on 127.0.0.1, a loopback address, but this "
                                         r"rank runs on .*, not on rank 0's host elsewhere"):
        check_reachable("127.0.0.1", "elsewhere")


@pytest.mark.multirank
def test_open_store_listens_on_the_ranks_address_only(launch_group, request):
    out = launch_group(request, "horovodrun", 2).ran("store-bind").stdout
    assert out.count("ALL OK rank=") == 2, out
    assert "STORE listens on ['127.0.0.1']" in out, out
    for check in ("listens_on_the_ranks_address", "unbindable_address_named"):
        assert {0, 1} <= set(passed(out).get(check, [])), out
