"""Per-step staleness diagnostics and error decomposition of an update (docs/control.md).

For the update g_hat of step t (decoded from messages whose entries were evaluated at model
versions v <= t), with g_bar(beta) = (1/n) sum_k g_k(beta) the exact average gradient:

* ``g_hat_sq``       ||g_hat||^2, the second moment of the update;
* ``disp_mean/max``  ||beta_t - beta_v||^2 over the stale entries used (v < t; ring slots of
                     pipelined messages count one by one);
* ``corr_min/mean``  cos(g_val(beta_v), g_val(beta_t)) on a fixed validation minibatch;
* ``L_hat_max``      max over stale versions of ||g_val(beta_t) - g_val(beta_v)|| /
                     (||beta_t - beta_v|| + eps), the local Lipschitz estimate;
* ``lhat_ratio``     L_hat^2 * disp_max / ||g_hat||^2, the control rule's signal to lower eta
                     or c (:mod:`pgc_hvd.control.rule`);
* error decomposition (squared norms), with p_k = sum_m a_m B_{m,k} the weight partition k
  gets in the decoded sum (real part for complex codes):
  ``err_total`` = ||g_hat - g_bar(beta_t)||^2, and the three terms that add up to that error
  (vectors; their squared norms are reported):
  ``err_coding``   g_fresh - g_bar(beta_t), g_fresh = sum_k p_k g_k(beta_t): straggler /
                   decoding bias (0 for exact schemes);
  ``err_stale``    g_dense - g_fresh, g_dense = sum_m a_m m_m before compression: staleness;
  ``err_compress`` g_hat - g_dense: compression.
  They need one extra pass over all n partitions at beta_t (cached per version).

Pure functions of their arguments: the simulator calls both every ``diag_every`` steps, the
runtime's :class:`~pgc_hvd.control.runtime.AdaptiveController` calls
:func:`staleness_diagnostics` with the oldest version a step used.
"""

from __future__ import annotations

import numpy as np
import torch

EPS = 1e-12


def _sq(x: torch.Tensor) -> float:
    return float(x.double().pow(2).sum())


def staleness_diagnostics(step: int, versions, snapshots, val_grad, g_hat_sq: float) -> dict:
    """The staleness figures of step t's update (module doc), the same in both engines.

    ``versions``: the model version v of every entry the update used, with multiplicity (ring
    slots of pipelined messages one by one); ``snapshots``: version -> flat parameters beta_v
    (must hold t; stale versions it lacks are left out); ``val_grad``: version -> gradient on
    the fixed validation batch at beta_v; ``g_hat_sq`` = ||g_hat||^2. Over the stale versions
    S = {v < t}: ``disp_mean`` (weighted by each version's entries) / ``disp_max`` of
    ||beta_t - beta_v||^2, ``corr_min/mean``, ``L_hat_max``, ``lhat_ratio`` =
    L_hat^2 * disp_max / ||g_hat||^2; with S empty only disp_mean = disp_max = 0."""
    t = step
    beta_t = snapshots[t]
    stale = sorted({v for v in versions if v < t and v in snapshots})
    out: dict = {"n_stale_entries": sum(1 for v in versions if v < t)}
    if not stale:
        out.update({"disp_mean": 0.0, "disp_max": 0.0})
        return out
    gv_t = val_grad(t)
    disps, corrs, lhats = [], [], []
    for v in stale:
        db = beta_t - snapshots[v]
        dn = float(db.double().norm())
        gv = val_grad(v)
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
    out["lhat_ratio"] = out["L_hat_max"] ** 2 * out["disp_max"] / max(g_hat_sq, EPS)
    return out


def error_decomposition(g_hat: torch.Tensor, G: torch.Tensor, rows, weights, dense) -> dict:
    """``err_total``, ``err_coding``, ``err_stale``, ``err_compress`` and ``g_bar_sq`` (module
    doc) of an update g_hat decoded from messages m with decode weights a_m (``weights``),
    coefficient rows B_m over the partitions (``rows``, an (M, n) array) and dense forms
    ``dense`` (before compression); ``G`` holds the n partition gradients at beta_t."""
    g_bar = G.mean(0)
    p = (np.asarray(weights)[:, None] * rows).sum(0)
    p = p.real if np.iscomplexobj(p) else p
    g_fresh = torch.as_tensor(p, dtype=G.dtype) @ G
    g_dense = None
    for m, a in zip(dense, weights):
        term = m * a
        g_dense = term if g_dense is None else g_dense + term
    if g_dense.is_complex():
        g_dense = g_dense.real
    g_dense = g_dense.to(G.dtype)
    return {"err_total": _sq(g_hat.to(G.dtype) - g_bar), "err_coding": _sq(g_fresh - g_bar),
            "err_stale": _sq(g_dense - g_fresh),
            "err_compress": _sq(g_hat.to(G.dtype) - g_dense), "g_bar_sq": _sq(g_bar)}


def delay_histogram(delays, bins: int = 20) -> dict:
    vals = np.asarray(delays, dtype=float)
    if vals.size == 0:
        return {"counts": [], "edges": []}
    counts, edges = np.histogram(vals, bins=bins)
    return {"counts": counts.tolist(), "edges": edges.tolist(),
            "mean": float(vals.mean()), "p50": float(np.median(vals)),
            "p99": float(np.quantile(vals, 0.99)), "max": float(vals.max())}
