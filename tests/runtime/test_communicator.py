"""The data plane on its own, in one process:
:class:`~pgc_hvd.runtime.communicator.Communicator` and its
:class:`~pgc_hvd.runtime.communicator.BufferPool`.

n ranks run as n threads of the pytest process, each with its own real gloo process group
(``torch.distributed.ProcessGroupGloo`` over one ``HashStore``) behind the torch engine's
:class:`~pgc_hvd.torchdist.ops.GroupOps` and the agent's
:class:`~pgc_hvd.runtime.communicator.Collectives`, as the agent thread holds them under torchrun (no
launcher). Decisions come from real schemes (:func:`pgc_hvd.schemes.get_scheme`), payload rows
from the real codecs (:func:`pgc_hvd.compress.encoder.make_codec`, the compiled extension's
decode): dense, top-kappa (both collectives), fp16 (both narrow reductions and the fp32 repeat
on overflow), fp16 top-kappa, and complex Reed-Solomon rows. The update is checked against the
codec's ``add_weighted`` over the used rows and :meth:`~pgc_hvd.schemes.Decision.combine` over
the messages, on every rank; plus the collective chosen, the bytes counted, the rank that owns
no use, the cached path, the cache kept for later decisions, and the recycled buffers. What the
horovodrun tests (tests/runtime/scripts/runtime_checks.py, plane_checks.py) cover only through the
whole optimizer."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from pgc_hvd.compress.codecs import allreduce_bytes, alltoall_reduce_bytes, choose_collective
from pgc_hvd.compress.encoder import make_codec
from pgc_hvd.compress.topk import TopK
from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.communicator import Collectives
from pgc_hvd.runtime.communicator import BufferPool, Communicator
from pgc_hvd.schemes import Arrival, Ring, get_scheme
from thread_world import in_world as world  # tests/runtime/thread_world.py

D = 64


def in_world(n: int, body, timeout: float = 30.0) -> list:
    """``body(rank, coll)`` on n thread ranks, ``coll`` the agent's Collectives over the rank's
    gloo group (tests/runtime/thread_world.py)."""
    return world(n, lambda rank, ops: body(rank, Collectives(ops, rank, f"{ops.label}.data",
                                                             timeout)), timeout)


def message(worker: int, step: int, complex_: bool = False, scale: float = 1.0):
    """A message of d entries, randn * ``scale``; a negative ``scale``: positive entries in
    [|scale| / 2, |scale|]."""
    g = torch.Generator().manual_seed(1000 * step + worker)
    m = torch.randn(D, generator=g)
    m = m * scale if scale > 0 else (m.abs() + 1).clamp(max=2) * (-scale / 2)
    if complex_:
        m = torch.complex(m, torch.randn(D, generator=g) * scale)
    return m


def payload(codec, worker: int, step: int, complex_: bool = False, scale: float = 1.0):
    row = torch.empty(codec.width, dtype=torch.float32)
    codec.encode(message(worker, step, complex_, scale), row)
    return row


def decision_of(scheme, step: int, order):
    d = scheme.decide(step, [Arrival(w, step) for w in order])
    assert d is not None, f"{scheme.name} did not fire on arrivals {order}"
    return d


def reference(codec, decision, complex_: bool = False, scale: float = 1.0) -> torch.Tensor:
    """The codec's own sum a_u D(p_u) over the decision's rows, in one process."""
    out = torch.empty(D, dtype=torch.float32)
    codec.add_weighted(out, [payload(codec, u.worker, u.step, complex_, scale)
                             for u in decision.uses], [u.weight for u in decision.uses])
    return out


def comm_for(rank, coll, codec, n, complex_=False, scale=1.0, **kw) -> Communicator:
    outbox: dict = {}

    def own(step):
        if step not in outbox:
            outbox[step] = Outgoing(step, step, payload(codec, rank, step, complex_, scale),
                                    time.time())
        return outbox[step]
    return Communicator(coll, codec, n=n, d=D, rank=rank, device="cpu", own=own, **kw)


# (scheme, n, s, compression, wire dtype, the collective the bytes pick)
CASES = {
    "dense": ("gc-cr", 3, 1, None, None, "allreduce"),
    "topk-allgather": ("pgc-cr", 3, 1, TopK(k=4, error_feedback=False), None, "allgather"),
    "topk-allreduce": ("gc-cr", 3, 1, TopK(k=40, error_feedback=False), None, "allreduce"),
    "fp16": ("is-sgd", 3, 1, None, torch.float16, "allreduce"),
    "fp16-topk": ("gc-cr", 3, 1, TopK(k=4, error_feedback=False), torch.float16, "allgather"),
    "fp16-topk-allreduce": ("gc-cr", 3, 1, TopK(k=40, error_feedback=False), torch.float16,
                            "allreduce"),
    "rs-complex": ("rs", 3, 1, None, None, "allreduce"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_update_is_the_decisions_weighted_sum_on_every_rank(case):
    name, n, s, compression, wire, kind_expected = CASES[case]
    scheme = get_scheme(name, n, s)
    complex_ = Ring(scheme, 0).complex
    codec = make_codec(D, compression, complex_messages=complex_, wire_dtype=wire)
    decision = decision_of(scheme, 0, [2, 0, 1])
    workers = {u.worker for u in decision.uses}
    assert 0 < len(workers) < n, "the case needs a rank that owns no use"
    kind = choose_collective(sparse=codec.sparse, n=n, d=D, width=codec.width,
                             needed=len(decision.uses), itemsize=codec.wire_itemsize)
    assert kind == kind_expected

    def body(rank, coll):
        comm = comm_for(rank, coll, codec, n, complex_)
        flat, got_kind, fallback, uses = comm.combine(decision, keep=set(), offered=set())
        return flat.clone(), got_kind, fallback, uses, comm.take_bytes(), comm.data_rounds

    results = in_world(n, body)
    ref = reference(codec, decision, complex_)
    messages = {(w, 0): message(w, 0, complex_) for w in range(n)}
    exact = decision.combine(messages)              # before compression / rounding
    exact = (exact.real if torch.is_complex(exact) else exact).float()
    for rank, (flat, got_kind, fallback, uses, nbytes, rounds) in enumerate(results):
        assert got_kind == kind_expected
        assert not fallback
        assert [(u.worker, u.step) for u in uses] == sorted((u.worker, u.step)
                                                            for u in decision.uses)
        assert torch.equal(flat, results[0][0]), f"rank {rank}'s update differs from rank 0's"
        if got_kind == "allgather" or codec.wire_dtype == torch.float16:
            tol = dict(rtol=2e-3, atol=2e-3) if codec.wire_dtype == torch.float16 else {}
        else:
            tol = dict(rtol=1e-6, atol=1e-6)   # the ring's sum order
        if tol:
            torch.testing.assert_close(flat, ref, **tol)
        else:
            assert torch.equal(flat, ref)       # the same rows, the same decode: the same bits
        if compression is None:                  # dense rows are the messages (fp16: rounded)
            torch.testing.assert_close(flat, exact, rtol=2e-3 if wire else 1e-5,
                                       atol=2e-3 if wire else 1e-5)
        narrow_a2a = got_kind == "allreduce" and codec.wire_dtype == torch.float16
        assert rounds == (2 if narrow_a2a else 1)     # fp16 on CPU: alltoall + allgather
        if got_kind == "allgather":
            others = sum(1 for u in decision.uses if u.worker != rank)
            assert nbytes == 4 * codec.width * others
        elif narrow_a2a:
            assert nbytes == int(alltoall_reduce_bytes(n, D, 2))
        else:
            assert nbytes == int(allreduce_bytes(n, D))
    assert not torch.equal(ref, torch.zeros(D))


def test_a_rank_that_owns_no_use_contributes_zeros():
    """gc-cr at n = 3, s = 1 fires on the first two arrivals: rank 1 owns no use. Its
    contribution is zeros, so the sum is the other two ranks' alone, whatever rank 1 holds."""
    scheme = get_scheme("gc-cr", 3, 1)
    codec = make_codec(D, None, complex_messages=False)
    decision = decision_of(scheme, 0, [2, 0, 1])
    assert sorted(decision.workers) == [0, 2]

    def body(rank, coll):
        # rank 1's own message is huge: it must not leak into the update
        comm = comm_for(rank, coll, codec, 3, scale=1e6 if rank == 1 else 1.0)
        flat, kind, _, _ = comm.combine(decision, keep=set(), offered=set())
        return kind, flat.clone()

    results = in_world(3, body)
    ref = reference(codec, decision)
    for kind, flat in results:
        assert kind == "allreduce"
        torch.testing.assert_close(flat, ref, rtol=1e-6, atol=1e-6)
        assert flat.abs().max() < 100


def test_payloads_cached_with_the_control_rows_need_no_collective():
    """Every used payload rode with a control round: ``kind == "cached"``, no data round, every
    rank decodes the same rows locally (the same bits as the codec's reference); the bytes are
    the payloads received from the other ranks."""
    scheme = get_scheme("pgc-cr", 3, 1)
    codec = make_codec(D, TopK(k=6, error_feedback=False), complex_messages=False)
    decision = decision_of(scheme, 0, [1, 2, 0])
    rows = {(w, 0): payload(codec, w, 0) for w in range(3)}

    def body(rank, coll):
        comm = comm_for(rank, coll, codec, 3)
        comm.received(dict(rows))
        flat, kind, _, _ = comm.combine(decision, keep=set(), offered={(w, 0) for w in range(3)})
        return flat.clone(), kind, comm.data_rounds, comm.take_bytes(), coll.ops, comm.cache

    ref = reference(codec, decision)
    for rank, (flat, kind, rounds, nbytes, ops, cache) in enumerate(in_world(3, body)):
        assert kind == "cached" and rounds == 0 and ops == 0
        assert torch.equal(flat, ref)
        assert nbytes == 2 * 4 * codec.width          # the two other ranks' rows
        assert cache == {}                             # all offered, none kept


def test_stale_uses_cached_rows_and_what_the_cache_keeps():
    """Bounded staleness (n = 3, s = 1) fires step 1 on worker 0's messages of steps 0 and 1
    and worker 2's of step 0: rank 0 owns two uses. (1) Nothing cached: rank 0's contribution
    is the sum of its two. (2) Worker 0's row of step 1 rode with a control round: the allreduce
    carries the missing rows and every rank adds the cached one locally; afterwards the cache
    holds what the scheme retains and rows of steps not offered yet, nothing else."""
    scheme = get_scheme("bounded-staleness", 3, 1)
    rnd = scheme.open_round(0)
    assert rnd.offer(Arrival(0, 0)) is None and rnd.offer(Arrival(1, 0)) is None
    d1 = scheme.decide(1, [Arrival(0, 1), Arrival(2, 0)])   # worker 2's message is late
    assert d1 is not None
    assert sorted((u.worker, u.step) for u in d1.uses) == [(0, 0), (0, 1), (2, 0)]
    keep = scheme.retained()
    assert (0, 1) in keep and (1, 0) not in keep
    codec = make_codec(D, None, complex_messages=False)
    offered = {(0, 0), (1, 0), (0, 1), (2, 0)}

    def body(rank, coll):
        fresh = comm_for(rank, coll, codec, 3)
        f_fresh, k_fresh, _, _ = fresh.combine(d1, keep=keep, offered=offered)
        comm = comm_for(rank, coll, codec, 3)
        comm.received({(0, 1): payload(codec, 0, 1), (1, 0): payload(codec, 1, 0),
                       (1, 2): payload(codec, 1, 2)})
        flat, kind, _, _ = comm.combine(d1, keep=keep, offered=offered)
        return f_fresh.clone(), k_fresh, flat.clone(), kind, set(comm.cache)

    ref = reference(codec, d1)
    for f_fresh, k_fresh, flat, kind, cache in in_world(3, body):
        assert k_fresh == kind == "allreduce"
        torch.testing.assert_close(f_fresh, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(flat, ref, rtol=1e-6, atol=1e-6)
        # (0, 1): retained; (1, 2): a later step not offered yet; (1, 0): offered, past, gone
        assert cache == {(0, 1), (1, 2)}


@pytest.mark.parametrize("narrow", ["alltoall", "allreduce"])
def test_an_fp16_sum_that_overflows_is_repeated_in_fp32(narrow):
    """Contributions that fit fp16 but whose sum passes 65504: every rank sees the non-finite
    sum and repeats it in fp32 (``fallback`` True, one more data round); the update is the fp32
    sum, never inf."""
    scheme = get_scheme("dgd", 3, 0)
    codec = make_codec(D, None, complex_messages=False, wire_dtype=torch.float16)
    d = decision_of(scheme, 0, [0, 1, 2])
    # weights 1/3 keep the average of fp16 messages below 65504: scale them to 1 (a sum, as a
    # decision whose weights add past 1) so that three rows of ~4e4 overflow together
    d = dataclasses.replace(d, uses=tuple(dataclasses.replace(u, weight=1.0) for u in d.uses))
    scale = -6e4   # entries in [3e4, 6e4]: each fits fp16 (65504), every sum of three does not

    def body(rank, coll):
        comm = comm_for(rank, coll, codec, 3, scale=scale, narrow_reduce=narrow)
        flat, kind, fallback, _ = comm.combine(d, keep=set(), offered=set())
        return flat.clone(), kind, fallback, comm.data_rounds

    ref = reference(codec, d, scale=scale)
    assert ref.min() > 65504
    for flat, kind, fallback, rounds in in_world(3, body):
        assert kind == "allreduce" and fallback
        assert rounds == (3 if narrow == "alltoall" else 2)
        assert torch.isfinite(flat).all()
        torch.testing.assert_close(flat, ref, rtol=1e-3, atol=1.0)


def test_a_single_dense_use_becomes_the_update_in_place():
    """One dense use no later decision needs, whose row is the agent's packed buffer: scaled in
    place and marked consumed (no copy, no pool buffer)."""
    codec = make_codec(D, None, complex_messages=False)
    scheme = get_scheme("dgd", 1, 0)
    d = decision_of(scheme, 0, [0])

    def body(rank, coll):
        packed = torch.zeros(D)
        out = Outgoing(0, 0, packed, time.time(), packed=packed)
        packed.copy_(message(0, 0))
        comm = Communicator(coll, codec, n=1, d=D, rank=0, device="cpu", own=lambda s: out)
        flat, kind, _, _ = comm.combine(d, keep=set(), offered=set())
        return flat, out, packed

    flat, out, packed = in_world(1, body)[0]
    assert out.consumed and flat.data_ptr() == packed.data_ptr()
    assert torch.equal(flat, message(0, 0) * float(d.uses[0].weight))


@pytest.mark.parametrize("case", ["topk-allgather", "fp16"])
def test_buffers_are_recycled_over_many_steps(case):
    """The agent hands each update back to the pool; over 40 steps the updates come from at
    most two buffers and the pool holds a fixed number of free buffers (nothing grows)."""
    name, n, s, compression, wire, _ = CASES[case]
    scheme = get_scheme(name, n, s)
    codec = make_codec(D, compression, complex_messages=False, wire_dtype=wire)
    decisions = [decision_of(scheme, t, [(t + k) % n for k in range(n)]) for t in range(40)]

    def body(rank, coll):
        comm = comm_for(rank, coll, codec, n)
        ptrs, free = set(), []
        for d in decisions:
            flat, _, _, _ = comm.combine(d, keep=set(), offered=set())
            ptrs.add(flat.data_ptr())
            comm.pool.put(flat)
            free.append(comm.pool.free_buffers)
        return ptrs, free, len(comm.cache)

    for ptrs, free, cached in in_world(n, body):
        assert len(ptrs) <= 2
        assert len(set(free[2:])) == 1 and free[-1] <= 4 * 3
        assert cached == 0


def test_buffer_pool_recycles_by_size_and_dtype_and_keeps_at_most_keep():
    pool = BufferPool("cpu", keep=2)
    a = pool.get(10)
    assert a.dtype == torch.float32 and a.numel() == 10
    pool.put(a)
    assert pool.free_buffers == 1
    assert pool.get(10).data_ptr() == a.data_ptr()          # the same buffer back
    assert pool.free_buffers == 0
    pool.put(a)
    assert pool.get(10, torch.float16).data_ptr() != a.data_ptr()   # other dtype: fresh
    assert pool.get(11).data_ptr() != a.data_ptr()                  # other size: fresh
    bufs = [pool.get(10) for _ in range(4)]
    for b in bufs:
        pool.put(b)
    assert pool.free_buffers == 2                                   # keep = 2
    pool.put(torch.zeros(20)[:10])                                  # a view: not ours
    pool.put(torch.zeros(5, 4).t())                                 # not contiguous
    pool.put(None)
    assert pool.free_buffers == 2
    head = pool.get(30)
    pool.put(head[:20])              # the head of one it lent (the s = 0 path's update)
    assert pool.free_buffers == 3 and pool.get(30).data_ptr() == head.data_ptr()
    pool.put(pool.get(30)[5:])       # not its head: not taken
    assert pool.free_buffers == 2


def test_narrow_reduce_is_checked():
    codec = make_codec(D, None, complex_messages=False, wire_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"narrow_reduce='ring'.*alltoall"):
        Communicator(None, codec, n=2, d=D, rank=0, device="cpu", own=lambda s: None,
                     narrow_reduce="ring")
    assert Communicator(None, codec, n=2, d=D, rank=0, device="cpu",
                        own=lambda s: None).narrow_reduce == "alltoall"   # auto on CPU


# -- waiting for a collective: the torch engine blocks, with a deadline ---------------------------
def test_the_torch_engine_is_waited_for_by_blocking_not_polling():
    """The agent's wait for a collective of the torch engine (CPU tensors) sleeps in torch's
    ``Work.wait`` until the collective ends: no poll loop, whose sleeps (up to 1 ms) added to
    every collective of a step."""
    polls = []

    def body(rank, ops):
        counted = ops.poll
        ops.poll = lambda handle: polls.append(rank) or counted(handle)
        coll = Collectives(ops, rank, "t-block", 30.0)
        if rank == 1:
            time.sleep(0.2)     # rank 0 waits for it in the allreduce
        got = coll.allreduce_sum_(torch.full((8,), float(rank + 1)), "sum")
        return got.tolist()

    assert world(2, body) == [[3.0] * 8, [3.0] * 8]
    assert polls == []


def test_a_blocking_wait_ends_at_its_deadline_while_the_peer_is_away():
    """A peer that does not join: the wait returns at its deadline (the last slice shorter
    than a millisecond included, which torch would read as "no timeout"; a CUDA handle's, which
    is polled) while the peer is still away, and the agent's error says no answer came."""
    from pgc_hvd.runtime.errors import AgentError
    back = __import__("threading").Event()

    def body(rank, ops):
        if rank == 1:
            time.sleep(3.0)
            back.set()
            return None
        first = ops.allreduce_async_(torch.ones(4), name="first", op=ops.Sum)
        sub_ms = ops.wait_for(first, 0.0004)
        first.cpu = False          # as a CUDA handle: polled with sleeps, up to its deadline
        sub_ms = sub_ms or ops.wait_for(first, 0.05)
        coll = Collectives(ops, rank, "t-deadline", 0.3)
        with pytest.raises(AgentError, match="got no answer within") as err:
            coll.allreduce_sum_(torch.ones(4), "sum")
        return sub_ms, back.is_set(), str(err.value)

    (sub_ms, away_over, text), _ = world(2, body, timeout=20.0)
    assert sub_ms is False and not away_over, text
