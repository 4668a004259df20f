"""Runs on every rank under horovodrun: the data plane's collectives give the same updates.

    python plane_checks.py dense    # -np 3: for gc-cr, pgc-cr, bcgc, bounded-staleness, is-sgd
                                    #   and rs, the allreduce of the ranks' weighted contributions
                                    #   (optimistic=False) and the cached payloads of the
                                    #   one-collective path (optimistic=True) each decode
                                    #   Re sum_u a_u D(p_u) of the payloads really sent; under the
                                    #   same replayed arrival order, same decisions and updates;
                                    #   parameters and every update bit-identical across ranks
    python plane_checks.py sparse   # -np 3: top-kappa rows by allgather (small kappa) and
                                    #   densified into the allreduce (large kappa) equal the
                                    #   cached path; Reed-Solomon with TopK runs and TopK(k=d)
                                    #   equals its dense run

Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import sys
from pathlib import Path

import horovod.torch as hvd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twin_checks import (STEPS, digits_subset, flat_params, run_runtime,  # noqa: E402
                         same_on_all_ranks, synthetic_order)
from checks import ok  # noqa: E402

from pgc_hvd.compress import TopK  # noqa: E402
from pgc_hvd.data import partition  # noqa: E402


def spy_payloads(store):
    """A spy that records every payload row this rank submits, by step."""
    def spy(opt):
        agent = opt.agent
        real = agent.submit

        def submit(out, busy):
            store[out.step] = out.payload.detach().clone()
            return real(out, busy)
        agent.submit = submit
    return spy


def dense_rows(rows: torch.Tensor, codec, d: int) -> torch.Tensor:
    """The complex or real dense d-vectors D(p) of payload rows (float64 / complex128)."""
    out = []
    for p in rows:
        if codec == "complex":
            out.append(torch.view_as_complex(p.double().view(d, 2).contiguous()))
        elif codec == "sparse-complex":
            k = p.numel() // 3
            v = torch.complex(p[:k].double(), p[k:2 * k].double())
            x = torch.zeros(d, dtype=torch.complex128)
            x[p[2 * k:].contiguous().view(torch.int32).long()] = v
            out.append(x)
        elif codec == "sparse":
            k = p.numel() // 2
            x = torch.zeros(d, dtype=torch.float64)
            x.index_add_(0, p[k:].contiguous().view(torch.int32).long(), p[:k].double())
            out.append(x)
        else:
            out.append(p.double())
    return torch.stack(out)


def check_linear_decode(tag, updates, decisions, mine, d, kind):
    """Every decoded update equals Re sum_u a_u D(p_u) over the payloads the ranks really sent
    (gathered here), in float64: the allreduce of contributions is exact up to fp32 rounding."""
    width = next(iter(mine.values())).numel()
    table = torch.full((STEPS, width), float("nan"))
    for t, p in mine.items():
        if t < STEPS:
            table[t] = p
    allp = hvd.allgather(table.unsqueeze(0), name=f"payloads.{tag}")      # (n, STEPS, width)
    for t in range(STEPS):
        want = 0
        for u in decisions[t].uses:
            row = dense_rows(allp[u.worker, u.step].unsqueeze(0), kind, d)[0]
            want = want + complex(u.weight) * row if row.is_complex() else \
                want + float(u.weight) * row
        want = want.real if torch.is_tensor(want) and want.is_complex() else want
        err = float((updates[t].double() - want).norm() / max(float(want.norm()), 1e-30))
        assert err < 1e-6, f"{tag} step {t}: update != sum a_u D(p_u) ({err:.2e} rel)"
        same_on_all_ranks(updates[t], f"{tag}-update-{t}")


def compare(scheme, tag, *, compression=None, options=None, want_two="allreduce", s=1,
            kind="dense", same_decisions=True):
    """Runs ``scheme`` with optimistic=True (cached payloads) and optimistic=False (the bytes'
    collective), same replayed order. In both, every update is checked against the payloads
    the ranks sent; with ``same_decisions`` (every scheme whose decisions depend only on the
    order of arrivals, not on when a round polls), the two runs take the same decisions and
    decode the same updates. Returns the second run's updates."""
    n = hvd.size()
    train = digits_subset()
    parts = partition(train.y, n, seed=0)
    order = synthetic_order(n, STEPS, seed=5)
    runs = {}
    for optimistic in (True, False):
        mine = {}
        name = f"plane-{scheme}-{tag}-{int(optimistic)}"
        runs[optimistic] = run_runtime(scheme, train, parts, order, compression=compression,
                                       name=name, s=s, options=options, optimistic=optimistic,
                                       control="allgather",
                                       spy=spy_payloads(mine))
        model, updates, records, decisions = runs[optimistic]
        d = flat_params(model).numel()
        check_linear_decode(name, updates, decisions, mine, d, kind)
        same_on_all_ranks(flat_params(model), name)
        if hvd.rank() == 0:   # rank 0 writes the records: which collective carried each step
            got = {r.extra.get("collective") for r in records}
            want = {"cached"} if optimistic else {want_two}
            assert got == want, f"{name}: steps used {got}, not {want}"
    (m1, up1, _, dec1), (m2, up2, _, dec2) = runs[True], runs[False]
    if same_decisions:
        for t in range(STEPS):
            a = sorted((u.worker, u.step, u.version) for u in dec1[t].uses)
            b = sorted((u.worker, u.step, u.version) for u in dec2[t].uses)
            assert a == b, f"{scheme} {tag} step {t}: decisions differ {a} vs {b}"
            err = float((up1[t] - up2[t]).norm() / max(float(up1[t].norm()), 1e-30))
            assert err < 1e-6, f"{scheme} {tag} step {t}: updates differ by {err:.2e} (rel)"
        err = float((flat_params(m1) - flat_params(m2)).norm() / flat_params(m1).norm())
        assert err < 1e-5, f"{scheme} {tag}: parameters differ by {err:.2e}"
    if hvd.rank() == 0:
        print(f"INFO plane {scheme} {tag}: {want_two} and cached both decode sum a_u D(p_u)"
              f"{', same decisions and updates' if same_decisions else ''}", flush=True)
    return up2


def check_dense():
    for scheme in ("gc-cr", "pgc-cr", "bcgc", "is-sgd"):
        compare(scheme, "dense")
    # bounded staleness fires from its table when a round polls, which depends on timing: the
    # decisions may differ between the runs; each update is still checked against the payloads
    compare("bounded-staleness", "dense", same_decisions=False)
    compare("rs", "dense", kind="complex")
    ok("allreduce_equals_cached_dense")


def check_sparse():
    d = 64 * 10 + 10   # the softmax task on digits
    # small kappa: 2 kappa (n - s) words < 2 (n-1)/n d -> allgather of the chosen rows
    compare("pgc-cr", "topk-small", compression=TopK(k=8), want_two="allgather", kind="sparse")
    # large kappa: densified into the allreduce
    compare("pgc-cr", "topk-large", compression=TopK(k=d // 2, error_feedback=False),
            want_two="allreduce", kind="sparse")
    compare("bcgc", "topk-small", compression=TopK(k=8, error_feedback=False),
            want_two="allgather", kind="sparse")
    ok("sparse_allgather_and_densified_equal_cached")
    # Reed-Solomon under top-kappa: complex rows [Re | Im | indices]; k = d is the dense run
    dense = compare("rs", "dense-ref", kind="complex")
    full = compare("rs", "topk-full", compression=TopK(k=d, error_feedback=False),
                   want_two="allreduce", kind="sparse-complex")
    for t in range(STEPS):
        err = float((full[t] - dense[t]).norm() / dense[t].norm())
        assert err < 1e-5, f"rs step {t}: TopK(k=d) differs from dense by {err:.2e}"
    compare("rs", "topk-small", compression=TopK(k=16, error_feedback=False),
            want_two="allgather", kind="sparse-complex")
    ok("rs_with_topk")


def main():
    hvd.init()
    mode = sys.argv[1]
    if mode == "dense":
        check_dense()
    elif mode == "sparse":
        check_sparse()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ALL OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
