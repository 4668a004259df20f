"""A repeated-kill soak of an elastic pgc_hvd job.

    python benchmarks/elastic/elastic_soak.py --kills 20 --out docs/figures/elastic_soak.json

One job of ``launch/elastic_train.py`` (``--progress``, a checkpoint every version) under the
supervisor ``launch/elastic_run.py`` and ``horovodrun --gloo -np 4 --min-np 2 --max-np 4
--host-discovery-script``, each rank its own host (127.0.0.2, 127.0.0.3, ... over ssh,
``launch/local_hosts.py``, gloo on ``lo``); the discovery script prints a listing this benchmark
edits. Once all 4 ranks have taken a step (``OUT/startup/``), it repeats ``--kills`` times:

* wait a random ``--period-min``..``--period-max`` seconds (uniform, seeded ``--seed``) after
  the previous kill, then SIGKILL one random worker process from outside
  (``elastic_common.workers``), wherever it is: in a step, a re-form, a join, its start-up;
* once the survivors' new world has taken its first step (a new record in
  ``OUT/elastic.jsonl``; at most ``--reform-wait`` s), replace the dead host in the listing by
  the address that has been out of it longest, from a pool of ``--pool`` loopback hosts (the
  dead one joins the end of the queue: a node repaired and listed again), so the world returns
  to 4 at the next joint check. Horovod blacklists a host whose worker failed for the rest of
  the job unless horovodrun is given ``--blacklist-cooldown-range MIN MAX``; the soak passes
  ``--cooldown`` (default 1 10: a host may come back 2-10 s after its failure; the queue keeps
  it out for several kill periods). A pool of fresh addresses for every kill is not possible
  here: one sshd listens on at most 16 addresses (``MAX_LISTEN_SOCKS``).

The measured window runs from the moment all 4 ranks had stepped to one more random period
after the last kill; then the benchmark writes a stop version (``--stop-file``, a little ahead
of every rank) and the job ends there. Before the soak, in the same invocation, a fault-free run
of the same job (``--fault-free-steps`` versions, the same 4 hosts) gives the fault-free rate
(versions per second from the moment all 4 ranks had stepped to the end) and where a 4-host
job's start-up time goes (``OUT/startup/``: ssh and process creation, imports, ``hvd.init()``,
building the model and state, the first world's sync and first step).

Reported (printed, and as JSON with ``--out``):

* step efficiency = versions taken in the window / (window seconds x fault-free rate), and the
  seconds lost per kill that implies;
* per death: the kill to the first step of the survivors' world (``lost_s``); per join: the
  survivors' last step before the join to the first step of the world of 4 (``lost_s``), split
  into the notice (listing written -> the ranks closed at a joint check), the new process's
  start-up (closed -> process created -> imports done -> ``hvd.init()`` done -> model built),
  the sync (-> the new world's optimizer ready: waiting for the new rank, broadcast,
  construction check) and the first step; median and max of each;
* restarts by the supervisor (a Horovod abort) and every attempt's exit status;
* identical parameters: the final ranks hold the same parameter digest, at the stop version;
* nothing decided lost: each rank's recorded versions never go backwards, each attempt started
  at or above the highest version recorded before it, the run ended at the stop version.

``--warm`` runs every rank through a warm-worker server per host (``launch/warm_worker.py``;
all ``--pool`` servers are started before the fault-free run, as a replacement node would start
its own before it is listed), so a joining rank skips the interpreter's imports.
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
from elastic_common import (attempts_resumed, events, final_ranks, highest,  # noqa: E402
                            kill_random, loads_or_none, progress_rows, workers)
from local_hosts import LocalHosts  # noqa: E402

from pgc_hvd.metrics.world_changes import match, startup_split  # noqa: E402

ELASTIC = ROOT / "launch" / "elastic_train.py"
SUPERVISOR = ROOT / "launch" / "elastic_run.py"
WARM = ROOT / "launch" / "warm_worker.py"


class JobEnded(RuntimeError):
    pass


def write_listing(path: Path, hosts: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)   # the discovery script never reads half a listing


def job_command(lh, disc: Path, out: Path, args, steps: int, warm) -> list[str]:
    py = sys.executable
    script = [py, str(ELASTIC)] if warm is None else warm.command(str(ELASTIC))
    return [py, str(SUPERVISOR), "--out", str(out), "--restarts", str(args.restarts),
            "--backoff", "3", "--attempt-timeout", str(args.job_timeout), "--",
            str(Path(py).with_name("horovodrun")), "--gloo", "-np", "4", "--min-np", "2",
            "--max-np", "4", "--host-discovery-script", str(disc), *lh.horovodrun_args(),
            "--blacklist-cooldown-range", *[str(c) for c in args.cooldown],
            *script, "--out", str(out), "--steps", str(steps),
            "--compute-time", str(args.compute_time), "--progress",
            "--check-every", str(args.check_every),
            "--timeout", str(2 * args.gloo_timeout + 10), "--stop-file", str(out / "stop")]


def start_job(lh, work: Path, hosts: list[str], args, steps: int, warm):
    listing, disc = lh.discovery(work, hosts)
    out = work / "run"
    env = lh.elastic_env(args.gloo_timeout, str(ROOT))
    log = open(work / "job.log", "w")
    t0 = time.time()
    proc = subprocess.Popen(job_command(lh, disc, out, args, steps, warm), env=env,
                            cwd=str(work), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, out, listing, t0, log


def startups(out: Path) -> list[dict]:
    """The processes' start-up records (``OUT/startup/``)."""
    got = [loads_or_none(p.read_text()) for p in sorted((out / "startup").glob("*.json"))] \
        if (out / "startup").is_dir() else []
    return [g for g in got if g is not None]


def wait_until(pred, timeout: float, proc, what: str, log_path: Path):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            raise JobEnded(f"the job ended (status {proc.returncode}) while waiting for {what}:\n"
                           + log_path.read_text()[-3000:])
        if time.monotonic() > deadline:
            raise JobEnded(f"no {what} within {timeout:.0f} s:\n" + log_path.read_text()[-3000:])
        time.sleep(0.05)


def version_at(rows: dict, t: float) -> int:
    """The highest version any rank had recorded by time ``t``."""
    return max((v for r in rows.values() for v, tt, _ in r if tt <= t), default=-1)


def finish(proc, out: Path, timeout: float) -> int:
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(60)
    for pid, _ in workers(out):   # leftovers (none expected)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rc


def nothing_lost(out: Path, final_version: int) -> tuple[bool, list[str]]:
    """Module doc: versions never go backwards; attempts start at or above what was recorded."""
    why = []
    for name, rows in progress_rows(out).items():
        vs = [v for v, _, _ in rows]
        if any(b < a for a, b in zip(vs, vs[1:])):
            why.append(f"{name}: a version went backwards")
    _, reached, late = attempts_resumed(out)
    why += late
    before = max(reached.values(), default=-1)
    if before != final_version:
        why.append(f"highest version recorded {before} != the final version {final_version}")
    return not why, why


# -- the fault-free run ---------------------------------------------------------------------
def fault_free(lh, work: Path, args, warm) -> dict:
    hosts = lh.hosts[:4]
    if warm is not None:
        warm.ensure(hosts)
    proc, out, _, t_launch, log = start_job(lh, work, hosts, args, args.fault_free_steps, warm)
    rc = finish(proc, out, args.job_timeout)
    log.close()
    rows, att = final_ranks(out)
    if rc != 0 or len(att) != 1 or not rows:
        raise JobEnded(f"the fault-free run failed (status {rc}, attempts {len(att)}):\n"
                       + (work / "job.log").read_text()[-3000:])
    prog = progress_rows(out)
    st = startups(out)
    t_start = max(s["first_step"] for s in st if s["n"] == 4)
    t_end = max(t for r in prog.values() for _, t, _ in r)
    v0, v1 = version_at(prog, t_start), version_at(prog, t_end)
    return {"rate": (v1 - v0) / (t_end - t_start), "versions": v1 - v0,
            "seconds": t_end - t_start, "wall_s": time.time() - t_launch,
            "identical_parameters": len({r["digest"] for r in rows}) == 1,
            "startup": {s["host"]: startup_split(s, t_launch) for s in st},
            "all_stepped_after_s": t_start - t_launch}


# -- the soak -------------------------------------------------------------------------------
def soak(lh, work: Path, args, rng: random.Random, rate: float, warm) -> dict:
    spare = list(lh.hosts[4:])
    listed = list(lh.hosts[:4])
    if warm is not None:
        warm.ensure(listed)
    proc, out, listing, t_launch, log = start_job(lh, work, listed, args, 10 ** 9, warm)
    kills: list[dict] = []
    try:
        wait_until(lambda: len({s["host"] for s in startups(out)}) >= 4, args.job_timeout,
                   proc, "4 ranks stepping", work / "job.log")
        t_start = time.time()
        t_prev = t_start
        for k in range(args.kills):
            period = rng.uniform(args.period_min, args.period_max)
            while time.time() < t_prev + period:
                if proc.poll() is not None:
                    raise JobEnded(f"the job ended (status {proc.returncode}) during the soak:\n"
                                   + (work / "job.log").read_text()[-3000:])
                time.sleep(0.05)
            rec = {"kill": k, "period_s": round(period, 2)}
            got = wait_until(lambda: kill_random(out, rng,
                                                 note=lambda: {"seen": len(events(out))}),
                             60, proc, "a worker to kill", work / "job.log")
            host = got["host"]
            rec.update(versions_at_kill=got["version"], host=host, pid=got["pid"],
                       workers_then=got["workers_then"], t_kill=got["t"])
            t_prev = rec["t_kill"]
            print(f"kill {k}: {host} (pid {got['pid']}) at version {rec['versions_at_kill']}, "
                  f"{got['workers_then']} workers", flush=True)

            seen = got["seen"]

            def reformed():   # a new world took its first step (any reason: the victim may
                return len(events(out)) > seen   # have been a joiner still starting up)
            try:
                wait_until(reformed, args.reform_wait, proc, "the survivors' world",
                           work / "job.log")
            except JobEnded:
                if proc.poll() is not None:
                    raise
                rec["reform_wait_timed_out"] = True   # a restart under way, or a slow re-form
            if host in listed:
                listed.remove(host)
                spare.append(host)
            if len(listed) < 4 and spare:
                new = spare.pop(0)
                if warm is not None:
                    warm.ensure([new])
                listed.append(new)
                rec.update(added=new, t_add=time.time())
            write_listing(listing, listed)
            kills.append(rec)
        t_end = t_prev + rng.uniform(args.period_min, args.period_max)
        while time.time() < t_end:
            if proc.poll() is not None:
                raise JobEnded("the job ended during the soak:\n"
                               + (work / "job.log").read_text()[-3000:])
            time.sleep(0.05)
        stop = highest(out) + max(50, int(5 * rate))
        (out / "stop.tmp").write_text(f"{stop}\n")
        os.replace(out / "stop.tmp", out / "stop")
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        finish(proc, out, 60)
        raise
    rc = finish(proc, out, args.job_timeout)
    log.close()
    prog = progress_rows(out)
    v0, v1 = version_at(prog, t_start), version_at(prog, t_end)
    window = t_end - t_start
    eff = (v1 - v0) / (window * rate)
    rows, att = final_ranks(out)
    final = sorted({r["version"] for r in rows})
    kept, why = nothing_lost(out, stop)
    evs = events(out)
    sts = startups(out)
    deaths, joins = match(kills, evs, sts)
    return {
        "kills": len(kills), "window_s": window, "versions": v1 - v0,
        "step_efficiency": eff,
        "seconds_lost_per_kill": (window * rate - (v1 - v0)) / rate / max(1, len(kills)),
        "restarts": max(0, len(att) - 1),
        "attempts": [{"rc": a["rc"], "resumed_from": a["resumed_from"],
                      "reached": a["reached"]} for a in att],
        "supervisor_rc": rc, "stop_version": stop, "final_version": final,
        "final_n": sorted({r["n"] for r in rows}),
        "identical_parameters": bool(rows) and len({r["digest"] for r in rows}) == 1,
        "nothing_lost": kept and final == [stop], "lost_why": why,
        "world_changes": [(e["old_n"], e["new_n"], e["step"], e["reason"]) for e in evs],
        "deaths": deaths, "joins": joins, "kill_records": kills,
        "events": evs, "startups": sts,
        "log_tail": None if rc == 0 else (work / "job.log").read_text()[-3000:]}


def med_max(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), max(xs)) if xs else (float("nan"), float("nan"))


def summarize(ff: dict, res: dict) -> tuple[dict, dict]:
    """The summary and the join phases (median, max) of a soak; printed."""
    dl, dmax = med_max([x["lost_s"] for x in res["deaths"]])
    jl, jmax = med_max([x.get("lost_s") for x in res["joins"]])
    matched = sum(x["lost_s"] for x in res["deaths"]) + sum(x.get("lost_s") or 0.0
                                                             for x in res["joins"])
    summary = {
        "kills": res["kills"], "step_efficiency": round(res["step_efficiency"], 4),
        "fault_free_rate": round(ff["rate"], 2), "window_s": round(res["window_s"], 1),
        "versions": res["versions"],
        "seconds_lost_per_kill": round(res["seconds_lost_per_kill"], 2),
        "death_lost_median_s": round(dl, 2), "death_lost_max_s": round(dmax, 2),
        "join_lost_median_s": round(jl, 2), "join_lost_max_s": round(jmax, 2),
        "deaths_matched": len(res["deaths"]),
        "joins_done": sum(1 for j in res["joins"] if j["joined"]),
        "joins_failed": sum(1 for j in res["joins"] if not j["joined"]),
        # a cross-check that needs no fault-free rate (the machine's load moves it): the
        # seconds the matched deaths and joins cost (overlaps counted twice, restarts and
        # unmatched kills not at all), per kill and against the window
        "matched_lost_per_kill_s": round(matched / max(1, res["kills"]), 2),
        "efficiency_from_matched": round(1 - matched / res["window_s"], 4),
        "restarts": res["restarts"], "identical_parameters": res["identical_parameters"],
        "nothing_lost": res["nothing_lost"], "final_version": res["final_version"]}
    parts = ["notice_s", "reform_s", "sync_s", "first_step_s", "closed_to_process_s"]
    join_parts = {k: [round(v, 2) for v in med_max([j.get(k) for j in res["joins"]])]
                  for k in parts}
    for k in ["exec_to_script", "imports", "to_init", "hvd_init", "build",
              "sync_and_first_step"]:
        join_parts["new_rank_" + k] = [round(v, 2) for v in med_max(
            [j["new_rank"][k] for j in res["joins"] if "new_rank" in j])]
    print("\n| kills | step efficiency | versions/s fault-free | window | lost per kill "
          "(from efficiency) | death lost: median / max | join lost: median / max | restarts "
          "| identical parameters | nothing lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {summary['kills']} | **{100 * res['step_efficiency']:.1f}%** | "
          f"{ff['rate']:.1f} | {res['window_s']:.0f} s | {res['seconds_lost_per_kill']:.2f} s | "
          f"{dl:.2f} / {dmax:.2f} s | {jl:.2f} / {jmax:.2f} s | {res['restarts']} | "
          f"{res['identical_parameters']} | {res['nothing_lost']} |")
    print("\njoin, median / max (s): " + ", ".join(f"{k} {a} / {b}"
                                                  for k, (a, b) in join_parts.items()))
    print("fault-free start-up per host (s): " + json.dumps(ff["startup"]))
    return summary, join_parts


def reanalyze(path: str) -> int:
    """Match the kills to the world changes again from the records a JSON file keeps
    (``soak.events``, ``soak.startups``), rewrite its summary and print it."""
    d = json.loads(Path(path).read_text())
    res = d["soak"]
    res["deaths"], res["joins"] = match(res["kill_records"], res["events"], res["startups"])
    d["summary"], d["join_parts_median_max_s"] = summarize(d["fault_free"], res)
    Path(path).write_text(json.dumps(d, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--period-min", type=float, default=10.0)
    p.add_argument("--period-max", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--gloo-timeout", type=int, default=30,
                   help="HOROVOD_GLOO_TIMEOUT_SECONDS: it bounds a re-formed world's rendezvous, "
                        "which a join's new process must reach in time (docs/elastic.md)")
    p.add_argument("--compute-time", type=float, default=0.02)
    p.add_argument("--check-every", type=int, default=10)
    p.add_argument("--fault-free-steps", type=int, default=1500)
    p.add_argument("--reform-wait", type=float, default=20.0)
    p.add_argument("--restarts", type=int, default=5)
    p.add_argument("--job-timeout", type=float, default=3600.0)
    p.add_argument("--pool", type=int, default=8,
                   help="loopback hosts in all (4 listed at a time; 5-16)")
    p.add_argument("--cooldown", type=int, nargs=2, default=[1, 10], metavar=("MIN", "MAX"),
                   help="horovodrun --blacklist-cooldown-range: a failed host may be listed "
                        "again after this")
    p.add_argument("--warm", action="store_true",
                   help="ranks through warm-worker servers (launch/warm_worker.py)")
    p.add_argument("--out", default=None, help="JSON file for the figures")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="copy the work folders (job logs, events, progress) to DIR at the end")
    p.add_argument("--reanalyze", default=None, metavar="JSON",
                   help="only match the kills to the world changes again in a JSON file this "
                        "benchmark wrote, and rewrite its summary")
    args = p.parse_args(argv)
    if args.reanalyze:
        return reanalyze(args.reanalyze)
    if not (0 < args.period_min <= args.period_max):
        p.error(f"--period-min {args.period_min} / --period-max {args.period_max}: need "
                f"0 < min <= max")
    if args.kills < 1:
        p.error(f"--kills {args.kills}: need at least 1")
    if not 5 <= args.pool <= 16:
        p.error(f"--pool {args.pool}: need 5..16 (4 listed, one sshd serves at most 16)")

    def stop(*_):   # SIGTERM: leave through the with-blocks (the sshd and folders go)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    rng = random.Random(args.seed)
    load0 = os.getloadavg()[0]
    t_all = time.time()
    with LocalHosts(count=args.pool) as lh, tempfile.TemporaryDirectory(
            prefix="pgc-soak-") as d:
        warm = None
        if args.warm:
            sys.path.insert(0, str(ROOT / "launch"))
            from warm_worker import LocalWarmServers
            warm = LocalWarmServers(lh, Path(d) / "warm", env=lh.elastic_env(
                args.gloo_timeout, str(ROOT)))
            # every host of the pool gets its server before the job starts: a replacement
            # node starts its server (on its own CPUs) before it is listed; here all hosts
            # share 2 cores, so none is started while the job runs
            warm.ensure(lh.hosts)
        try:
            (Path(d) / "ff").mkdir()
            ff = fault_free(lh, Path(d) / "ff", args, warm)
            print(f"fault-free: {ff['rate']:.1f} versions/s ({ff['versions']} versions in "
                  f"{ff['seconds']:.1f} s; all 4 ranks stepped {ff['all_stepped_after_s']:.1f} s "
                  f"after launch)", flush=True)
            (Path(d) / "soak").mkdir()
            res = soak(lh, Path(d) / "soak", args, rng, ff["rate"], warm)
        finally:
            if warm is not None:
                warm.stop()
            if args.keep:   # the job logs, listings, events and progress files, for diagnosis
                shutil.copytree(d, args.keep, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("checkpoints", "sock-*"))
    load1 = os.getloadavg()[0]
    summary, join_parts = summarize(ff, res)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python benchmarks/elastic/elastic_soak.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores, load average {load0:.1f} at the start, "
                       f"{load1:.1f} at the end",
            "seconds": round(time.time() - t_all), "gloo_timeout_s": args.gloo_timeout,
            "warm": args.warm, "summary": summary, "join_parts_median_max_s": join_parts,
            "fault_free": ff, "soak": res}, indent=1) + "\n")
    ok = res["identical_parameters"] and res["nothing_lost"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
