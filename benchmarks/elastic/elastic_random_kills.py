"""Seconds lost when a rank of an elastic pgc_hvd run is SIGKILLed at a random moment.

    python benchmarks/elastic/elastic_random_kills.py --kills 5 --gloo-timeouts 10,30 \\
        --out docs/figures/elastic_recovery_random.json

For each gloo timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``) it runs ``--kills`` jobs of
``launch/elastic_train.py`` under ``horovodrun --gloo -np 4 --min-np 3 --max-np 4
--host-discovery-script``, each rank its own host (127.0.0.2-5 over ssh, launch/local_hosts.py,
gloo on ``lo``). In each job a host chosen at random (seeded, ``--seed``) loses its rank: once
that rank has taken its first step (``started-<host>.json``), the benchmark waits a random
``--delay`` seconds (uniform) and SIGKILLs it from outside, at whatever point of a step it is.
Per kill: the version it landed at, ``lost_s`` = the kill to the end of the first step of the new
world (rank 0's ``first_step_at``: everything the death cost, including the step it interrupted),
split into detect (-> the last survivor noticed; ``detect_first_s``: the first), re-form (->
Horovod's new world started the sync), rebuild (-> the new optimizer and partitions were ready)
and first step; and whether every survivor ended with the same parameters. Per timeout: the
median and max of ``lost_s`` and ``detect_s``. ``--no-cascade`` measures the world without the
fast leaving of a broken world (``ElasticState(cascade=False)``). ``--env KEY=VALUE`` sets a variable for every rank
(e.g. ``HOROVOD_LOG_LEVEL=trace``, or ``HOROVOD_CACHE_CAPACITY=1024`` for Horovod's response
cache on, as elastic runs had it before pgc_hvd turned it off), ``--keep DIR`` keeps the output of the jobs that did not
recover.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
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


def _started(out: Path, victim: str):
    """The started-<host>.json record of the victim (a host, or ``rank:R``: whichever host's
    process holds rank R), once written in full; None before."""
    files = ([out / f"started-{victim}.json"] if not victim.startswith("rank:")
             else sorted(out.glob("started-*.json")))
    for f in files:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not victim.startswith("rank:") or rec.get("rank") == int(victim[5:]):
            return rec
    return None


def one_kill(lh, work: Path, *, victim: str, delay: float, gloo_timeout: int, args,
             timeout: float = 600) -> dict:
    _, disc = lh.discovery(work)
    out = work / "run"
    env = lh.elastic_env(gloo_timeout, str(ROOT))
    env.update(args.env)   # horovodrun passes its environment on to every rank
    cmd = [str(Path(sys.executable).with_name("horovodrun")), "--gloo", "-np", "4",
           "--min-np", "3", "--max-np", "4", "--host-discovery-script", str(disc),
           *lh.horovodrun_args(), sys.executable, str(ELASTIC), "--out", str(out),
           "--steps", str(args.steps), "--compute-time", str(args.compute_time),
           "--timeout", str(2 * gloo_timeout + 10)] + (["--no-cascade"] if args.no_cascade else [])
    t0 = time.time()
    with open(work / "stdout", "w") as so, open(work / "stderr", "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env, cwd=str(work))
        deadline = time.monotonic() + timeout
        first = None
        while first is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the job ended before {victim} started: "
                                   f"{(work / 'stderr').read_text()[-3000:]}")
            first = _started(out, victim)
            time.sleep(0.02)
        pid, victim_rank, victim = first["pid"], first.get("rank"), first["host"]
        time.sleep(delay)
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        try:
            rc = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{(work / 'stderr').read_text()[-3000:]}")
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    ev = json.loads((out / "elastic.jsonl").read_text().splitlines()[0])
    at = max((v for r in rows for v, t, _ in r["step_times"] if t <= t_kill), default=None)
    return {"gloo_timeout_s": gloo_timeout, "victim": victim, "victim_rank": victim_rank,
            "delay_s": delay,
            "version_at_kill": at, "step": ev["step"], "old_n": ev["old_n"],
            "new_n": ev["new_n"], "lost_s": ev["first_step_at"] - t_kill,
            "detect_s": ev["noticed_at"] - t_kill,
            "detect_first_s": ev["noticed_first_at"] - t_kill,
            "reform_s": ev["sync_started_at"] - ev["noticed_at"],
            "rebuild_s": ev["ready_at"] - ev["sync_started_at"],
            "first_step_s": ev["first_step_at"] - ev["ready_at"],
            "parameters_broadcast": ev["parameters_broadcast"],
            "identical_parameters": len({r["digest"] for r in rows}) == 1,
            "ranks_finished": len(rows), "final_version": sorted({r["version"] for r in rows}),
            "wall_s": wall}


def summary(rows: list) -> dict:
    """Over the jobs that recovered; ``not_recovered``: the jobs that did not (kept as rows with
    their error, never dropped)."""
    ok = [r for r in rows if r.get("recovered", True)]
    lost = [r["lost_s"] for r in ok] or [float("nan")]
    det = [r["detect_s"] for r in ok] or [float("nan")]
    return {"kills": len(rows), "not_recovered": len(rows) - len(ok),
            "lost_median_s": statistics.median(lost),
            "lost_max_s": max(lost), "detect_median_s": statistics.median(det),
            "detect_max_s": max(det),
            "identical_parameters": all(r["identical_parameters"] for r in ok)}


def failed_job(victim: str, delay: float, gloo_timeout: int, err: Exception) -> dict:
    """The row of a job that did not recover: the lines of its stderr that say why."""
    text = str(err)
    why = [ln for ln in text.splitlines()
           if any(k in ln for k in ("EnforceNotMet", "enforce fail", "terminate called",
                                    "exited", "ended before"))]
    return {"gloo_timeout_s": gloo_timeout, "victim": victim, "delay_s": delay,
            "recovered": False, "error": "\n".join(why[:6]) or text[-600:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=5, help="jobs (one kill each) per gloo timeout")
    p.add_argument("--gloo-timeouts", default="10,30")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--compute-time", type=float, default=0.02)
    p.add_argument("--delay", default="0.5,6", help="MIN,MAX seconds after the victim's first "
                                                     "step (uniform)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--job-timeout", type=float, default=600,
                   help="seconds a job may take before it counts as not recovered")
    p.add_argument("--no-cascade", action="store_true",
                   help="ElasticState(cascade=False): no fast leaving of a broken world")
    p.add_argument("--victim-host", type=int, default=None,
                   help="always kill the rank on this host (index into the 4 hosts; which rank "
                        "a host holds is Horovod's choice)")
    p.add_argument("--victim-rank", type=int, default=None,
                   help="always kill the process that holds this rank at its first step (0: "
                        "the control log's decider and the server of its store); default: a "
                        "host drawn at random for each job")
    add_env_option(p, "HOROVOD_LOG_LEVEL=trace")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="copy the stdout and stderr of each job that did not recover (all "
                        "jobs with --keep-all) to DIR/job-<timeout>s-<index>/")
    p.add_argument("--keep-all", action="store_true")
    p.add_argument("--out", default=None, help="JSON file for the figures")
    args = p.parse_args(argv)
    args.env = env_option(p, args.env)
    lo, hi = (float(x) for x in args.delay.split(","))
    rng = random.Random(args.seed)
    results, summaries = [], {}
    with LocalHosts(count=4) as lh:
        for gt in [int(x) for x in args.gloo_timeouts.split(",")]:
            mine = []
            for _ in range(args.kills):
                victim, delay = rng.choice(lh.hosts), rng.uniform(lo, hi)
                if args.victim_host is not None:
                    victim = lh.hosts[args.victim_host]
                if args.victim_rank is not None:
                    victim = f"rank:{args.victim_rank}"
                with tempfile.TemporaryDirectory() as d:
                    try:
                        mine.append({**one_kill(lh, Path(d), victim=victim, delay=delay,
                                                gloo_timeout=gt, args=args,
                                                timeout=args.job_timeout), "recovered": True})
                    except RuntimeError as err:   # kept as a row: nothing measured is lost
                        mine.append(failed_job(victim, delay, gt, err))
                    if args.keep and (args.keep_all or not mine[-1]["recovered"]):
                        kept = Path(args.keep) / f"job-{gt}s-{len(mine) - 1}"
                        kept.mkdir(parents=True, exist_ok=True)
                        for name in ("stdout", "stderr"):
                            if (Path(d) / name).exists():
                                shutil.copy(Path(d) / name, kept / name)
                        mine[-1]["kept"] = str(kept)
                print(json.dumps(mine[-1]), flush=True)
            results += mine
            summaries[str(gt)] = summary(mine)
            print(json.dumps({"gloo_timeout_s": gt, **summaries[str(gt)]}), flush=True)
    print("\n| gloo timeout | kills | not recovered | lost: median | lost: max | detect (last "
          "survivor): median | max | identical parameters |")
    print("|---|---|---|---|---|---|---|---|")
    for gt, s in summaries.items():
        print(f"| {gt} s | {s['kills']} | {s['not_recovered']} | {s['lost_median_s']:.2f} s | "
              f"{s['lost_max_s']:.2f} s | {s['detect_median_s']:.2f} s | "
              f"{s['detect_max_s']:.2f} s | {s['identical_parameters']} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python benchmarks/elastic/elastic_random_kills.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores", "cascade": not args.no_cascade,
            "env": args.env,
            "summary": summaries, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
