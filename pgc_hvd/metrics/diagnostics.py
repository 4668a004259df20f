"""Per-step diagnostics of design note 002 and its error decomposition.

For the update g_hat of step t (decoded from messages whose entries were evaluated at model
versions v <= t), with g_bar(beta) = (1/n) sum_k g_k(beta) the exact average gradient:

* ``g_hat_sq``       ||g_hat||^2, the second moment of the update;
* ``disp_mean/max``  ||beta_t - beta_v||^2 over the stale entries used (v < t; ring slots of
                     pipelined messages count one by one);
* ``corr_min/mean``  cos(g_val(beta_v), g_val(beta_t)) on a fixed validation minibatch;
* ``L_hat_max``      max over stale versions of ||g_val(beta_t) - g_val(beta_v)|| /
                     (||beta_t - beta_v|| + eps), the local Lipschitz estimate;
* ``lhat_ratio``     L_hat^2 * disp_max / ||g_hat||^2, the note's signal to lower eta or c;
* error decomposition (squared norms), with p_k = sum_m a_m B_{m,k} the weight partition k
  gets in the decoded sum (real part for complex codes):
  ``err_total`` = ||g_hat - g_bar(beta_t)||^2, and the three terms that add up to that error
  (vectors; their squared norms are reported):
  ``err_coding``   g_fresh - g_bar(beta_t), g_fresh = sum_k p_k g_k(beta_t): straggler /
                   decoding bias (0 for exact schemes);
  ``err_stale``    g_dense - g_fresh, g_dense = sum_m a_m m_m before compression: staleness;
  ``err_compress`` g_hat - g_dense: compression.
  They need one extra pass over all n partitions at beta_t (cached per version).
"""

from __future__ import annotations

import numpy as np
import torch

EPS = 1e-12


def _sq(x: torch.Tensor) -> float:
    return float(x.double().pow(2).sum())


def step_diagnostics(sim, decision, g_hat: torch.Tensor) -> dict:
    t = decision.step
    beta_t = sim.snapshots[t]
    out: dict = {"g_hat_sq": _sq(g_hat)}
    # stale entries: versions of every slot in every used message
    versions: list[int] = []
    for u in decision.uses:
        arr = sim.store[(u.worker, u.step)]["arrival"]
        versions.extend(arr.slot_versions or (u.version,))
    stale = sorted({v for v in versions if v < t and v in sim.snapshots})
    out["n_stale_entries"] = sum(1 for v in versions if v < t)
    if stale:
        gv_t = _val_grad(sim, t)
        disps, corrs, lhats = [], [], []
        for v in stale:
            db = beta_t - sim.snapshots[v]
            dn = float(db.double().norm())
            gv = _val_grad(sim, v)
            disps.append(dn ** 2)
            den = float(gv.double().norm() * gv_t.double().norm())
            corrs.append(float(gv.double() @ gv_t.double()) / den if den > 0 else 1.0)
            lhats.append(float((gv_t - gv).double().norm()) / (dn + EPS))
        # weight the displacement mean by how many entries have each version
        counts = {v: versions.count(v) for v in stale}
        out["disp_mean"] = float(sum(d * counts[v] for d, v in zip(disps, stale)) / sum(counts.values()))
        out["disp_max"] = float(max(disps))
        out["corr_min"] = float(min(corrs))
        out["corr_mean"] = float(np.mean(corrs))
        out["L_hat_max"] = float(max(lhats))
        out["lhat_ratio"] = out["L_hat_max"] ** 2 * out["disp_max"] / max(out["g_hat_sq"], EPS)
    else:
        out.update({"disp_mean": 0.0, "disp_max": 0.0})
    # error decomposition
    G = sim.grads_at(t)
    g_bar = G.mean(0)
    rows = np.stack([sim.scheme.message_row(u.worker, u.step) for u in decision.uses])
    w = np.array([u.weight for u in decision.uses])
    p = (w[:, None] * rows).sum(0)
    p = p.real if np.iscomplexobj(p) else p
    g_fresh = torch.as_tensor(p, dtype=G.dtype) @ G
    g_dense = None
    for u in decision.uses:
        m = sim.store[(u.worker, u.step)]["dense"]
        term = m * u.weight
        g_dense = term if g_dense is None else g_dense + term
    if g_dense.is_complex():
        g_dense = g_dense.real
    g_dense = g_dense.to(G.dtype)
    out["err_total"] = _sq(g_hat.to(G.dtype) - g_bar)
    out["err_coding"] = _sq(g_fresh - g_bar)
    out["err_stale"] = _sq(g_dense - g_fresh)
    out["err_compress"] = _sq(g_hat.to(G.dtype) - g_dense)
    out["g_bar_sq"] = _sq(g_bar)
    return out


def _val_grad(sim, v: int) -> torch.Tensor:
    g = sim._val_grad.get(v)
    if g is None:
        g = sim.grads.gradient(sim.snapshots[v], *sim.val_batch)
        sim._val_grad[v] = g
        for old in [k for k in sim._val_grad if k < v - 64]:
            del sim._val_grad[old]
    return g


def delay_histogram(delays, bins: int = 20) -> dict:
    vals = np.asarray(delays, dtype=float)
    if vals.size == 0:
        return {"counts": [], "edges": []}
    counts, edges = np.histogram(vals, bins=bins)
    return {"counts": counts.tolist(), "edges": edges.tolist(),
            "mean": float(vals.mean()), "p50": float(np.median(vals)),
            "p99": float(np.quantile(vals, 0.99)), "max": float(vals.max())}
