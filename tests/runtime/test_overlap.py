"""The overlap on its own (:mod:`pgc_hvd.runtime.overlap`), in one process: the buckets a layout
is cut into, the stream's handoff between the training thread and the agent, the
communicator's sum bucket by bucket on thread ranks (a bucket waited for while another thread
still forms it; a rank that owns no use waits for nothing), and one rank's step with a real
model, real gradients and the real agent on a gloo group of one: the first step shows the
loop's habits, later ones stream, the update is the gradient, and a habit that comes too late
is refused with the fix."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import torch

from pgc_hvd.compress.encoder import make_codec
from pgc_hvd.flat_layout import FlatLayout
from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.communicator import Collectives
from pgc_hvd.runtime.communicator import Communicator, Stream
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.overlap import Buckets
from pgc_hvd.schemes import Arrival, get_scheme
from checks import passed
from streamed_rank import StreamedRank, mlp  # tests/runtime/streamed_rank.py
from thread_world import in_world  # tests/runtime/thread_world.py

MIB = 2 ** 20


# -- the buckets -------------------------------------------------------------------------------
@pytest.mark.parametrize("cap_floats", [1, 20, 50, 10 ** 6])
def test_buckets_cover_the_vector_backwards_in_contiguous_ranges(cap_floats):
    lay = FlatLayout(list(mlp().parameters()))
    b = Buckets(lay, cap_floats * 4 / MIB)
    hi = lay.numel
    for lo_k, hi_k in b.ranges:          # last parameters first, no gap, no overlap
        assert hi_k == hi and lo_k < hi_k
        hi = lo_k
    assert hi == 0
    assert sum(b.counts) == len(lay.params)
    for p in lay.params:
        off, k = lay.offsets[id(p)]
        lo_k, hi_k = b.ranges[b.of_param[id(p)]]
        assert lo_k <= off and off + k <= hi_k
    for k, (lo_k, hi_k) in enumerate(b.ranges):   # only a single parameter overflows a bucket
        if hi_k - lo_k > max(cap_floats, 1):
            assert b.counts[k] == 1
    if cap_floats == 1:
        assert len(b) == len(lay.params)
    if cap_floats == 10 ** 6:
        assert len(b) == 1


def test_the_first_bucket_is_one_mib_as_ddps():
    big = [torch.zeros(2 ** 18, requires_grad=True) for _ in range(6)]   # 1 MiB each
    b = Buckets(FlatLayout(big), 25.0)
    assert b.ranges[0] == (5 * 2 ** 18, 6 * 2 ** 18)      # the last parameter alone
    assert len(b) == 2 and b.counts == [1, 5]


@pytest.mark.parametrize("cap", [0, -1.0, float("nan")])
def test_a_bucket_size_that_is_no_size_is_refused(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        Buckets(FlatLayout(list(mlp().parameters())), cap)


# -- the stream --------------------------------------------------------------------------------
def test_a_wait_ends_when_the_bucket_is_marked_from_another_thread():
    s = Stream(3)
    threading.Timer(0.05, s.mark, args=(1,)).start()
    t0 = time.monotonic()
    s.wait(1, 5.0, rank=0, step=4)
    assert 0.03 < time.monotonic() - t0 < 2.0
    assert s.ready == [False, True, False] and not s.complete


def test_a_wait_ends_with_agent_error_on_close_stop_or_timeout():
    s = Stream(2)
    threading.Timer(0.05, s.close).start()
    with pytest.raises(AgentError, match="training thread stopped during the backward of step 7"):
        s.wait(0, 5.0, rank=2, step=7)
    with pytest.raises(AgentError, match="training thread stopped"):
        Stream(1).wait(0, 5.0, rank=0, step=0, stop=lambda: True)
    with pytest.raises(AgentError, match="formed no bucket 0 of it within 0s"):
        Stream(1).wait(0, 0.1, rank=0, step=3)


# -- the communicator's sum bucket by bucket ---------------------------------------------------
def test_the_bucketed_sum_is_the_decisions_weighted_sum_while_buckets_still_form():
    """gc-cr at n = 3, s = 1 fires on ranks 2 and 0: each forms its message's buckets on
    another thread, slowly, while the agent's sum waits for them; rank 1 owns no use and never
    forms anything. Every rank gets the weighted sum of the two messages, the same bits."""
    params = list(mlp((5, 9, 8, 3)).parameters())
    lay = FlatLayout(params)
    d = lay.numel
    buckets = Buckets(lay, 30 * 4 / MIB)
    assert len(buckets) >= 3
    codec = make_codec(d, None, complex_messages=False)
    scheme = get_scheme("gc-cr", 3, 1)
    decision = scheme.decide(0, [Arrival(w, 0) for w in (2, 0, 1)])
    assert sorted(decision.workers) == [0, 2]
    msgs = {w: torch.randn(d, generator=torch.Generator().manual_seed(w)) for w in range(3)}

    def body(rank, ops):
        coll = Collectives(ops, rank, f"{ops.label}.data", 30.0)
        buf = torch.zeros(d)
        out = Outgoing(0, 0, buf, time.time(), stream=Stream(len(buckets)))

        def form():
            for k, (lo, hi) in enumerate(buckets.ranges):
                time.sleep(0.02)
                buf[lo:hi] = msgs[rank][lo:hi]
                out.stream.mark(k)
        if rank != 1:
            threading.Thread(target=form, daemon=True).start()
        comm = Communicator(coll, codec, n=3, d=d, rank=rank, device="cpu", own=lambda s: out)
        comm.buckets = buckets
        flat, kind, _, _ = comm.combine(decision, keep=set(), offered=set())
        return kind, flat.clone(), comm.take_bytes()

    results = in_world(3, body)
    want = sum(u.weight * msgs[u.worker] for u in decision.uses)
    for kind, flat, nbytes in results:
        assert kind == "allreduce"
        torch.testing.assert_close(flat, want, rtol=1e-6, atol=1e-6)
        assert torch.equal(flat, results[0][1])
        assert nbytes == int(2 * 2 / 3 * 4 * d)        # the ring allreduce's bytes, 1.00x


# -- one rank's streamed steps ----------------------------------------------------------------
def one_rank(ops, *, unused=False):
    """One rank's capture, step and agent over a real model (dgd, n = 1) on a gloo group of
    one, with the overlap's buckets, on the allgather control plane."""
    return StreamedRank(ops, unused=unused, poll_interval=0.001, timeout=30, optimistic=False,
                        control="allgather")


def test_later_steps_stream_and_the_update_is_the_gradient():
    def body(rank, ops):
        r = one_rank(ops, unused=True)
        try:
            for t in range(4):
                g = r.true_grad(t)
                info = r.one(t)
                assert info["buckets"] == len(r.buckets) >= 3
                torch.testing.assert_close(r.seen[-1][1], g, rtol=1e-6, atol=1e-7)
            assert r.step.streamed_steps == 3            # not the first: it shows the habits
            assert r.step.may_stream is True
            spare = r.layout.view(r.seen[-1][1], r.spare.weight)
            assert torch.equal(spare, torch.zeros_like(spare))   # no gradient: zeros, flushed
        finally:
            r.close()
    in_world(1, body)


def test_a_streamed_steps_loss_rides_with_the_next_message():
    """The loss handed to step() of a streamed step came after its message left: it is the
    next message's (the decided step's loss is the used ranks' previous batch's)."""
    def body(rank, ops):
        r = one_rank(ops)
        try:
            got = [r.one(t, loss=float(t + 1))["loss"] for t in range(4)]
            assert got[0] == 1.0                   # not streamed: its own loss
            assert got[1] is None or math.isnan(got[1])   # the first streamed: none yet
            assert got[2:] == [2.0, 3.0]           # the previous step's
            assert r.step.streamed_steps == 3
        finally:
            r.close()
    in_world(1, body)


def test_a_loop_that_clips_at_its_first_step_never_streams():
    def body(rank, ops):
        r = one_rank(ops)
        try:
            for t in range(3):
                r.one(t, clip=True)
            assert r.step.may_stream is False and r.step.streamed_steps == 0
        finally:
            r.close()
    in_world(1, body)


def test_clipping_that_comes_after_the_message_left_is_refused_with_the_fix():
    def body(rank, ops):
        r = one_rank(ops)
        try:
            r.one(0)
            with pytest.raises(RuntimeError, match=r"p.grad was changed after loss.backward\(\)"
                                                   r".*overlap=False"):
                r.one(1, clip=True)
        finally:
            r.capture.remove_hooks()
            r.agent.fail()
            assert r.agent.join(10), "the agent thread outlived its rank's failure"
    in_world(1, body)


# -- under both engines ------------------------------------------------------------------------
SCRIPT = Path(__file__).resolve().parent / "scripts" / "overlap_checks.py"
ENTRY = [("overlap", "test_overlap_under_both_engines_identical_parameters", SCRIPT, ["20"])]
LAUNCH_GROUPS = [("horovodrun", 3, ENTRY), ("torchrun", 3, ENTRY)]


@pytest.mark.multirank
@pytest.mark.parametrize("engine", ["horovodrun", "torchrun"])
def test_overlap_under_both_engines_identical_parameters(engine, request):
    """pgc-cr at np 3 with a slowed rank and several buckets: later steps stream on every
    computing rank, every step's sum moves bucket by bucket, the loss the records report is
    the previous batches', the run learns and ends with identical parameters; with
    overlap=False nothing streams and the sum is one allreduce (rank script:
    tests/runtime/scripts/overlap_checks.py)."""
    proc = request.getfixturevalue("hvd3" if engine == "horovodrun" else "torch3").ran(
        "overlap")
    got = passed(proc.stdout)
    for name in ("overlap_streams_buckets_identical_parameters",
                 "overlap_off_one_collective_identical_parameters"):
        assert got.get(name) == [0, 1, 2], (name, proc.stdout[-3000:], proc.stderr[-3000:])


def test_a_gradient_that_fits_one_bucket_is_not_overlapped():
    lay = FlatLayout(list(mlp().parameters()))
    assert Buckets.worth_it(lay) is None                       # d = 137: one 1 MiB bucket
    assert len(Buckets.worth_it(lay, 20 * 4 / MIB).ranges) > 1
