"""Kills at random moments in the first minute of a 4-host elastic job (issue 26, item 2).

    .venv/bin/python benchmarks/elastic_startup_kills.py --tries 10 \\
        --out docs/figures/elastic_startup_kills.json

Each try launches ``launch/elastic_train.py`` (``--progress``, a checkpoint every version) under
``horovodrun --gloo -np 4 --min-np 2 --max-np 4 --host-discovery-script``, each rank its own
host (127.0.0.2-5 over ssh, ``launch/local_hosts.py``, gloo on ``lo``), under the supervisor
``launch/elastic_run.py``; at a moment drawn uniformly in ``[0, --window]`` seconds after launch
it SIGKILLs one worker process: a random one of the recipe's Python processes running then
(found in ``/proc``: ``python .../elastic_train.py --out OUT``, its host from
``HOROVOD_HOSTNAME``; before any exists, the first that appears). Per try it reports

* outcome: ``survived in place`` (one attempt, the world re-formed without the dead rank),
  ``restarted`` (the supervisor ran the job again, ``restarts`` times) or ``failed``;
* the kill: planned and actual second after launch, host, the highest version any rank had
  recorded then (``versions_at_kill``; -1: before the first step);
* ``nothing_lost``: every attempt started from (the first version its ranks recorded) at
  least the highest version any rank of an earlier attempt recorded (``OUT/progress``: each
  rank appends the version it reaches, before saving it), and the run ended at ``--steps``;
* ``identical_parameters``: the final attempt's ranks hold the same parameter digest;
* attempts' exit statuses, wall seconds, leftover worker processes after the job (killed).

``--wait-while PATTERN`` waits before each try while ``pgrep -f PATTERN`` finds a process (a
shared machine: one multi-rank job at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "launch"))
from local_hosts import LocalHosts  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from elastic_common import highest, progress, workers  # noqa: E402

ELASTIC = ROOT / "launch" / "elastic_train.py"
SUPERVISOR = ROOT / "launch" / "elastic_run.py"


def killer(out: Path, at: float, t0: float, rng: random.Random, done: threading.Event,
           rec: dict) -> None:
    while not done.is_set() and time.time() < t0 + at:
        time.sleep(0.05)
    while not done.is_set():
        procs = workers(out)
        if procs:
            pid, host = rng.choice(sorted(procs))
            rec.update(versions_at_kill=highest(out), kill_s=time.time() - t0, host=host,
                       pid=pid, workers_then=len(procs))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                rec.clear()
                continue
            return
        time.sleep(0.1)


def others_running(pattern: str) -> bool:
    """Whether ``pgrep -f pattern`` finds a process other than this one (whose own command
    line holds the pattern)."""
    got = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return any(int(pid) != os.getpid() for pid in got.split())


def one_try(lh, work: Path, args, rng: random.Random, i: int) -> dict:
    _, disc = lh.discovery(work)
    out = work / "run"
    env = lh.elastic_env(args.gloo_timeout, str(ROOT))
    py = sys.executable
    cmd = [py, str(SUPERVISOR), "--out", str(out), "--restarts", str(args.restarts),
           "--backoff", str(args.backoff), "--attempt-timeout", str(args.attempt_timeout), "--",
           str(Path(py).with_name("horovodrun")), "--gloo", "-np", "4", "--min-np", "2",
           "--max-np", "4", "--host-discovery-script", str(disc), *lh.horovodrun_args(),
           py, str(ELASTIC), "--out", str(out), "--steps", str(args.steps),
           "--compute-time", str(args.compute_time), "--progress"]
    at = rng.uniform(0, args.window)
    rec: dict = {"try": i, "kill_planned_s": at}
    done = threading.Event()
    t0 = time.time()
    log = open(work / "supervisor.log", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=str(work), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    th = threading.Thread(target=killer, args=(out, at, t0, rng, done, rec), daemon=True)
    th.start()
    try:
        rc = proc.wait(args.try_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(60)
        rec["timed_out"] = True
    except BaseException:   # interrupted: the supervisor ends its attempt on SIGTERM
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        raise
    done.set()
    th.join(5)
    wall = time.time() - t0
    log.close()
    leftovers = workers(out)
    for pid, _ in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    attempts = [json.loads(x) for x in (out / "supervisor.jsonl").read_text().splitlines()] \
        if (out / "supervisor.jsonl").exists() else []
    prog = progress(out)
    last = attempts[-1]["attempt"] if attempts else 0
    rows = [r for r in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))
            if r.get("attempt") == last]
    events = [json.loads(x) for x in (out / "elastic.jsonl").read_text().splitlines()] \
        if (out / "elastic.jsonl").exists() else []
    # nothing decided lost: each attempt starts at >= the highest version recorded before it
    starts, reached, kept, before = {}, {}, True, -1
    for a in sorted(prog):
        starts[a] = min(r[0] for r in prog[a])
        reached[a] = max(max(r) for r in prog[a])
        if a > 0 and starts[a] < before:
            kept = False
        before = max(before, reached[a])
    final = sorted({r["version"] for r in rows})
    ok = rc == 0 and final == [args.steps]
    outcome = ("failed" if not ok else "restarted" if len(attempts) > 1 else
               "survived in place" if "kill_s" in rec else "no kill (the job ended first)")
    rec.update(outcome=outcome, restarts=max(0, len(attempts) - 1),
               attempts=[{"rc": a["rc"], "resumed_from": a["resumed_from"],
                          "reached": a["reached"], "seconds": round(a["end"] - a["start"], 1)}
                         for a in attempts],
               attempt_starts=starts, attempt_reached=reached,
               nothing_lost=bool(kept and ok),
               identical_parameters=len({r["digest"] for r in rows}) == 1 and bool(rows),
               final_version=final, final_n=sorted({r["n"] for r in rows}),
               world_changes=[(e["old_n"], e["new_n"], e["step"]) for e in events],
               wall_s=round(wall, 1), supervisor_rc=rc,
               leftover_workers=len(leftovers))
    if not ok:
        rec["log_tail"] = (work / "supervisor.log").read_text()[-3000:]
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tries", type=int, default=10)
    p.add_argument("--window", type=float, default=60.0,
                   help="the kill lands uniformly in [0, window] s after launch")
    p.add_argument("--steps", type=int, default=1500,
                   help="versions to train (enough that the job outlasts --window)")
    p.add_argument("--compute-time", type=float, default=0.01)
    p.add_argument("--gloo-timeout", type=int, default=10)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--backoff", type=float, default=3.0)
    p.add_argument("--attempt-timeout", type=float, default=400.0)
    p.add_argument("--try-timeout", type=float, default=1200.0)
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--wait-while", default=None,
                   help="before each try, wait while `pgrep -f PATTERN` finds a process")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)

    def stop(*_):   # SIGTERM: leave through the with-blocks (the sshd and folders go)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    rng = random.Random(args.seed)
    results = []
    t_all = time.time()

    def save():
        if args.out:
            Path(args.out).write_text(json.dumps({
                "command": "python benchmarks/elastic_startup_kills.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                "machine": f"{os.cpu_count()} cores, load average at the end "
                           f"{os.getloadavg()[0]:.1f}",
                "gloo_timeout_s": args.gloo_timeout, "steps": args.steps,
                "seconds": round(time.time() - t_all), "results": results}, indent=1) + "\n")

    with LocalHosts(count=4) as lh:
        for i in range(args.tries):
            while args.wait_while and others_running(args.wait_while):
                time.sleep(10)
            with tempfile.TemporaryDirectory(prefix="pgc-kills-") as d:
                rec = one_try(lh, Path(d), args, rng, i)
            results.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "log_tail"}), flush=True)
            save()
    print("\n| try | kill at (s) | host | versions at kill | outcome | restarts | resumed from "
          "| final version | nothing lost | identical parameters | wall (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        res = [a["resumed_from"] for a in r["attempts"][1:]]
        print(f"| {r['try']} | {r.get('kill_s', float('nan')):.1f} | {r.get('host', '-')} | "
              f"{r.get('versions_at_kill', '-')} | {r['outcome']} | {r['restarts']} | "
              f"{', '.join(map(str, res)) or '-'} | {r['final_version']} | {r['nothing_lost']} | "
              f"{r['identical_parameters']} | {r['wall_s']} |")
    save()
    return 0 if all(r["outcome"] != "failed" and r["nothing_lost"] and "kill_s" in r
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
