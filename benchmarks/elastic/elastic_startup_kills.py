"""Kills at random moments in the first minute of a 4-host elastic job.

    .venv/bin/python benchmarks/elastic/elastic_startup_kills.py --tries 10 \\
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

``--phase`` places the kill elsewhere ("during a re-form, during a join's broadcast"):

* ``reform``: a first kill at a moment drawn in ``[1, --window]`` s after the job's first step,
  a second kill of another rank ``U(0, --second-within)`` s later, while the survivors leave
  the broken world and re-form (``second_during_reform``: it landed before the first step of
  any world after the first kill, from the ranks' progress files);
* ``join``: the job starts on 3 of the 4 hosts; ``U(1, --window)`` s after its first step the
  fourth is added to the discovery listing; once the new rank's process is running, a random
  rank (the new one or a survivor) is killed ``U(0, --join-kill-within)`` s later, while the
  world of 4 forms and the new rank gets the model (``during_join``: before the first step of a
  world of 4).

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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))
from local_hosts import LocalHosts  # noqa: E402

from elastic_common import (attempts_resumed, events, final_ranks, highest,  # noqa: E402
                            kill_random, progress_rows, workers)

ELASTIC = ROOT / "launch" / "elastic_train.py"
SUPERVISOR = ROOT / "launch" / "elastic_run.py"


def killer(out: Path, at: float, t0: float, rng: random.Random, done: threading.Event,
           rec: dict) -> None:
    while not done.is_set() and time.time() < t0 + at:
        time.sleep(0.05)
    while not done.is_set():
        got = kill_random(out, rng)
        if got is not None:
            rec.update(versions_at_kill=got["version"], kill_s=got["t"] - t0, host=got["host"],
                       pid=got["pid"], workers_then=got["workers_then"])
            return
        time.sleep(0.1)


def timeline(out: Path) -> list[tuple[int, int, float, int]]:
    """``(attempt, version, time, n)`` of every line of the ranks' progress files."""
    return [(int(name.split("-", 1)[0]), *row)
            for name, rows in progress_rows(out).items() for row in rows]


def phase_killer(out: Path, listing: Path, newcomer: str, args, t0: float,
                 rng: random.Random, done: threading.Event, rec: dict) -> None:
    """The kills of ``--phase reform`` and ``--phase join`` (module doc); what it did goes
    into ``rec`` (times in seconds after launch)."""
    def wait_until(pred) -> bool:
        while not done.is_set():
            if pred():
                return True
            time.sleep(0.02)
        return False

    def kill_one(key: str, exclude=()) -> bool:
        while not done.is_set():
            got = kill_random(out, rng, exclude)
            if got is not None:
                rec[key] = {"s": got["t"] - t0, "host": got["host"], "pid": got["pid"],
                            "version": got["version"], "workers_then": got["workers_then"]}
                return True
            time.sleep(0.05)
        return False

    if not wait_until(lambda: highest(out) >= 0):
        return
    rec["first_step_s"] = time.time() - t0
    at = time.time() + rng.uniform(1.0, args.window)
    if not wait_until(lambda: time.time() >= at):
        return
    if args.phase == "reform":
        if not kill_one("kill"):
            return
        at = time.time() + rng.uniform(0.0, args.second_within)
        if wait_until(lambda: time.time() >= at):
            kill_one("second_kill", exclude=(rec["kill"]["pid"],))
        return
    with open(listing, "a") as f:
        f.write(f"{newcomer}:1\n")
    rec["host_added_s"] = time.time() - t0
    if not wait_until(lambda: any(h == newcomer for _, h in workers(out))):
        return
    rec["newcomer_started_s"] = time.time() - t0
    at = time.time() + rng.uniform(0.0, args.join_kill_within)
    if wait_until(lambda: time.time() >= at):
        kill_one("kill")


def where_it_landed(out: Path, rec: dict, t0: float) -> None:
    """``second_during_reform`` / ``during_join`` (module doc), from the progress files."""
    rows = [r for r in timeline(out) if r[0] == 0]
    if "second_kill" in rec:
        t1 = t0 + rec["kill"]["s"]
        after = [t for _, _, t, n in rows if t > t1 and n < 4]
        rec["first_step_after_first_kill_s"] = (min(after) - t0) if after else None
        rec["second_during_reform"] = not after or t0 + rec["second_kill"]["s"] < min(after)
    if rec.get("phase") == "join" and "kill" in rec:
        t4 = [t for _, _, t, n in rows if n == 4]
        rec["first_step_of_4_s"] = (min(t4) - t0) if t4 else None
        rec["during_join"] = not t4 or t0 + rec["kill"]["s"] < min(t4)
        rec["killed_newcomer"] = rec["kill"]["host"] == rec.get("newcomer")


def others_running(pattern: str) -> bool:
    """Whether ``pgrep -f pattern`` finds a process other than this one (whose own command
    line holds the pattern)."""
    got = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return any(int(pid) != os.getpid() for pid in got.split())


def one_try(lh, work: Path, args, rng: random.Random, i: int) -> dict:
    joining = args.phase == "join"
    listing, disc = lh.discovery(work, hosts=lh.hosts[:3] if joining else None)
    out = work / "run"
    env = lh.elastic_env(args.gloo_timeout, str(ROOT))
    py = sys.executable
    cmd = [py, str(SUPERVISOR), "--out", str(out), "--restarts", str(args.restarts),
           "--backoff", str(args.backoff), "--attempt-timeout", str(args.attempt_timeout), "--",
           str(Path(py).with_name("horovodrun")), "--gloo", "-np", "3" if joining else "4",
           "--min-np", "2",
           "--max-np", "4", "--host-discovery-script", str(disc), *lh.horovodrun_args(),
           py, str(ELASTIC), "--out", str(out), "--steps", str(args.steps),
           "--compute-time", str(args.compute_time), "--progress"]
    at = rng.uniform(0, args.window)
    rec: dict = {"try": i, "phase": args.phase}
    if args.phase == "startup":
        rec["kill_planned_s"] = at
    if joining:
        rec["newcomer"] = lh.hosts[3]
    done = threading.Event()
    t0 = time.time()
    log = open(work / "supervisor.log", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=str(work), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    th = threading.Thread(target=killer, args=(out, at, t0, rng, done, rec), daemon=True) \
        if args.phase == "startup" else \
        threading.Thread(target=phase_killer, daemon=True,
                         args=(out, listing, lh.hosts[3], args, t0, rng, done, rec))
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
    rows, attempts = final_ranks(out)
    # nothing decided lost: each attempt starts at >= the highest version recorded before it
    starts, reached, late = attempts_resumed(out)
    final = sorted({r["version"] for r in rows})
    ok = rc == 0 and final == [args.steps]
    killed = "kill_s" in rec or "kill" in rec
    outcome = ("failed" if not ok else "restarted" if len(attempts) > 1 else
               "survived in place" if killed else "no kill (the job ended first)")
    where_it_landed(out, rec, t0)
    rec.update(outcome=outcome, restarts=max(0, len(attempts) - 1),
               attempts=[{"rc": a["rc"], "resumed_from": a["resumed_from"],
                          "reached": a["reached"], "seconds": round(a["end"] - a["start"], 1)}
                         for a in attempts],
               attempt_starts=starts, attempt_reached=reached,
               nothing_lost=bool(not late and ok),
               identical_parameters=len({r["digest"] for r in rows}) == 1 and bool(rows),
               final_version=final, final_n=sorted({r["n"] for r in rows}),
               world_changes=[(e["old_n"], e["new_n"], e["step"]) for e in events(out)],
               wall_s=round(wall, 1), supervisor_rc=rc,
               leftover_workers=len(leftovers))
    if not ok or args.logs:
        log = (work / "supervisor.log").read_text()
        rec["log_tail"] = log if args.logs else log[-3000:]
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tries", type=int, default=10)
    p.add_argument("--phase", choices=["startup", "reform", "join"], default="startup",
                   help="where the kill lands (module doc)")
    p.add_argument("--window", type=float, default=60.0,
                   help="startup: the kill lands uniformly in [0, window] s after launch; "
                        "reform/join: the first kill / the host's addition in [1, window] s "
                        "after the first step")
    p.add_argument("--second-within", type=float, default=1.5,
                   help="reform: the second kill U(0, this) s after the first")
    p.add_argument("--join-kill-within", type=float, default=8.0,
                   help="join: the kill U(0, this) s after the new rank's process started")
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
    p.add_argument("--logs", action="store_true",
                   help="keep every try's whole supervisor log in the JSON (log_tail)")
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
                "command": "python benchmarks/elastic/elastic_startup_kills.py "
                           + " ".join(argv if argv is not None else sys.argv[1:]),
                "machine": f"{os.cpu_count()} cores, load average at the end "
                           f"{os.getloadavg()[0]:.1f}",
                "gloo_timeout_s": args.gloo_timeout, "steps": args.steps,
                "seconds": round(time.time() - t_all), "results": results}, indent=1) + "\n")

    if args.phase != "startup" and args.window < 1:
        p.error("--window must be >= 1 s for --phase reform/join")
    with LocalHosts(count=4) as lh:
        for i in range(args.tries):
            while args.wait_while and others_running(args.wait_while):
                time.sleep(10)
            with tempfile.TemporaryDirectory(prefix="pgc-kills-") as d:
                rec = one_try(lh, Path(d), args, rng, i)
            results.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "log_tail"}), flush=True)
            save()
    print(table(results))
    save()
    return 0 if all(r["outcome"] != "failed" and r["nothing_lost"] and
                    ("kill_s" in r or "kill" in r) for r in results) else 1


def table(results: list) -> str:
    """The markdown table of the tries (one column set per phase)."""
    def f(x):
        return "-" if x is None else f"{x:.1f}"

    rows = []
    for r in results:
        res = ", ".join(str(a["resumed_from"]) for a in r["attempts"][1:]) or "-"
        tail = [r["outcome"], r["restarts"], res, r["final_version"], r["nothing_lost"],
                r["identical_parameters"], r["wall_s"]]
        k, k2 = r.get("kill", {}), r.get("second_kill", {})
        if r["phase"] == "startup":
            head = [f(r.get("kill_s")), r.get("host", "-"), r.get("versions_at_kill", "-")]
        elif r["phase"] == "reform":
            head = [f(k.get("s")), k.get("version", "-"), f(k2.get("s")),
                    f(r.get("first_step_after_first_kill_s")), r.get("second_during_reform")]
        else:
            head = [f(r.get("host_added_s")), f(r.get("newcomer_started_s")), f(k.get("s")),
                    "new rank" if r.get("killed_newcomer") else k.get("host", "-"),
                    f(r.get("first_step_of_4_s")), r.get("during_join")]
        rows.append("| " + " | ".join(map(str, [r["try"], *head, *tail])) + " |")
    phase = results[0]["phase"] if results else "startup"
    cols = {"startup": ["kill at (s)", "host", "versions at kill"],
            "reform": ["first kill (s)", "at version", "second kill (s)",
                       "first step after (s)", "second kill during the re-form"],
            "join": ["host added (s)", "new rank's process (s)", "kill (s)", "killed",
                     "first step of the world of 4 (s)", "during the join"]}[phase]
    cols = ["try", *cols, "outcome", "restarts", "resumed from", "final version",
            "nothing lost", "identical parameters", "wall (s)"]
    return "\n".join(["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols), *rows])


if __name__ == "__main__":
    sys.exit(main())
