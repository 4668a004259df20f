"""The s = 0 path on its own (:mod:`pgc_hvd.runtime.sum_rows`), in one process: the row's slot
encoding (a sum with zeros gives every float64 word back), the schemes whose full round is
known before any row (:meth:`~pgc_hvd.schemes.protocol.Scheme.full_round_weights`) and the one
place the path is chosen (:meth:`~pgc_hvd.runtime.config.RuntimeConfig.rows_in_sum`); then the
real agent (``control="log"``, its store and census) on n thread ranks, each with its own gloo
group (tests/runtime/thread_world.py): every step is one allreduce and no control operation,
the update is the scheme's weighted sum, identical on every rank, the rows that reach
``on_decided`` and the records (losses, busy seconds, user metrics) are every rank's, the same
on every rank; a failed rank, a non-finite message, loops that end at different versions and a
rank that never comes stop every rank with the rank named; and streamed (overlapped) steps of
a real model."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from pgc_hvd.compress.encoder import make_codec
from pgc_hvd.compress.topk import TopK
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.config import RuntimeConfig
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import CTRL_BUSY, CTRL_LOSS, CTRL_READY_STEP, CTRL_READY_TIME
from pgc_hvd.runtime.sum_rows import PIECES, SumRows, join_rows, split_rows
from pgc_hvd.schemes import SCHEMES, get_scheme
from streamed_rank import StreamedRank  # tests/runtime/streamed_rank.py
from thread_world import in_world  # tests/runtime/thread_world.py

D = 40


# -- the row's slot ----------------------------------------------------------------------------
def test_a_row_split_into_float32_words_survives_a_sum_with_zeros_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    words = torch.cat([torch.randn(200, generator=g, dtype=torch.float64) * 10.0 ** k
                       for k in range(-18, 31, 6)])
    special = torch.tensor([time.time(), 1.7e9 + 1e-6, 12345.0, -1.0, 0.0, 1.0 / 3, 2.0 ** 60,
                            1e-20, -7.25e20, math.pi], dtype=torch.float64)
    x = torch.cat([words, special])
    sent = torch.from_numpy(split_rows(x))
    assert sent.dtype == torch.float32 and sent.numel() == PIECES * x.numel()
    summed = sent + torch.zeros_like(sent) + torch.zeros_like(sent)   # the others' zeros
    back = torch.tensor(join_rows(summed, 1, x.numel())[0], dtype=torch.float64)
    assert torch.equal(back, x)
    # below ~1e-24 the last part is under float32's range: still within 1e-11 of x
    tiny = torch.randn(200, generator=g, dtype=torch.float64) * 1e-30
    back = torch.tensor(join_rows(split_rows(tiny), 1, 200)[0], dtype=torch.float64)
    assert ((back - tiny).abs() <= 1e-11 * tiny.abs()).all()
    odd = torch.tensor([math.nan, math.inf, -math.inf, 1e300], dtype=torch.float64)
    got = join_rows(split_rows(odd), 1, 4)[0]
    assert math.isnan(got[0]) and got[1:3] == [math.inf, -math.inf]
    assert got[3] == math.inf       # beyond float32: kept as its sign's infinity


def test_n_slots_of_a_sum_are_every_ranks_row():
    n, length = 4, 13
    rows = torch.randn(n, length, dtype=torch.float64) * 1e3
    total = torch.zeros(n * PIECES * length)
    for w in range(n):          # each rank fills its own slot, zeros elsewhere
        mine = torch.zeros_like(total)
        mine[w * PIECES * length: (w + 1) * PIECES * length] = torch.from_numpy(
            split_rows(rows[w]))
        total += mine
    assert torch.equal(torch.tensor(join_rows(total, n, length), dtype=torch.float64), rows)


# -- which schemes, chosen where -----------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_scheme_at_s_0_knows_its_full_round_and_none_with_stragglers(n):
    seen = 0
    for name in SCHEMES:
        try:
            sch = get_scheme(name, n, 0)
        except (ValueError, TypeError):
            continue                        # refuses s = 0 at this n
        w = sch.full_round_weights()
        if name in ("bounded-staleness", "is-gc"):
            # late messages; a subset of the n messages that depends on their order (is-gc
            # keeps disjoint supports): the control plane decides
            assert w is None, (name, w)
            continue
        if sch.complex_messages:
            continue
        assert w is not None and sorted(w) == list(range(n)), (name, w)
        seen += 1
        if name in ("dgd", "pgc-cr", "bcgc", "gc-cr", "is-sgd"):
            assert all(abs(x - 1.0 / n) < 1e-12 for x in w.values()), (name, w)
    assert seen >= 5
    assert get_scheme("pgc-cr", n, 1).full_round_weights() is None
    assert get_scheme("is-sgd", n, 1).full_round_weights() is None


def test_the_path_is_chosen_in_one_place_from_the_scheme_and_what_it_cannot_serve():
    dense = make_codec(D, None, complex_messages=False)
    cfg = RuntimeConfig(scheme="dgd", stragglers=0)
    assert cfg.control == "log"

    def rows_in_sum(config, scheme, codec=dense, optimistic=False, complex_code=False):
        return config.rows_in_sum(scheme, codec, optimistic=optimistic, complex_code=complex_code)

    assert rows_in_sum(cfg, get_scheme("dgd", 4, 0))
    assert rows_in_sum(cfg, get_scheme("pgc-cr", 4, 0))          # stragglers="auto" starts here
    assert not rows_in_sum(cfg, get_scheme("pgc-cr", 4, 1))
    assert not rows_in_sum(cfg, get_scheme("bounded-staleness", 4, 0))
    for control in ("allgather", "store"):
        assert not rows_in_sum(RuntimeConfig(scheme="dgd", control=control), get_scheme("dgd", 4, 0))
    assert not rows_in_sum(cfg, get_scheme("dgd", 4, 0), optimistic=True)
    assert not rows_in_sum(cfg, get_scheme("dgd", 4, 0), complex_code=True)
    assert not rows_in_sum(cfg, get_scheme("dgd", 4, 0),
                           codec=make_codec(D, TopK(0.1), complex_messages=False))
    assert not rows_in_sum(cfg, get_scheme("dgd", 4, 0),
                           codec=make_codec(D, None, complex_messages=False,
                                            wire_dtype=torch.float16))
    assert not rows_in_sum(RuntimeConfig(scheme="dgd", replay_arrivals=((0, 0),)),
                           get_scheme("dgd", 4, 0))
    with pytest.raises(ValueError, match="need the control plane"):
        SumRows(get_scheme("pgc-cr", 4, 1), 0, 13)


# -- the agent on thread ranks ---------------------------------------------------------------------
def message(rank: int, step: int) -> torch.Tensor:
    return torch.randn(D, generator=torch.Generator().manual_seed(100 * step + rank))


def agent_of(ops, rank: int, n: int, name: str, *, scheme="dgd", metrics=0, timeout=20.0):
    sch = get_scheme(scheme, n, 0)
    agent = CommAgent(ops, sch, rank, D, sch.lookback, codec=make_codec(D, None,
                                                                        complex_messages=False),
                      device="cpu", control="log", timeout=timeout, name=name, reports=True,
                      metrics=metrics, rows_in_sum=True)
    assert agent.sum_rows is not None
    return agent


def submit(agent, rank: int, t: int, *, busy: float, loss: float, metrics=()):
    packed, payload = agent.payload_buffer()
    payload.copy_(message(rank, t))
    agent.submit(Outgoing(t, t, payload, time.time(), loss, (t,), packed=packed,
                          metrics=metrics), busy)


@pytest.mark.parametrize("scheme", ["dgd", "pgc-cr"])
def test_each_step_is_one_allreduce_carrying_every_ranks_row(scheme):
    n, steps = 3, 5

    def body(rank, ops):
        agent = agent_of(ops, rank, n, f"t-sum-{scheme}", scheme=scheme, metrics=2)
        rows_seen, where = [], set()

        def seen(update, rows):
            rows_seen.append((update.step, [list(r) for r in rows]))
            where.add(threading.get_ident())
        agent.on_decided = seen
        agent.start()
        got = []
        for t in range(steps):
            if rank == 2:
                time.sleep(0.02)          # a late rank: the allreduce waits for it
            submit(agent, rank, t, busy=0.5 * t + rank, loss=float(10 * t + rank),
                   metrics=(float(rank), math.nan if rank == 1 else 1.0))
            agent.wait_for(t)
            up = agent.take(t)
            got.append((up.flat.clone(), up.decision, dict(up.info)))
            agent.release_before(t + 1)
        # inline: every round ran in submit, on this (the training) thread; no agent thread
        # until this rank is done, when it takes over the rounds left
        assert agent.inline and where == {threading.get_ident()} and not agent.running
        agent.finish()
        return got, rows_seen, agent.take_reports(), agent.data_rounds, agent.bookkeeping()

    results = in_world(n, body)
    for t in range(steps):
        want = sum(message(w, t) for w in range(n)) / n
        flats = [r[0][t][0] for r in results]
        torch.testing.assert_close(flats[0], want, rtol=1e-6, atol=1e-6)
        assert all(torch.equal(f, flats[0]) for f in flats)      # the same bits everywhere
        for got, rows_seen, reports, rounds, books in results:
            flat, decision, info = got[t]
            assert sorted(decision.workers) == list(range(n))
            assert info["loss"] == sum(10 * t + w for w in range(n)) / n
            assert info["metrics"][0] == 1.0 and info["metrics"][1] == 1.0
            assert info["metrics_count"] == (3, 2)
            assert info["control_ops"] == 0 and info["collective"] == "allreduce"
            step, rows = rows_seen[t]
            assert step == t     # identical rows on every rank (NaN: no error norm)
            torch.testing.assert_close(torch.tensor(rows), torch.tensor(results[0][1][t][1]),
                                       rtol=0, atol=0, equal_nan=True)
            assert [r[CTRL_READY_STEP] for r in rows] == [t] * n
            assert [r[CTRL_LOSS] for r in rows] == [float(10 * t + w) for w in range(n)]
            assert [r[CTRL_BUSY] for r in rows] == [0.5 * t + w for w in range(n)]
            assert all(r[CTRL_READY_TIME] > 1e9 for r in rows)
    for got, rows_seen, reports, rounds, books in results:
        assert rounds == steps + 1       # one collective a step, one more: every rank done
        assert [r.step for r in reports] == list(range(steps))
        assert reports[1].busy == [0.5] * n          # busy seconds during the step, per rank
        assert books["pool"] >= 1 and books["outbox"] == 0 and books["updates"] <= 1


def _stops(n: int, name: str, act, *, timeout=20.0) -> list:
    """Two steps, then ``act(agent, rank)`` at step 2 on each rank; every rank's agent error."""
    def body(rank, ops):
        agent = agent_of(ops, rank, n, name, timeout=timeout)
        agent.start()
        for t in range(2):
            submit(agent, rank, t, busy=0.0, loss=0.0)
            agent.wait_for(t)
            agent.release_before(t + 1)
        try:
            act(agent, rank)
        except AgentError:   # inline: the round that stops runs in submit, which raises
            pass
        agent.join(3 * timeout + 10)
        return agent.error
    return in_world(n, body, timeout=3 * timeout + 20)


def test_a_failed_rank_stops_every_rank_naming_it():
    def act(agent, rank):
        if rank == 1:
            agent.fail()
        else:
            submit(agent, rank, 2, busy=0.0, loss=0.0)
    for err in _stops(3, "t-sum-fail", act):
        assert isinstance(err, AgentError) and tuple(err.failed_ranks) == (1,), err


def test_a_non_finite_message_stops_every_rank_as_under_the_control_plane():
    def act(agent, rank):
        if rank == 2:
            agent.report_bad(2, 0.0)
        else:
            submit(agent, rank, 2, busy=0.0, loss=0.0)
    for err in _stops(3, "t-sum-bad", act):
        assert isinstance(err, AgentError) and "cannot be decoded by dgd" in str(err), err
        assert "non-finite messages from [2]" in str(err)


def test_loops_that_end_at_different_versions_stop_every_rank():
    def act(agent, rank):
        if rank == 0:
            agent.leave()
        else:
            submit(agent, rank, 2, busy=0.0, loss=0.0)
    for err in _stops(3, "t-sum-uneven", act):
        assert isinstance(err, AgentError) and "finished ranks [0]" in str(err), err


@pytest.mark.slow
def test_a_rank_that_never_comes_is_named_by_the_census():
    """Rank 2's agent never joins step 2's allreduce (its training thread hangs): the others'
    allreduce times out and the census over the control store names it, hung."""
    gone = threading.Event()

    def act(agent, rank):
        if rank == 2:
            gone.wait(30)
            agent.fail()        # let it end (its peers have left)
        else:
            try:
                submit(agent, rank, 2, busy=0.0, loss=0.0)
                agent.join(20)
            finally:
                gone.set()
    errs = _stops(3, "t-sum-hung", act, timeout=2.0)
    for err in errs[:2]:
        assert isinstance(err, AgentError) and tuple(err.hung_ranks) == (2,), err
        assert "rank(s) [2] died or hung" in str(err)


# -- streamed steps (the overlap) ---------------------------------------------------------------
def test_streamed_steps_sum_bucket_by_bucket_with_the_rows_in_the_last_bucket():
    n = 2

    def body(rank, ops):
        r = StreamedRank(ops, rank, n, timeout=30, control="log", name="t-sum-stream",
                         rows_in_sum=True)
        try:
            grads, infos = [], []
            for t in range(4):
                grads.append(r.true_grad(100 * t + rank))
                infos.append(r.one(100 * t + rank, loss=float(t)))
            return ([flat for _, flat in r.seen], infos, r.step.streamed_steps,
                    [p.detach().clone() for p in r.model.parameters()], grads)
        finally:
            r.close()

    (flats0, infos0, streamed0, params0, g0), (flats1, infos1, streamed1, params1, g1) = \
        in_world(n, body)
    assert streamed0 == streamed1 == 3                   # not the first: it shows the habits
    for t in range(4):                                   # dgd: the mean gradient
        torch.testing.assert_close(flats0[t], (g0[t] + g1[t]) / 2, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(flats0, flats1))
    assert all(torch.equal(a, b) for a, b in zip(params0, params1))
    for info in infos0[1:]:
        assert info["buckets"] >= 3 and info["control_ops"] == 0
        assert not info.get("nonfinite_sum")
    assert infos0[0]["buckets"] is not None and infos0[0]["loss"] == 0.0
    assert infos0[2]["loss"] == 1.0          # a streamed step's loss rides with the next
