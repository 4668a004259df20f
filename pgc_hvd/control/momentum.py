"""Staleness-aware momentum: the user's momentum, less the momentum the stale gradients add.

Owns: the rule that turns a decided update's gradient ages into the momentum and learning rate
the user's optimizer is applied with for that one update. Imports torch only (no engine); both
engines call :func:`compensated` around their ``optimizer.step()`` with the decision's
``info["mean_age"]``.

Why (docs/experiments.md, "Deep networks"; issue 22). A pipelined update is a moving sum of
gradients taken at the last c models: with the 1/(n mu) PGC-CR decoder and every slot used,

    g_hat_t ~= (1/c) sum_{a=0}^{c-1} grad F(beta_{t-a}),

a low-pass filter of mean delay a_bar = (c-1)/2 (more when a straggler's messages are late);
bounded staleness likewise averages gradients up to c-1 versions old. Asynchronous SGD theory
calls this implicit momentum ("asynchrony begets momentum", Mitliagkas et al. 2016): a filter of
mean delay a_bar acts like heavy-ball momentum

    mu_imp = a_bar / (1 + a_bar)        (a geometric filter of the same mean delay).

Stacked on the user's momentum beta (0.9 in nearly every script) the total is too much: on a
quadratic of curvature h the coded heavy ball x_{t+1} = x_t + beta (x_t - x_{t-1}) - eta h
[(1-rho) x_t + rho x_{t-1}] (rho = the stale share) has roots of modulus sqrt(beta + eta h rho),
against sqrt(beta) without staleness: modes that DGD damps at 0.95 per step barely decay, and
training needs 40-80% more steps (measured, docs/benchmarks.md "Time to accuracy").

The remedy applies the user's rule with the momentum the coded update has not already supplied,

    beta' = max(0, beta - mu_imp),      lr' = lr (1 - beta') / (1 - beta)   (SGD, RMSprop),

so the total step of a persistent gradient, lr / (1 - beta), is the user's (the gain is kept and
only the delay moves from the optimizer's buffer to the pipeline). Adam-type rules (``betas``)
normalise their first moment (gain 1), so only beta1 moves: beta1' = max(0, beta1 - mu_imp).
An update with no stale gradient (a_bar = 0: DGD, GC, IS-SGD, BCGC, a PGC warm-up) is applied
with the user's values unchanged, bit for bit.

What it keeps: the user's hyper-parameters as the user (and a scheduler, and
``state_dict()``) sees them -- they are swapped in for the one ``step()`` and restored after;
every rank takes the same values (a_bar comes from the decision, identical on every rank); it is
a pure function of the decision, so no state to checkpoint. What it changes: the update rule is
heavy ball (or Adam) with a per-step momentum beta'_t and step lr'_t. The PGC convergence
theorems (Thms. 1-2) are for plain gradient steps, which this leaves untouched (beta = 0 gives
beta' = 0, lr' = lr); for momentum the guarantee is the usual heavy-ball one with
beta'_t <= beta, and the total gain lr / (1 - beta) is the user's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

__all__ = ["MomentumCorrection", "applies_to", "implicit_momentum", "momentum_correction",
           "compensated", "parse_momentum_correction", "fresh_leaning_decay",
           "remedy_scheme_options"]


def applies_to(scheme) -> bool:
    """Whether the correction acts on ``scheme``'s updates: the pipelined schemes (PGC-FR,
    PGC-CR, PGC-BCGC), whose message sums a partition's evaluations at the last c models -- an
    average over time, which is momentum. Not bounded staleness: its table holds ONE gradient
    per shard, delayed by up to c - 1 versions but never averaged with a fresher one, and the
    correction measured worse there (digits CNN, n = 4, s = 1, log-normal delays with long
    stragglers, SGD momentum 0.9: 216-261 steps to 95% with it against 151-206 without, 3 seeds;
    docs/control.md). Exact schemes have no stale gradient (a = 0: nothing to correct)."""
    return bool(scheme.pipelined)


def implicit_momentum(mean_age: Optional[float]) -> float:
    """mu_imp = a_bar / (1 + a_bar): the heavy-ball momentum of a geometric filter whose mean
    delay is the update's mean gradient age a_bar (0 for a fresh update or an unknown age)."""
    if mean_age is None or not mean_age > 0.0:
        return 0.0
    a = float(mean_age)
    return a / (1.0 + a)


@dataclass(frozen=True)
class MomentumCorrection:
    """What one update is applied with: ``mu`` (implicit momentum subtracted) and, for the
    record, the first group's user and effective momentum (``None`` when that group has
    none)."""

    mu: float
    user_momentum: Optional[float]
    effective_momentum: Optional[float]

    def record(self) -> dict:
        """The record fields (``rec.extra``): mu_imp and the momentum actually applied."""
        return {"implicit_momentum": self.mu, "momentum": self.user_momentum,
                "effective_momentum": self.effective_momentum}


def parse_momentum_correction(value) -> bool:
    """The ``momentum_correction`` argument: True (default, "auto", "on") or False ("off")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("auto", "on", "true"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("off", "false", "none"):
        return False
    raise ValueError(f"momentum_correction={value!r}: use True (default: subtract the momentum "
                     "the stale gradients add, see pgc_hvd.control.momentum) or False (apply "
                     "the optimizer's own momentum unchanged)")


def _group_momentum(group: dict) -> Optional[float]:
    if "betas" in group:
        return float(group["betas"][0])
    m = group.get("momentum")
    return None if m is None else float(m)


def fresh_leaning_decay(param_groups) -> Optional[float]:
    """PGC-CR's ring decay under the remedy: rho = 1 - beta, beta the user's momentum (first
    group's ``momentum``, or ``betas[0]`` for Adam-type rules); None (keep the paper's rho = 1)
    without momentum.

    Why (docs/experiments.md, "Weighting the ring by age"; issue 22): a ring weighted rho^a is
    itself a moving average of past gradients, a second momentum stacked on the user's. With
    plain SGD the ring's averaging is the only one and the paper's rho = 1 is fastest (softmax,
    0.58 x DGD's time); with beta = 0.9 the user's buffer already averages over ~1/(1 - beta)
    steps and every bit of weight on stale slots costs steps: the best measured rho is 0.25 on
    the digits CNN and 0-0.05 on MNIST-1D, and rho = 0.1 = 1 - beta is within 0.08 of the best
    on both (0.726 and 0.665 x DGD) where rho = 1 is 0.695 and > 2.35. The rule interpolates
    between the two measured ends (beta = 0 -> 1, beta = 0.9 -> 0.1); other betas are not
    measured. The stale slots keep a small weight so that a straggler's partitions still enter
    the update (coverage), which is what rho = 0 (IS-SGD with rotating partitions) gives up.
    It is read once, when the scheme is built; a scheduler that changes the momentum later does
    not change rho."""
    beta = _group_momentum(param_groups[0]) if param_groups else None
    if beta is None or not beta > 0.0:
        return None
    return min(1.0, max(0.0, 1.0 - beta))


def remedy_scheme_options(scheme: str, options: Optional[dict], param_groups,
                          enabled: bool = True) -> dict:
    """The scheme options a run uses: ``options`` plus, when the remedy is on (``enabled``,
    i.e. ``momentum_correction``): for PGC-CR without a given ``decay`` and an optimizer with
    momentum, ``decay`` = :func:`fresh_leaning_decay`; for bounded staleness without a given
    ``replay``, ``replay="once"``, ``fire="current"`` and ``normalize=True`` (each gradient
    counted once, a step on n - s gradients of the current model, the mean of its new ones).
    Both engines build their scheme with this (so the runtime and the simulator agree);
    ``momentum_correction=False`` or an explicit ``decay`` / ``replay`` keeps the user's choice.

    Why bounded staleness counts once whatever the optimizer (docs/control.md, "Bounded
    staleness: each gradient counted once"; issue 35): the design note's rule applies each table
    entry at up to c consecutive steps (1.45 / 2.42 / 4.73 uses per gradient at c = 2 / 4 / 8
    under the note's delays). On MNIST-1D it then fails with momentum 0.9 (1, 0, 0 of 5 seeds
    reach the target; counted once: 5/5 at every c, 0.61x DGD's time) and with plain SGD lr 0.5
    (final accuracy 0.21 / 0.10 / 0.10 against 0.32 counted once, 3 seeds). Only on the convex
    softmax of docs/experiments.md section 3 (plain SGD) do the replays help (the table mean is
    SAG-like: 69-292 s to the target against 463-474 s counted once, both below GC's 502 s):
    ``scheme_options={"replay": "mean"}`` there."""
    opts = dict(options or {})
    if not enabled or not isinstance(scheme, str):
        return opts
    from pgc_hvd.schemes.registry import scheme_class
    name = scheme_class(scheme).name
    if name == "bounded-staleness":
        if "replay" not in opts:    # the remedy as a whole; a given replay keeps the user's rule
            opts["replay"] = "once"
            opts.setdefault("fire", "current")
            opts.setdefault("normalize", True)
        return opts
    if name != "pgc-cr" or "decay" in opts:
        return opts
    rho = fresh_leaning_decay(param_groups)
    if rho is not None:
        opts["decay"] = rho
    return opts


def _compensated_momentum(beta: float, mu: float) -> float:
    return max(0.0, beta - mu)


def momentum_correction(param_groups, mean_age: Optional[float],
                        enabled: bool = True) -> MomentumCorrection:
    """The correction an update of mean gradient age ``mean_age`` gets (changes nothing)."""
    mu = implicit_momentum(mean_age) if enabled else 0.0
    first = _group_momentum(param_groups[0]) if param_groups else None
    eff = first if (first is None or mu == 0.0) else _compensated_momentum(first, mu)
    return MomentumCorrection(mu, first, eff)


@contextlib.contextmanager
def compensated(param_groups, mean_age: Optional[float],
                enabled: bool = True) -> Iterator[MomentumCorrection]:
    """Within the block, every group's momentum (``momentum``, or ``betas[0]``) is
    beta' = max(0, beta - mu_imp(mean_age)) and, for ``momentum`` groups, ``lr`` is
    lr (1 - beta') / (1 - beta); the user's values are restored on exit (also on error).
    Yields the :class:`MomentumCorrection` applied (``mu = 0``, nothing touched, when disabled
    or the update is fresh)."""
    corr = momentum_correction(param_groups, mean_age, enabled)
    mu = corr.mu
    if mu == 0.0:
        yield corr
        return
    saved = []
    for g in param_groups:
        if "betas" in g:
            b1, b2 = g["betas"][0], g["betas"][1]
            saved.append((g, "betas", g["betas"]))
            g["betas"] = (_compensated_momentum(float(b1), mu), b2)
        elif g.get("momentum"):
            beta = float(g["momentum"])
            new = _compensated_momentum(beta, mu)
            saved.append((g, "momentum", g["momentum"]))
            saved.append((g, "lr", g["lr"]))
            if beta < 1.0:
                g["lr"] = g["lr"] * (1.0 - new) / (1.0 - beta)
            g["momentum"] = new
    try:
        yield corr
    finally:
        for g, key, value in reversed(saved):
            g[key] = value
