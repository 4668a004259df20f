"""Why stale gradients cost steps under momentum, and what the correction does (simulator).

    python benchmarks/control/momentum_sweep.py [--seeds 0,1,2] [--steps 250] [--jobs 2] [--json PATH]

The demo's workload in the simulator (real gradients, virtual time): n = 4, s = 1, the digits
CNN, batch 16 per partition, one partition = 1 time unit, exponential delays of mean 1 (pattern
``exp`` of :func:`pgc_hvd.delays.pattern_spec`, seeded by the run's seed + 1). For each seed it
runs

* ``dgd`` with the user's optimizer (SGD lr 0.05 momentum 0.9; Adam lr 3e-3);
* ``pgc-cr`` with the user's optimizer as is (``--momentum-correction off``);
* ``pgc-cr`` with the default correction (pgc_hvd.control.momentum: beta' = beta - a/(1+a));
* ``pgc-cr`` with fixed beta' in ``--betas`` and lr = 0.05 (1 - beta') / 0.1 (the same total
  gain lr / (1 - beta), correction off): the mechanism -- if the stale gradients act as
  momentum, lowering the optimizer's own at equal gain must give the steps back;
* plain SGD lr 0.5 (the PGC paper's setting, the same gain) for ``dgd`` and ``pgc-cr``.

``--scope``: instead, the check behind the correction's scope (docs/control.md, "Scope"):
``dgd`` and ``bounded-staleness`` with the correction forced on and off, SGD momentum 0.9,
log-normal delays (median 0.3) plus 10-30 unit stragglers with probability 0.01 (pattern
``lognormal``), 300 steps.

Prints, per variant, steps and virtual time to 90 / 93 / 95% validation accuracy (per seed, and
the median) and the mean gradient age and effective momentum the runs applied.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pgc_hvd.apps.local_ranks import read_result
from pgc_hvd.delays import pattern_spec

TARGETS = (0.90, 0.93, 0.95)


def variants(betas) -> list:
    out = [("dgd", "sgd:lr=0.05,momentum=0.9", "on"),
           ("pgc-cr", "sgd:lr=0.05,momentum=0.9", "off"),
           ("pgc-cr", "sgd:lr=0.05,momentum=0.9", "on")]
    for b in betas:
        out.append(("pgc-cr", f"sgd:lr={0.05 * (1 - b) / 0.1:.6g},momentum={b}", "off"))
    out += [("dgd", "adam:lr=0.003", "on"), ("pgc-cr", "adam:lr=0.003", "off"),
            ("pgc-cr", "adam:lr=0.003", "on"),
            ("dgd", "sgd:lr=0.5", "on"), ("pgc-cr", "sgd:lr=0.5", "on")]
    return out


def scope_variants() -> list:
    return [("dgd", "sgd:lr=0.05,momentum=0.9", "on"),
            ("bounded-staleness", "sgd:lr=0.05,momentum=0.9", "off"),
            ("bounded-staleness", "sgd:lr=0.05,momentum=0.9", "force")]


def run_one(scheme: str, optimizer: str, correction: str, seed: int, steps: int,
            pattern: str = "exp") -> dict:
    delay = pattern_spec(pattern, 4, 1.0, steps, seed=seed + 1)
    code = f"""
import torch
from pgc_hvd.apps.local_ranks import print_result
from pgc_hvd.metrics.targets import first_at_least
from pgc_hvd.schemes import setting_stragglers
from pgc_hvd.sim.run import simulate, prepare_data
torch.set_num_threads(1)
if {correction == 'force'}:      # the correction on a scheme outside its scope (--scope)
    import pgc_hvd.sim.engine as engine
    engine.applies_to = lambda scheme: True
recs, summ = simulate({scheme!r}, 4, setting_stragglers({scheme!r}, 1), dataset="digits",
    model="cnn", optimizer={optimizer!r},
    delay={delay!r}, steps={steps}, seed={seed},
    data=prepare_data("digits", seed={seed}), batch_size=16, partition_time=1.0, eval_every=5,
    momentum_correction={correction != 'off'})
hits = {{tg: first_at_least(recs, tg) for tg in {TARGETS!r}}}
ages = [r.mean_age for r in recs if r.mean_age is not None]
eff = [r.extra["effective_momentum"] for r in recs if r.extra.get("effective_momentum") is not None]
print_result(dict(hits=list(hits.items()), mean_age=sum(ages) / max(len(ages), 1),
                  effective_momentum=sum(eff) / len(eff) if eff else None))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    res = read_result(out.stdout)
    if out.returncode or res is None:
        raise SystemExit(f"{scheme} {optimizer} seed {seed} failed:\n{out.stderr[-2000:]}")
    res.update(scheme=scheme, optimizer=optimizer, correction=correction, seed=seed)
    for tg, (steps_to, time_to) in res.pop("hits"):
        res[f"steps_{tg}"], res[f"time_{tg}"] = steps_to, time_to
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--betas", default="0.7,0.5,0.0",
                   help="fixed optimizer momenta beta' to try on pgc-cr at the user's gain")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--scope", action="store_true",
                   help="the scope check: bounded staleness with the correction forced on/off")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    if a.scope:
        vs, steps, pattern = scope_variants(), max(a.steps, 300), "lognormal"
    else:
        vs = variants([float(b) for b in a.betas.split(",") if b.strip()])
        steps, pattern = a.steps, "exp"
    jobs = [(v, s) for v in vs for s in seeds]
    with ThreadPoolExecutor(a.jobs) as ex:
        results = list(ex.map(lambda j: run_one(*j[0], j[1], steps, pattern), jobs))
    print(f"| scheme | optimizer | correction | mean age | beta applied | "
          + " | ".join(f"steps to {t:.0%} (median; time)" for t in TARGETS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(TARGETS))
    for v in dict.fromkeys((r["scheme"], r["optimizer"], r["correction"]) for r in results):
        rs = [r for r in results if (r["scheme"], r["optimizer"], r["correction"]) == v]
        cells = []
        for t in TARGETS:
            st = [r[f"steps_{t}"] for r in rs]
            tt = [r[f"time_{t}"] for r in rs if r[f"time_{t}"] is not None]
            ok = [x for x in st if x is not None]
            med = statistics.median(ok) if len(ok) == len(st) else None
            cells.append(", ".join("-" if x is None else str(x) for x in st)
                         + (f" ({med:g}; {statistics.median(tt):.0f})" if med is not None else ""))
        em = [r["effective_momentum"] for r in rs if r["effective_momentum"] is not None]
        print(f"| {v[0]} | {v[1]} | {v[2]} | {statistics.mean(r['mean_age'] for r in rs):.2f} | "
              f"{statistics.mean(em) if em else 0:.2f} | " + " | ".join(cells) + " |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
