"""Recovery of an elastic pgc_hvd run: a rank killed, a rank added (docs/elastic.md).

    .venv/bin/python benchmarks/elastic/elastic_recovery.py --out docs/figures/elastic_recovery.json

For each gloo timeout in ``--gloo-timeouts`` (``HOROVOD_GLOO_TIMEOUT_SECONDS``: how long a rank
waits on a peer that sends nothing; a rank with no connection to the dead one learns of the death
only this way) it runs ``launch/elastic_train.py`` under ``horovodrun --gloo -np 4 --min-np 3
--host-discovery-script``, each rank its own host (127.0.0.2-5 over ssh, launch/local_hosts.py),
and SIGKILLs the rank on the third host at version ``--kill-at``. Then, with ``--join``, a run that
starts with 3 ranks and adds a fourth host to the discovery listing. Printed and saved per run:

* kill -> first step: the kill's time (``kill.json``, written just before SIGKILL) to the end of
  the first step of the new world (rank 0's ``first_step_at``), split into detect (kill -> the
  last survivor noticed; ``detect_first_s``: the first one), re-form (-> Horovod's new world started the sync), rebuild (-> the new
  optimizer and partitions were ready) and first step;
* a join: the time rank 0 added the host to the listing (``add.json``) to the first step of the
  world of 4 (the run trains on until the world has 4 ranks, then 30 versions more);
* time per step before and after: median over the survivors of the seconds per version of
  their steps in each world (the first 3 steps of a world, ring warm-up, left out).
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

ELASTIC = ROOT / "launch" / "elastic_train.py"


def per_step(rows, n, skip=3):
    """Median over ranks of the median seconds per version of the steps taken in worlds of n."""
    meds = []
    for r in rows:
        st = [(v, t) for v, t, m in r["step_times"] if m == n][skip:]
        d = [(t1 - t0) / (v1 - v0) for (v0, t0), (v1, t1) in zip(st, st[1:]) if v1 > v0]
        if d:
            meds.append(statistics.median(d))
    return statistics.median(meds) if meds else None


def run_case(lh, work: Path, *, np_, hosts, args, gloo_timeout, timeout=600):
    listing, disc = lh.discovery(work, hosts)
    out = work / "run"
    env = lh.elastic_env(gloo_timeout, str(ROOT))
    cmd = [str(Path(sys.executable).with_name("horovodrun")), "--gloo", "-np", str(np_),
           "--min-np", "3", "--max-np", "4", "--host-discovery-script", str(disc),
           *lh.horovodrun_args(), sys.executable, str(ELASTIC), "--out", str(out),
           *[a.replace("@HOSTS@", str(listing)) for a in args]]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(work))
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    events = [json.loads(x) for x in (out / "elastic.jsonl").read_text().splitlines()]
    return rows, events, out, wall


def summarize(kind, rows, events, out, wall, gloo_timeout, old_n, new_n):
    ev = events[0]
    start_file = out / ("kill.json" if kind == "kill" else "add.json")
    t_event = json.loads(start_file.read_text())["time"]
    res = {"case": kind, "gloo_timeout_s": gloo_timeout, "old_n": old_n, "new_n": new_n,
           "step": ev["step"], "wall_s": wall,
           "event_to_first_step_s": ev["first_step_at"] - t_event,
           "detect_s": ev["noticed_at"] - t_event,
           "detect_first_s": (ev["noticed_first_at"] - t_event
                              if ev.get("noticed_first_at") is not None else None),
           "reform_s": ev["sync_started_at"] - ev["noticed_at"],
           "rebuild_s": ev["ready_at"] - ev["sync_started_at"],
           "first_step_s": ev["first_step_at"] - ev["ready_at"],
           "seconds_lost_recorded": ev["seconds_lost"],
           "parameters_broadcast": ev["parameters_broadcast"],
           "step_before_s": per_step(rows, old_n), "step_after_s": per_step(rows, new_n),
           "identical_parameters": len({r["digest"] for r in rows}) == 1,
           "ranks_finished": len(rows), "final_version": sorted({r["version"] for r in rows})}
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--kill-at", type=int, default=20)
    p.add_argument("--compute-time", type=float, default=0.02,
                   help="emulated compute seconds per partition (elastic_train.py)")
    p.add_argument("--gloo-timeouts", default="5,30", help="HOROVOD_GLOO_TIMEOUT_SECONDS values")
    p.add_argument("--join", action="store_true", help="also measure a rank that joins")
    p.add_argument("--join-gloo-timeout", type=int, default=30,
                   help="HOROVOD_GLOO_TIMEOUT_SECONDS of the join run (it bounds the re-formed "
                        "world's rendezvous, which waits for the new process to start)")
    p.add_argument("--out", default=None, help="JSON file for the figures")
    args = p.parse_args(argv)
    results = []
    common = ["--steps", str(args.steps), "--compute-time", str(args.compute_time)]
    with LocalHosts(count=4) as lh:
        for gt in [int(x) for x in args.gloo_timeouts.split(",")]:
            with tempfile.TemporaryDirectory() as d:
                rows, events, out, wall = run_case(
                    lh, Path(d), np_=4, hosts=lh.hosts, gloo_timeout=gt,
                    args=common + ["--kill-host", lh.hosts[2], "--kill-at", str(args.kill_at)])
                results.append(summarize("kill", rows, events, out, wall, gt, 4, 3))
                print(json.dumps(results[-1]), flush=True)
        if args.join:
            gt = args.join_gloo_timeout
            with tempfile.TemporaryDirectory() as d:
                rows, events, out, wall = run_case(
                    lh, Path(d), np_=3, hosts=lh.hosts[:3], gloo_timeout=gt,
                    args=common + ["--add-host", f"{lh.hosts[3]}:1", "--add-at",
                                   str(args.kill_at), "--hosts-file", "@HOSTS@",
                                   "--until-n", "4", "--max-steps", "3000"])
                results.append(summarize("join", rows, events, out, wall, gt, 3, 4))
                print(json.dumps(results[-1]), flush=True)
    print("\n| case | gloo timeout | step | event -> first step | detect | re-form | rebuild |"
          " first step | s/step before | s/step after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} {r['old_n']}->{r['new_n']} | {r['gloo_timeout_s']} s | {r['step']} "
              f"| {r['event_to_first_step_s']:.2f} s | {r['detect_s']:.2f} | {r['reform_s']:.2f} "
              f"| {r['rebuild_s']:.2f} | {r['first_step_s']:.2f} | {r['step_before_s']:.4f} | "
              f"{r['step_after_s']:.4f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python benchmarks/elastic/elastic_recovery.py " + " ".join(argv or sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores", "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
