"""Runs on every rank under horovodrun: the agent's wire formats, driven directly (no optimizer).

    python agent_wire_checks.py fp16      # -np 3: fp16 messages (Fp16Codec) through the
                                          #   allreduce path and the optimistic (cached) path:
                                          #   every update equals Re sum_u a_u fp16(m_u) (float64)
                                          #   within fp16 tolerance (allreduce) or fp32 (cached),
                                          #   is bit-identical across ranks, the allreduce bytes
                                          #   are half the fp32 run's; an fp16 sum past 65504
                                          #   falls back to fp32 for that step and stays finite;
                                          #   top-kappa rows with fp16 values by allgather and
                                          #   densified into the fp16 allreduce
    python agent_wire_checks.py metrics   # -np 3, rank 2 slow every other message, control
                                          #   rows by allgather and by TCPStore: every rank gets
                                          #   the same info["metrics"] per step, the mean of the
                                          #   used ranks' submitted values

Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import math
import sys
import time

import horovod.torch as hvd
import torch

from pgc_hvd.compress import (DenseCodec, TopK, allreduce_bytes, alltoall_reduce_bytes,
                              make_codec)
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.schemes import get_scheme
from checks import ok   # tests/checks.py

STEPS = 12


def message(rank: int, t: int, d: int, big: bool = False) -> torch.Tensor:
    """Rank ``rank``'s message at step t: every rank can recompute every rank's message."""
    g = torch.Generator().manual_seed(1000 * t + rank)
    m = torch.randn(d, generator=g) * 4.0
    if big:
        m[0] = 60000.0          # in the fp16 range, but a sum of two is not
    return m


def same_on_all_ranks(x: torch.Tensor, tag: str) -> None:
    got = hvd.allgather(x.detach().reshape(1, -1).clone(), name=f"same.{tag}")
    for r in range(1, got.shape[0]):
        assert torch.equal(got[0], got[r]), f"{tag}: rank {r} differs from rank 0"


def drive(codec, d, name, *, optimistic, slow=None, delay=0.0, metrics=0, big=False,
          scheme="gc-cr", s=1, compute=0.0, store=False, narrow_reduce="auto"):
    """Every rank submits its message of the step it is at (after ``compute`` seconds; the
    ``slow`` rank after ``delay`` seconds on every other message, at once on the others) and
    takes the decided updates; a rank
    that fell behind continues at the newest decided step, as the optimizer does."""
    n, rank = hvd.size(), hvd.rank()
    channel = None
    if store:   # control rows through the TCPStore (rows only: no optimistic payloads)
        from pgc_hvd.runtime.control_store import StoreChannel
        channel = StoreChannel.create(hvd, rank, n, name, 60)
    agent = CommAgent(hvd, get_scheme(scheme, n, s), rank, d, 1, codec=codec, device="cpu",
                      poll_interval=0.002, timeout=60, name=name, optimistic=optimistic,
                      metrics=metrics, channel=channel, narrow_reduce=narrow_reduce)
    agent.start()
    got, t, sent = [], 0, 0
    try:
        while t < STEPS:
            if rank == slow:    # an intermittent straggler: late, then at once
                time.sleep(delay if sent % 2 == 0 else 0.0)
            else:
                time.sleep(compute)
            sent += 1
            packed, payload = agent.payload_buffer()
            codec.encode(message(rank, t, d, big), payload)
            values = tuple(submitted_metrics(rank, t))[:metrics]
            agent.submit(Outgoing(t, t, payload, time.time(), loss=10.0 * rank + t,
                                  packed=packed, metrics=values), 0.0)
            agent.wait_for(t)
            while t < min(agent.decided(), STEPS):
                upd = agent.take(t)
                got.append((upd.flat.clone(), upd.decision, dict(upd.info)))
                t += 1
            agent.release_before(t)
    finally:
        agent.finish()
    return got


def submitted_metrics(rank: int, t: int) -> tuple:
    return (rank + t / 100.0, -float(rank), math.nan if rank == 1 else 1.0 + rank * t)


def want_update(decision, d, big=False, codec=None) -> torch.Tensor:
    """Re sum_u a_u D(p_u) in float64: D(p_u) = fp16(m_u), or for a sparse codec (no error
    feedback, so any rank can re-encode any rank's message) the decoded fp16 top-kappa row."""
    want = torch.zeros(d, dtype=torch.float64)
    for u in decision.uses:
        m = message(u.worker, u.step, d, big)
        if codec is None:
            x = m.half().double()
        else:
            row = torch.empty(codec.width)
            codec.encode(m, row)
            vals, idx = codec.split(row)
            x = torch.zeros(d, dtype=torch.float64)
            x.index_add_(0, idx.long(), vals.double() * float(row[0]))
        want += float(u.weight) * x
    return want


def data_bytes(runs, n, ctrl_len):
    """Per step: info["bytes"] less the control rows' bytes of that step's rounds."""
    out, prev = [], 0
    for _, _, info in runs:
        rounds = info["control_rounds"] - prev
        prev = info["control_rounds"]
        out.append(info["bytes"] - 8 * ctrl_len * (n - 1) * rounds)
    return out


def check_fp16():
    n = hvd.size()
    d = 10_001                                   # odd: the last word holds one fp16 entry
    f16 = make_codec(d, None, complex_messages=False, wire_dtype=torch.float16)
    f32 = DenseCodec(d)
    ctl = 11 + 1
    r32 = drive(f32, d, "w32", optimistic=False)
    b32 = data_bytes(r32, n, ctl)
    assert all(b == int(allreduce_bytes(n, d, 4)) for b in b32), b32
    # the sum of contributions: alltoall + allgather of fp16 chunks summed in fp32 (the CPU
    # default), and Horovod's fp16 ring allreduce (the GPU default)
    for reduce, tol in (("alltoall", 2), ("allreduce", n + 2)):
        r16 = drive(f16, d, f"w16{reduce}", optimistic=False, narrow_reduce=reduce)
        for t, (flat, dec, info) in enumerate(r16):
            assert info["collective"] == "allreduce" and info["fp16_fallback"] is False
            assert info["fp16_reduce"] == reduce, info
            want = want_update(dec, d)
            # fp16 roundings of the contributions and of the sum (every partial sum in the
            # ring): relative 2^-11 each
            scale = sum(abs(float(u.weight)) for u in dec.uses) * float(
                max(message(u.worker, u.step, d).abs().max() for u in dec.uses))
            err = float((flat.double() - want).abs().max())
            assert err <= tol * 2 ** -11 * scale, f"fp16 {reduce} step {t}: error {err:.3g}"
            rel = float((flat.double() - want).norm() / want.norm())
            assert rel < 2e-3, f"fp16 {reduce} step {t}: relative error {rel:.2e}"
            same_on_all_ranks(flat, f"ar16{reduce}.{t}")
        b16 = data_bytes(r16, n, ctl)
        want_b = int(alltoall_reduce_bytes(n, d) if reduce == "alltoall"
                     else allreduce_bytes(n, d, 2))
        assert all(b == want_b for b in b16), (b16, want_b)
        assert abs(sum(b16) / sum(b32) - 0.5) < 1e-3, (sum(b16), sum(b32))
        if hvd.rank() == 0:
            print(f"INFO fp16 {reduce}: bytes/step {b16[0]} vs fp32 {b32[0]}", flush=True)
    # bounded staleness: a rank may own several uses (older messages from the scheme's table),
    # summed in fp32 then rounded once into the fp16 sum
    several = 0
    for t, (flat, dec, info) in enumerate(drive(f16, d, "bs16", optimistic=False,
                                                scheme="bounded-staleness", slow=n - 1,
                                                delay=0.05, compute=0.01)):
        want = want_update(dec, d)
        rel = float((flat.double() - want).norm() / max(float(want.norm()), 1e-30))
        assert rel < 2e-3, f"fp16 bounded-staleness step {t}: relative error {rel:.2e}"
        same_on_all_ranks(flat, f"bs16.{t}")
        owners = [u.worker for u in dec.uses]
        several += len(owners) > len(set(owners))
    if hvd.rank() == 0:
        print(f"INFO fp16 bounded-staleness: {several}/{STEPS} steps with a rank owning several "
              f"uses", flush=True)
    ok("fp16_allreduce_path")
    # the optimistic path: payloads ride with the control rows and decode in fp32
    c16 = drive(f16, d, "c16", optimistic=True)
    for t, (flat, dec, info) in enumerate(c16):
        assert info["collective"] == "cached", info
        want = want_update(dec, d)
        rel = float((flat.double() - want).norm() / want.norm())
        assert rel < 1e-6, f"fp16 cached step {t}: relative error {rel:.2e}"
        same_on_all_ranks(flat, f"c16.{t}")
    # every received payload row is 4 (1 + ceil(d/2)) = 2d + 6 bytes
    for b in data_bytes(c16, n, ctl):
        assert b % (4 * f16.width) == 0 and b <= (n - 1) * 4 * f16.width, b
    assert sum(data_bytes(c16, n, ctl)) > 0
    ok("fp16_optimistic_path")
    # overflow: entries of 60000 fit fp16, their sum does not -> the step is summed in fp32
    # whether a step's sum overflows depends on which ranks' messages it uses (the decoding
    # weights a_I of the straggler set): a loaded machine may give sets that never overflow, so
    # the run is repeated (up to 3 times, the same on every rank: fell is agreed) until one does
    for reduce in ("alltoall", "allreduce"):
        for attempt in range(3):
            big = drive(f16, d, f"big16{reduce}{attempt}", optimistic=False, big=True,
                        narrow_reduce=reduce)
            fell = 0
            for t, (flat, dec, info) in enumerate(big):
                want = want_update(dec, d, big=True)
                assert torch.isfinite(flat).all(), f"step {t}: an overflowed fp16 sum was applied"
                if info["fp16_fallback"]:
                    fell += 1
                    rel = float((flat.double() - want).norm() / want.norm())
                    assert rel < 1e-6, f"fp32 fallback step {t}: relative error {rel:.2e}"
                else:
                    assert float(want.abs().max()) <= 65520, f"step {t}: overflow not caught"
                same_on_all_ranks(flat, f"big16{reduce}{attempt}.{t}")
            if fell > 0:
                break
        assert fell > 0, f"{reduce}: no step overflowed in 3 runs, the fallback was not exercised"
        one = int(alltoall_reduce_bytes(n, d) if reduce == "alltoall"
                  else allreduce_bytes(n, d, 2))
        b = data_bytes(big, n, ctl)
        assert all(x == one + (int(allreduce_bytes(n, d)) if i["fp16_fallback"] else 0)
                   for x, (_, _, i) in zip(b, big)), b
        if hvd.rank() == 0:
            print(f"INFO fp16 {reduce}: fp32 fallback on {fell}/{STEPS} overflowing steps",
                  flush=True)
    ok("fp16_overflow_falls_back_to_fp32")
    # sparse fp16 rows (fp16 values, int32 indices): by allgather (small kappa), exact in the
    # rows; densified into the fp16 allreduce (large kappa), within fp16 tolerance
    for tag, k, kind, tol in (("small", 8, "allgather", 1e-6), ("large", d // 2, "allreduce",
                                                                 2e-3)):
        codec = make_codec(d, TopK(k=k, error_feedback=False), complex_messages=False,
                           wire_dtype=torch.float16)
        runs = drive(codec, d, f"sp16{tag}", optimistic=False)
        for t, (flat, dec, info) in enumerate(runs):
            assert info["collective"] == kind, (tag, info)
            want = want_update(dec, d, codec=codec)
            rel = float((flat.double() - want).norm() / want.norm())
            assert rel < tol, f"sparse fp16 {tag} step {t}: relative error {rel:.2e}"
            same_on_all_ranks(flat, f"sp16{tag}.{t}")
        b = data_bytes(runs, n, ctl)
        if kind == "allgather":
            assert all(x % (4 * codec.width) == 0 for x in b) and sum(b) > 0, b
            assert 4 * codec.width <= 6 * k + 8
        else:
            assert all(x == int(alltoall_reduce_bytes(n, d, 2)) for x in b), b
    ok("fp16_sparse_allgather_and_densified")


def check_metrics():
    check_metrics_run("allgather", store=False)
    check_metrics_run("store", store=True)


def check_metrics_run(tag, store):
    n = hvd.size()
    d = 64
    k = 3
    runs = drive(DenseCodec(d), d, f"metrics-{tag}", optimistic=not store, slow=n - 1,
                 delay=0.1, metrics=k, compute=0.03, store=store)
    without_slow = 0
    table = []
    for t, (_, dec, info) in enumerate(runs):
        used = tuple(sorted((u.worker, u.step) for u in dec.uses))
        assert tuple(info["metrics_from"]) == used, (info["metrics_from"], used)
        without_slow += all(w != n - 1 for w, _ in used)
        for j in range(k):
            vals = [submitted_metrics(w, s)[j] for w, s in used]
            vals = [v for v in vals if math.isfinite(v)]
            want = sum(vals) / len(vals) if vals else math.nan
            got = info["metrics"][j]
            assert (math.isnan(got) and math.isnan(want)) or got == pytest_approx(want), \
                f"step {t} metric {j}: {got} != mean {want} of {used}"
            assert info["metrics_count"][j] == len(vals)
        losses = [10.0 * w + s for w, s in used]
        assert info["loss"] == pytest_approx(sum(losses) / len(losses))
        table.append(list(info["metrics"]) + list(info["metrics_count"]) + [info["loss"]]
                     + [float(x) for pair in used for x in pair])
    assert without_slow > 0, "rank n-1 was slowed but every step used it"
    assert without_slow < STEPS, "rank n-1 is on time every other message but no step used it"
    flat = torch.tensor([x for row in table for x in row], dtype=torch.float64)
    got = hvd.allgather(flat.reshape(1, -1), name=f"metrics.same.{tag}")
    for r in range(1, n):
        assert torch.equal(torch.nan_to_num(got[0], nan=-7.25),
                           torch.nan_to_num(got[r], nan=-7.25)), f"rank {r} metrics differ"
    if hvd.rank() == 0:
        print(f"INFO metrics ({tag}): {without_slow}/{STEPS} steps decided without the slowed "
              f"rank", flush=True)
    ok(f"metrics_identical_and_mean_of_used_{tag}")


def pytest_approx(x, rel=1e-12):
    class Approx:
        def __eq__(self, other):
            return abs(other - x) <= rel * max(1.0, abs(x))
    return Approx()


if __name__ == "__main__":
    hvd.init()
    {"fp16": check_fp16, "metrics": check_metrics}[sys.argv[1]]()
    # no hvd.shutdown(): each drive() finishes its agent; both runs share one launch, where a
    # shutdown would make the next run re-connect gloo (tests/run_modes.py)
