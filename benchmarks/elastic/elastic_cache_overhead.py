"""What Horovod's response cache is worth to an elastic pgc_hvd run without kills.

    python benchmarks/elastic/elastic_cache_overhead.py --repeats 3 \\
        --out docs/figures/elastic_cache_overhead.json

``pgc_hvd.runtime.elastic`` turns Horovod's response cache off (``HOROVOD_CACHE_CAPACITY=0``)
because its per-cycle bit allreduce can abort a survivor in gloo when the world breaks
(docs/elastic.md, "Killing rank 0"). This measures what that costs when nothing breaks: jobs of
``launch/elastic_train.py`` (the set-up of ``benchmarks/elastic/elastic_random_kills.py``: horovodrun
--gloo -np 4, each rank its own ssh host 127.0.0.2-5, gloo on ``lo``, MLP 16-32-2, pgc-cr,
s = 1) with no kill, alternating the cache's capacity (``--capacities``, default ``0,1024``:
off, Horovod's default), ``--repeats`` jobs each. Per job: the median seconds per version over
the versions after ``--warmup`` (each rank's ``step_times``; the job's figure is the median
over its ranks), and the job's wall time. ``--env KEY=VALUE`` sets a variable for every rank
(e.g. ``HOROVOD_CYCLE_TIME=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))
from local_hosts import LocalHosts  # noqa: E402

from elastic_common import add_env_option, env_option  # noqa: E402  (beside this script)

ELASTIC = ROOT / "launch" / "elastic_train.py"


def one_job(lh, work: Path, *, capacity: int, args) -> dict:
    _, disc = lh.discovery(work)
    out = work / "run"
    env = lh.elastic_env(args.gloo_timeout, str(ROOT))
    env.update(args.env)
    env["HOROVOD_CACHE_CAPACITY"] = str(capacity)   # horovodrun passes it on to every rank
    cmd = [str(Path(sys.executable).with_name("horovodrun")), "--gloo", "-np", "4",
           "--min-np", "3", "--max-np", "4", "--host-discovery-script", str(disc),
           *lh.horovodrun_args(), sys.executable, str(ELASTIC), "--out", str(out),
           "--steps", str(args.steps), "--compute-time", str(args.compute_time),
           "--timeout", str(2 * args.gloo_timeout + 10)]
    t0 = time.time()
    with open(work / "stdout", "w") as so, open(work / "stderr", "w") as se:
        try:
            rc = subprocess.run(cmd, stdout=so, stderr=se, env=env, cwd=str(work),
                                timeout=args.job_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{(work / 'stderr').read_text()[-3000:]}")
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    per_rank = []
    for r in rows:
        st = [(v, t) for v, t, _ in r["step_times"]]
        gaps = [t1 - t0_ for (v0, t0_), (v1, t1) in zip(st, st[1:])
                if v0 >= args.warmup and v1 == v0 + 1]
        per_rank.append(statistics.median(gaps))
    return {"capacity": capacity, "s_per_version": statistics.median(per_rank),
            "s_per_version_ranks": per_rank, "wall_s": time.time() - t0,
            "worlds": sorted({r["worlds"] for r in rows}),
            "identical_parameters": len({r["digest"] for r in rows}) == 1,
            "final_version": sorted({r["version"] for r in rows})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="jobs per capacity")
    p.add_argument("--capacities", default="0,1024",
                   help="HOROVOD_CACHE_CAPACITY values, alternated job by job")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20, help="versions left out of the figure")
    p.add_argument("--compute-time", type=float, default=0.02)
    p.add_argument("--gloo-timeout", type=int, default=30)
    p.add_argument("--job-timeout", type=float, default=300)
    add_env_option(p, "HOROVOD_CYCLE_TIME=1")
    p.add_argument("--out", default=None, help="JSON file for the figures")
    args = p.parse_args(argv)
    args.env = env_option(p, args.env)
    caps = [int(c) for c in args.capacities.split(",")]
    results = []
    with LocalHosts(count=4) as lh:
        for rep in range(args.repeats):
            for cap in caps:
                with tempfile.TemporaryDirectory() as d:
                    try:
                        row = {**one_job(lh, Path(d), capacity=cap, args=args), "ok": True}
                    except RuntimeError as err:   # kept as a row, with its error
                        row = {"capacity": cap, "ok": False, "error": str(err)[-1500:]}
                row["repeat"] = rep
                results.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for cap in caps:
        ok = [r for r in results if r["capacity"] == cap and r["ok"]]
        spv = [r["s_per_version"] for r in ok]
        summary[str(cap)] = {
            "jobs": sum(r["capacity"] == cap for r in results), "ok": len(ok),
            "s_per_version_median": statistics.median(spv) if spv else None,
            "s_per_version_each": spv,
            "wall_s_median": statistics.median([r["wall_s"] for r in ok]) if ok else None}
    print("\n| HOROVOD_CACHE_CAPACITY | jobs | s/version (median of jobs) | each job | wall (median) |")
    print("|---|---|---|---|---|")
    for cap, s in summary.items():
        if s["ok"]:
            print(f"| {cap} | {s['ok']} of {s['jobs']} | {1000 * s['s_per_version_median']:.1f} ms | "
                  + ", ".join(f"{1000 * x:.1f}" for x in s["s_per_version_each"])
                  + f" ms | {s['wall_s_median']:.1f} s |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python benchmarks/elastic/elastic_cache_overhead.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores", "env": args.env, "summary": summary,
            "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
