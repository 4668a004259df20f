"""The control rounds through a key-value store on their own, in one process:
:func:`~pgc_hvd.runtime.control_store.open_store` and
:class:`~pgc_hvd.runtime.control_store.StoreChannel` on a real ``torch.distributed.TCPStore``
served on 127.0.0.1, n ranks as n threads (tests/runtime/thread_world.py: the address moves in
the real broadcast of a gloo group per rank). The rounds' rows written and read in rank order,
the keys of old rounds deleted, the address the server listens on, a failure to listen raised on
every rank, the bye at the end (rank 0 waits for every rank, not forever), and the errors naming
the ranks that did not answer or the server that is gone. The horovodrun tests
(tests/runtime/scripts/runtime_checks.py with ``control="store"``, store_bind_checks.py) cover the same
through the optimizer."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from pgc_hvd.runtime.agreement import poll_until
from pgc_hvd.runtime.control_store import StoreChannel, open_store, say_bye
from pgc_hvd.runtime.errors import AgentError
from thread_world import in_world  # tests/runtime/thread_world.py


@pytest.fixture(autouse=True)
def loopback(monkeypatch):
    monkeypatch.setenv("PGC_HVD_STORE_ADDR", "127.0.0.1")


def row(rank: int, k: int) -> torch.Tensor:
    return torch.tensor([rank, k, rank * 0.5 + k / 3, -1.0], dtype=torch.float64)


def test_every_rank_reads_every_rank_row_of_each_round_in_rank_order():
    n, rounds = 3, 6

    def body(rank, ops):
        store, connect = open_store(ops, rank, "t-rounds", timeout=20)
        ch = StoreChannel(store, rank, n, "t-rounds", timeout=20)
        got, live = [], []
        for k in range(rounds):
            rows, payloads = ch.exchange(row(rank, k))
            assert payloads == {}
            got.append(rows)
            # a rank at round k has read round k - 1 completely: its key of k - 2 is gone
            live.append([store.check([f"pgc/t-rounds/{j}/{rank}"]) for j in range(k + 1)])
        side = connect(5)   # one more client of the same server (the agent's own thread)
        host = (store.host, side.host)
        ops_count, last = ch.ops, ch.round
        ch.close()
        return got, live, host, ops_count, last

    for rank, (got, live, host, ops_count, last) in enumerate(in_world(n, body)):
        for k, rows in enumerate(got):
            assert rows == [row(w, k).tolist() for w in range(n)]
        assert live[-1] == [False] * (rounds - 2) + [True, True]
        assert host == ("127.0.0.1", "127.0.0.1")     # PGC_HVD_STORE_ADDR, the ranks' address
        assert last == rounds
        assert ops_count == 2 * rounds + (rounds - 2)  # set + multi_get, delete from round 2


def test_a_failure_to_listen_is_raised_on_every_rank(monkeypatch):
    monkeypatch.setenv("PGC_HVD_STORE_ADDR", "203.0.113.7")   # TEST-NET-3: not this host's

    def body(rank, ops):
        with pytest.raises(ValueError) as err:
            open_store(ops, rank, "t-bind", timeout=5)
        return str(err.value)

    for rank, msg in enumerate(in_world(2, body)):
        assert msg.startswith(f"rank {rank}: control store of 't-bind': rank 0 cannot listen on "
                              f"203.0.113.7 (PGC_HVD_STORE_ADDR=203.0.113.7)"), msg
        assert "Set PGC_HVD_STORE_ADDR" in msg


def one_rank_store(name: str, timeout: float):
    """Rank 0's server (a world of one rank) and a ``connect`` for the clients of other
    ranks, played by this thread."""
    return in_world(1, lambda rank, ops: open_store(ops, 0, name, timeout))[0]


def test_a_round_that_misses_a_rank_names_it_within_the_timeout():
    """n = 3, rank 2 never answers: ranks 0 (the server) and 1 (a client) each raise within the
    1 s timeout, naming rank 2 (and not rank 1, whose row is there)."""
    store, connect = one_rank_store("t-missing", timeout=1)
    errors: dict = {}

    def play(ch):
        try:
            ch.exchange(row(ch.rank, 0))
        except AgentError as err:
            errors[ch.rank] = (str(err), time.monotonic() - t0)

    t0 = time.monotonic()
    rank1 = threading.Thread(target=play, args=(StoreChannel(connect(1), 1, 3, "t-missing",
                                                             timeout=1),))
    rank1.start()
    assert poll_until(lambda: store.check(["pgc/t-missing/0/1"]), 5)   # rank 1's row is in
    play(StoreChannel(store, 0, 3, "t-missing", timeout=1))
    rank1.join(10)
    assert sorted(errors) == [0, 1]
    for rank, (msg, took) in errors.items():
        assert msg.startswith(f"rank {rank}: control round 0: rank(s) [2] did not answer within "
                              f"1s: a rank has died or hung; stopping instead of hanging"), msg
        assert took < 10


def test_a_round_after_the_server_is_gone_says_so():
    store, connect = one_rank_store("t-gone", timeout=1)
    client = StoreChannel(connect(1), 1, 2, "t-gone", timeout=1)
    del store, connect   # rank 0's server shuts down
    gc.collect()
    with pytest.raises(AgentError, match=r"^rank 1: control round 0 failed: the control store "
                                         r"on rank 0 is unreachable \(rank 0 died or shut "
                                         r"down\); stopping"):
        client.exchange(row(1, 0))


def test_rank_0_closes_after_every_rank_said_bye_and_not_forever():
    store, connect = one_rank_store("t-bye", timeout=5)
    server = StoreChannel(store, 0, 3, "t-bye", timeout=5)
    clients = [StoreChannel(connect(5), r, 3, "t-bye", timeout=5) for r in (1, 2)]
    clients[0].close()                     # a client returns at once
    late = threading.Timer(0.5, clients[1].close)
    late.start()
    t0 = time.monotonic()
    server.close()                         # waits for rank 2's bye
    waited = time.monotonic() - t0
    late.join()
    assert 0.4 < waited < 4.5
    assert int(store.add("pgc/t-bye/bye", 0)) == 3
    # a rank that never says bye: rank 0 gives up after the timeout (that rank failed alone)
    t0 = time.monotonic()
    say_bye(store, "pgc/t-never", 0, 2, timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 3
    assert int(store.add("pgc/t-never/bye", 0)) == 1



def _log_readers(name: str) -> list:
    return [t for t in threading.enumerate() if t.name == f"{name}-log-reader" and t.is_alive()]


def test_an_agent_that_stops_on_an_error_ends_its_log_reader():
    """``control="log"``: rank 0's reader thread blocks in the store for the next log row. When
    a rank's training thread fails, every agent stops with the error, and rank 0's stops its
    channel: the reader ends at once instead of waiting in the store until the process exits
    (a read timing out while the interpreter finalises aborts the process: seen as exit code
    134 of a horovodrun job whose rank 0 had a failed optimizer)."""
    from pgc_hvd.compress.encoder import make_codec
    from pgc_hvd.runtime.agent import CommAgent
    from pgc_hvd.schemes import get_scheme

    def body(rank, ops):
        scheme = get_scheme("pgc-cr", 2, 1)
        codec = make_codec(8, None, complex_messages=False)
        agent = CommAgent(ops, scheme, rank, 8, scheme.lookback, codec=codec,
                          device="cpu", control="log", timeout=20.0, name="t-agentstop")
        readers = len(_log_readers("t-agentstop"))
        agent.start()
        if rank == 1:
            agent.fail()          # this rank's training thread raised
        assert agent.join(15.0), "the agent did not stop"
        return readers, agent.error

    (readers0, err0), (_, err1) = in_world(2, body)
    assert readers0 >= 1                       # rank 0 read the log on a thread of its own
    for err in (err0, err1):
        assert isinstance(err, AgentError) and tuple(err.failed_ranks) == (1,), err
    assert poll_until(lambda: not _log_readers("t-agentstop"), 5.0), "the log reader still runs"
