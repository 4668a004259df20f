"""Run an elastic job until it completes: restart it, without user action, when it dies.

    python launch/elastic_run.py --out run/ -- \\
        horovodrun --gloo -np 4 --min-np 2 --max-np 4 --host-discovery-script ./discover.sh \\
            python launch/elastic_train.py --steps 1000 --out run/

Why a supervisor: Horovod's elastic mode keeps a job alive when a rank dies only if every
survivor reaches the re-formed world's rendezvous in time. A death during the job's start-up (a
4-host start takes 35-50 s on the 2-core test machine), during a re-form, or on a loaded machine
often makes the survivors abort in C++ instead (``terminate called after throwing an instance
of 'gloo::IoException'``, rendezvous ``Wait timeout``, ``Connect timeout``), and horovodrun
exits (e.g. "failure count == 4"). That cannot be caught in Python, so it is repaired from
outside: the recipe saves every version it reaches (``OUT/checkpoints/``,
:mod:`pgc_hvd.runtime.elastic.checkpoints`) and resumes from the newest, and this script starts
the same command again until the recipe has written its done marker (``OUT/done.json``).

What it does:

* removes a stale ``OUT/done.json``, then runs the command (its own process group; the child
  gets ``PGC_ELASTIC_ATTEMPT=k``, which the recipe records);
* success = exit status 0 *and* the done marker written (an elastic horovodrun may exit 0
  with too few ranks to finish);
* otherwise, up to ``--restarts`` times: one log line naming the exit status (or the signal,
  or the timeout) and the version the next attempt resumes from (the newest checkpoint), a
  pause of ``--backoff`` seconds doubling per restart up to ``--max-backoff`` (the ports and the
  dead processes' sockets are released meanwhile), and the command again;
* ``--attempt-timeout`` ends an attempt that runs longer (a hung job: its process group is
  sent SIGTERM, then SIGKILL) and counts it as a failure;
* one JSON line per attempt to ``OUT/supervisor.jsonl`` (start, end, exit status, done, the
  versions resumed from and reached);
* its own exit status: 0 when the job completed, else the last attempt's status (1 when that
  was 0 without the marker), after a log line saying so.

Ctrl-C (SIGINT/SIGTERM to this script) ends the running attempt and stops: no restart.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pgc_hvd.runtime.elastic.checkpoints import latest_version  # noqa: E402


def log(msg: str) -> None:
    print(f"[elastic_run {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def describe(rc) -> str:
    if rc is None:
        return "timed out"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the attempt's process group, SIGKILL it after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_attempt(cmd, env, timeout):
    """Run ``cmd`` once; returns its exit status (negative: a signal), None when it timed out."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        return None
    except BaseException:      # Ctrl-C, SIGTERM: end the attempt, no restart
        stop_group(proc)
        raise


def supervise(cmd, out, restarts=5, backoff=5.0, max_backoff=60.0, attempt_timeout=None,
              sleep=time.sleep) -> int:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done, ckpts, record = out / "done.json", out / "checkpoints", out / "supervisor.jsonl"
    done.unlink(missing_ok=True)
    rc = 1
    for attempt in range(restarts + 1):
        resume = latest_version(ckpts)
        log(f"attempt {attempt}: " + (f"resuming from version {resume}" if resume is not None
                                      else "starting (no checkpoint)") + ": " + " ".join(cmd))
        env = dict(os.environ, PGC_ELASTIC_ATTEMPT=str(attempt))
        t0 = time.time()
        rc = run_attempt(cmd, env, attempt_timeout)
        ok = rc == 0 and done.exists()
        reached = latest_version(ckpts)
        with open(record, "a") as f:
            f.write(json.dumps({"attempt": attempt, "start": t0, "end": time.time(),
                                "rc": rc, "done": done.exists(), "resumed_from": resume,
                                "reached": reached}) + "\n")
        if ok:
            log(f"attempt {attempt}: completed at version {reached}"
                + (f" after {attempt} restart(s)" if attempt else ""))
            return 0
        why = describe(rc) + ("" if rc != 0 else " without the done marker")
        if attempt == restarts:
            log(f"attempt {attempt}: {why}; no restart left ({restarts} allowed): giving up, "
                f"the newest checkpoint is version {reached} in {ckpts}")
            break
        pause = min(max_backoff, backoff * 2 ** attempt)
        log(f"attempt {attempt}: {why}; restarting in {pause:.0f} s from version {reached} "
            f"(restart {attempt + 1} of {restarts})")
        sleep(pause)
    return rc if rc else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: elastic_run.py [options] -- COMMAND ...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                usage="%(prog)s [options] -- COMMAND ...")
    p.add_argument("--out", required=True,
                   help="the recipe's --out: its checkpoints/ and done.json")
    p.add_argument("--restarts", type=int, default=5, help="restarts allowed")
    p.add_argument("--backoff", type=float, default=5.0,
                   help="seconds before the first restart (doubling per restart)")
    p.add_argument("--max-backoff", type=float, default=60.0)
    p.add_argument("--attempt-timeout", type=float, default=None,
                   help="seconds after which an attempt counts as hung and is ended")
    args = p.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    if not cmd:
        p.error("no command after --")
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        return supervise(cmd, args.out, args.restarts, args.backoff, args.max_backoff,
                         args.attempt_timeout)
    except KeyboardInterrupt:
        log("interrupted: the running attempt was ended, no restart")
        return 130


if __name__ == "__main__":
    sys.exit(main())
