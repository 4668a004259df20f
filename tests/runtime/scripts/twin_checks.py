"""Runs on every rank under horovodrun: the runtime against the simulator, and compression.

    python twin_checks.py twin      # -np 4: the runtime replays a simulated run's arrival order
                                    #   (pgc-cr, bcgc): same decisions, same decoded updates, same
                                    #   parameters as the simulator (pgc_hvd.sim) within fp32
                                    #   tolerance; bit-identical across ranks
    python twin_checks.py min-error # -np 5: the same for bcgc's minimum-error class decoder
                                    #   under top-kappa compression (s = 2), whose choices are
                                    #   also checked against the errors the ranks sent
    python twin_checks.py compress  # -np 4: TopK(k=d) == dense; small k with error feedback:
                                    #   sent + residual == message + old residual on every rank and
                                    #   step, decoded update == sum a_I * (sparse message I),
                                    #   bit-identical ranks

The simulator run is computed on every rank (it is deterministic: seeded delays, full-partition
gradients) and every rank compares its own runtime run with it. Each check prints
"CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import torch

import pgc_hvd

hvd = pgc_hvd.engine()     # horovod.torch under horovodrun, pgc_hvd.torch under torchrun
from pgc_hvd.data import load_dataset, partition, train_test_split
from pgc_hvd.models import build_task
from pgc_hvd.compress import TopK
from pgc_hvd.runtime import PartitionLoader
from pgc_hvd.schemes import get_scheme
from pgc_hvd.delays import Exponential, LongStraggler
from pgc_hvd.sim.engine import SimConfig, Simulator
from pgc_hvd.sim.run import param_groups_of
from pgc_hvd.control.momentum import remedy_scheme_options
from checks import ok   # tests/checks.py

torch.set_num_threads(1)

STEPS = 10
LR, MOMENTUM = 0.5, 0.5


def digits_subset():
    tr, _ = train_test_split(load_dataset("digits"), 0.3, seed=0)
    return tr.subset(np.arange(400))


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(t: torch.Tensor, what: str):
    h = int(hashlib.sha256(t.detach().double().numpy().tobytes()).hexdigest()[:12], 16)
    allh = hvd.allgather(torch.tensor([h], dtype=torch.int64), name=f"hash.{what}")
    assert len(set(allh.tolist())) == 1, f"{what}: differs across ranks {allh.tolist()}"


class RecordingSimulator(Simulator):
    """The simulator, keeping each decoded update g_hat_t it applies."""

    def _apply(self, g_hat, mean_age=None):
        self.decoded.append(g_hat.detach().clone())
        return super()._apply(g_hat, mean_age)


def simulate(scheme_name, train, parts, delay_seed=2, s=1, options=None, compress=None):
    n = hvd.size()
    task = build_task("softmax", train, seed=0)
    cfg = SimConfig(steps=STEPS, partition_time=0.3, diagnostics=False, eval_every=0,
                    delay=Exponential(1.0, seed=delay_seed)
                    + LongStraggler(0.15, 2.0, 4.0, seed=delay_seed), compress=compress,
                    error_feedback=False)
    make_opt = lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM)   # noqa: E731
    # the scheme as both engines build it (the remedy's ring decay under momentum)
    opts = remedy_scheme_options(scheme_name, options, param_groups_of(make_opt))
    sim = RecordingSimulator(get_scheme(scheme_name, n, s, **opts), task, train, parts, make_opt,
                             cfg)
    sim.decoded = []
    recs = sim.run()
    return sim, recs, flat_params(task.model)


def run_runtime(scheme_name, train, parts, replay, compression=None, name="rt", spy=None, s=1,
                options=None, **opt_kwargs):
    """The real run: every rank evaluates full partitions (as the simulator does)."""
    n = hvd.size()
    task = build_task("softmax", train, seed=0)
    model = task.model
    loader = PartitionLoader(train.X, train.y, n, batch_size=None, partitions=parts)
    updates, records, decisions = {}, [], []
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), model.named_parameters(),
        scheme=scheme_name, stragglers=s, compression=compression, replay_arrivals=replay,
        scheme_options=options,
        on_update=lambda t, flat, dec: (updates.__setitem__(t, flat.clone()),
                                        decisions.append(dec)),
        on_record=records.append,
        timeout=60, name=name, **opt_kwargs)
    if spy is not None:
        spy(opt)
    while opt.version < STEPS:
        for xb, yb in opt.batches(loader):
            task.loss(model(xb), yb).backward()
        opt.step()
    opt.close()
    return model, [updates[t] for t in range(STEPS)], records, decisions


def check_twin(scheme_name, s=1, options=None, compress=None, tag="", spy=None, **opt_kwargs):
    """Returns the runtime's decisions (for checks of their own); ``opt_kwargs`` go to the
    optimizer (``control="log"``: the decider's log takes the same decisions)."""
    train = digits_subset()
    parts = partition(train.y, hvd.size(), seed=0)
    sim, srecs, sim_params = simulate(scheme_name, train, parts, s=s, options=options,
                                      compress=compress)
    log = [(w, k) for _, w, k in sim.arrival_log]
    # the premise: the simulated schedule has stragglers that are left out and ranks that skip
    # steps (they restart at the newest model), so the replay exercises the catch-up path
    per_worker = {w: [k for ww, k in log if ww == w] for w in range(hvd.size())}
    skips = sum(b > a + 1 for ks in per_worker.values() for a, b in zip(ks, ks[1:]))
    assert skips >= 1 and all(len(r.workers_used) < hvd.size() for r in srecs[1:]), (log, skips)

    # the simulator's kappa, without error feedback (as the simulator was configured)
    compression = None if sim.kappa is None else TopK(k=sim.kappa, error_feedback=False)
    name = f"twin-{scheme_name}{tag}"
    model, updates, rrecs, decisions = run_runtime(scheme_name, train, parts, log,
                                                   compression=compression, name=name, spy=spy,
                                                   s=s, options=options, **opt_kwargs)
    assert [d.step for d in decisions] == list(range(STEPS))
    for t in range(STEPS):
        sr = srecs[t]
        got = sorted((u.worker, u.version) for u in decisions[t].uses)
        want = sorted(zip(sr.workers_used, sr.versions))
        assert got == want, f"{scheme_name} step {t}: runtime used {got}, simulator {want}"
        a, b = updates[t], sim.decoded[t]
        err = float((a - b).norm() / b.norm())
        assert err < 1e-5, f"{scheme_name} step {t}: decoded updates differ by {err:.2e} (rel)"
    p = flat_params(model)
    err = float((p - sim_params).norm() / sim_params.norm())
    assert err < 1e-5, f"{scheme_name}: parameters after {STEPS} steps differ by {err:.2e} (rel)"
    same_on_all_ranks(p, name)
    if hvd.rank() == 0:
        print(f"INFO twin {scheme_name}{tag}: steps used {[r.workers_used for r in srecs]}, "
              f"max ages {[r.max_age for r in srecs]}, skips {skips}, param rel err {err:.1e}",
              flush=True)
    ok(f"twin_{scheme_name}{tag.replace('-', '_')}")
    return decisions


def check_min_error():
    """BCGC's minimum-error class decoder (Sec. VI-B) under top-kappa compression, n = 5, s = 2:
    classes K = [0, 3], [1, 4], [2] (rank 2 alone computes every partition), so when ranks 0, 2
    and 3 (or 1, 2 and 4) are the first n - s = 3, two classes are complete and the step must take
    the one whose messages lost less to compression. (At n = 4, s = 2 the only contests are
    between two ranks that each compute every partition: equal errors up to rounding.) The
    runtime's decisions equal the simulator's (check_twin), and each is the complete class of
    least sum ||C(u_i) - u_i|| over the errors the ranks really sent (gathered here)."""
    n, s = hvd.size(), 2
    errors = {}

    def spy(opt):
        real = opt.encoder.encode

        def payload(msg, out, **kw):
            e = real(msg, out, **kw)
            errors[opt.version] = e
            return e
        opt.encoder.encode = payload

    decisions = check_twin("bcgc", s=s, options={"decoder": "min-error"}, compress=0.05,
                           tag="-min-error", spy=spy)
    mine = torch.full((STEPS,), float("nan"), dtype=torch.float64)
    for t, e in errors.items():
        assert e > 0, f"step {t}: no compression error computed ({e})"  # nan fails too
        mine[t] = e
    err = hvd.allgather(mine.unsqueeze(0), name="min-error.norms")      # (n, STEPS)
    classes = get_scheme("bcgc", n, s).code.classes
    contested = 0
    for dec in decisions:
        t = dec.step
        complete = [tuple(K) for K in classes if all(i in dec.arrived for i in K)]
        total = {K: float(sum(err[i, t] for i in K)) for K in complete}
        chosen = tuple(sorted(dec.workers))
        assert chosen in total and total[chosen] == min(total.values()), \
            f"step {t}: took {chosen}, class errors {total} (arrived {dec.arrived})"
        assert abs(dec.info["class_error"] - total[chosen]) <= 1e-9 * total[chosen]
        if len(complete) > 1:
            best, second = sorted(total.values())[:2]
            assert second - best > 1e-3 * best, f"step {t}: near tie {total}; change the seed"
            first_done = min(complete, key=lambda K: max(dec.arrived.index(i) for i in K))
            contested += first_done != chosen
    # the premise: in some step two classes were complete and the error, not the arrival
    # order, chose
    assert contested >= 1, [(d.step, d.arrived, d.workers) for d in decisions]
    if hvd.rank() == 0:
        print(f"INFO min-error: {contested} of {STEPS} steps took a later-completed class",
              flush=True)
    ok("min_error_class_decoder")


def synthetic_order(n, steps, seed=4):
    """Every rank computes every step; step t's messages arrive in a seeded order (the last
    ones after the round fired: late, left out)."""
    rng = np.random.default_rng(seed)
    return [(int(w), t) for t in range(steps) for w in rng.permutation(n)]


def dense_of(payload, k, d):
    out = torch.zeros(d)
    out.index_add_(0, payload[k:].contiguous().view(torch.int32).long(), payload[:k])
    return out


def check_compression(scheme_name="pgc-cr"):
    n = hvd.size()
    train = digits_subset()
    parts = partition(train.y, n, seed=0)
    order = synthetic_order(n, STEPS)
    m_dense, up_dense, _, dec_dense = run_runtime(scheme_name, train, parts, order,
                                                  name="c-dense")
    d = flat_params(m_dense).numel()
    # k = d: the sparse path (top-k, error feedback, decode_accumulate) equals the dense one
    m_full, up_full, _, dec_full = run_runtime(scheme_name, train, parts, order,
                                               compression=TopK(k=d), name="c-full")
    for t in range(STEPS):
        assert [u.worker for u in dec_full[t].uses] == [u.worker for u in dec_dense[t].uses]
        err = float((up_full[t] - up_dense[t]).norm() / up_dense[t].norm())
        assert err < 1e-6, f"step {t}: TopK(k=d) differs from dense by {err:.2e}"
    assert torch.allclose(flat_params(m_full), flat_params(m_dense), rtol=1e-5, atol=1e-6)
    ok("topk_k_equals_d_is_dense")

    # small k with error feedback: watch the real compression on this rank (a spy calls it)
    k = max(1, d // 50)
    seen = []

    def spy(opt):
        real = opt.encoder.encode

        def payload(msg, out, **kw):
            old = opt.encoder.residual.clone()
            m = msg.clone()
            e = real(msg, out, **kw)
            seen.append((opt.version, m, old, out.clone(), opt.encoder.residual.clone()))
            return e
        opt.encoder.encode = payload

    model, updates, _, decisions = run_runtime(scheme_name, train, parts, order,
                                               compression=TopK(k=k), name="c-small", spy=spy)
    assert len(seen) == STEPS
    for t, msg, old, out, new in seen:
        assert out.numel() == 2 * k
        idx = out[k:].contiguous().view(torch.int32).long()
        assert len(set(idx.tolist())) == k, f"step {t}: repeated indices"
        sent = dense_of(out, k, d)
        # error feedback conserves mass: what is sent plus what is kept == input + old residual
        assert torch.allclose(sent + new, msg + old, rtol=0, atol=1e-6), \
            f"step {t}: sent + residual != message + old residual " \
            f"({float((sent + new - msg - old).abs().max()):.2e})"
        # the sent entries are the k largest of message + old residual
        acc = (msg + old).abs()
        assert float(acc[idx].min()) >= float(torch.topk(acc, k).values.min()) - 1e-7
        assert float(new[idx].abs().max()) == 0.0
    # the decoded update is sum_I a_I * (sparse message I): gather every rank's payloads
    mine = torch.stack([out for _, _, _, out, _ in sorted(seen, key=lambda s: s[0])])
    allp = hvd.allgather(mine.unsqueeze(0), name="c-payloads")  # (n, STEPS, 2k)
    for t in range(STEPS):
        want = torch.zeros(d, dtype=torch.float64)
        for u in decisions[t].uses:
            want += float(u.weight) * dense_of(allp[u.worker, u.step], k, d).double()
        err = float((updates[t].double() - want).norm() / want.norm())
        assert err < 1e-6, f"step {t}: decoded sparse update off by {err:.2e}"
        same_on_all_ranks(updates[t], f"c-update-{t}")
    same_on_all_ranks(flat_params(model), "c-small")
    ok("topk_error_feedback_conserves_mass_bit_identical")


def main():
    hvd.init()
    mode = sys.argv[1]
    if mode == "twin":
        check_twin("pgc-cr")
        check_twin("pgc-cr", options={"decay": 0.5}, tag="-decay")   # slots weighted by age
        check_twin("bcgc")
    elif mode == "twin-log":     # the same replayed schedules through control="log"
        check_twin("pgc-cr", tag="-log", control="log")
        check_twin("bcgc", tag="-log", control="log")
    elif mode == "min-error":
        check_min_error()
    elif mode == "compress":
        check_compression()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ALL OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
