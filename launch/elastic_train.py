"""Elastic pgc_hvd training: ranks may die or join, training goes on (docs/elastic.md).

    horovodrun --gloo -np 4 --min-np 3 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        python launch/elastic_train.py --steps 60 --out run/

(on one machine, e.g. the loopback ssh hosts of launch/local_hosts.py, add
``--network-interface lo``: ``LocalHosts.horovodrun_args()`` does)

Kills at any moment (docs/elastic.md): every rank saves the model and the optimizer state at
every version it reaches to ``OUT/checkpoints/`` (``--checkpoint-every``; atomic files,
:mod:`pgc_hvd.runtime.elastic.checkpoints`), and a run whose ``OUT`` holds checkpoints starts
from the newest (``--no-resume``: from scratch), so a job Horovod could not keep alive (its ranks
aborted in C++) loses nothing decided when it is started again: ``launch/elastic_run.py`` does
that without user action. Rank 0 writes ``OUT/done.json`` when training is complete (the
supervisor's sign of success). ``--progress`` makes each rank append the version it starts from
and every version it reaches to ``OUT/progress/<attempt>-<host>-<pid>.txt`` (what a benchmark
checks the restarts against; ``PGC_ELASTIC_ATTEMPT`` is set by the supervisor). The
``--kill-host`` fault below fires once per ``OUT`` (a resumed run does not kill again).
Each process writes ``OUT/startup/<host>-<pid>.json`` after its first step: when it was created,
when the script began, imports done, ``hvd.init()`` entered and done, model and state built, its
first step (where start-up time goes, docs/elastic.md). ``--stop-file F``: once ``F`` holds a
version, training ends there (a benchmark that runs until it has seen enough: the writer picks a
version no rank has reached yet).

A small MLP on synthetic data (the recipe; swap in your model and data). Each rank writes
``OUT/rank-<host>-<pid>.json`` at the end: its rank and n, final version, a digest of its
parameters, the (version, time, n) of every step it took and the world changes it saw; rank 0
appends the world changes to ``OUT/elastic.jsonl``.

Fault injection for tests and benchmarks: ``--kill-host H --kill-at V`` makes the rank on host H
(``HOROVOD_HOSTNAME``) kill itself with SIGKILL once its model version reaches V in a world of
``--kill-n`` ranks, after writing the time to ``OUT/kill.json``; each rank writes
``OUT/started-<host>.json`` (its pid, the time) after its first step, for a killer outside the job
(benchmarks/elastic/elastic_random_kills.py). ``--compute-time S`` sleeps S seconds per partition
evaluated (emulated compute: stable step times on a shared machine). ``--no-cascade`` turns off
the fast leaving of a broken world (``ElasticState(cascade=False)``: a death then costs up to
``HOROVOD_GLOO_TIMEOUT_SECONDS``). ``--slow-host H --slow S``: the rank on host H sleeps S
seconds a step in every world (a persistent straggler); with ``--stragglers auto`` each world's
optimizer has a fresh rule for its n, and each rank's results list the s in force whenever it
changed (``s_seen``: [world, version, s]).
"""

from __future__ import annotations

import time

T_SCRIPT = time.time()   # the script began (its imports follow): start-up timeline

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd
from pgc_hvd.runtime import PartitionLoader
from pgc_hvd.options import parse_options
from pgc_hvd.runtime.consistency import tensors_digest
from pgc_hvd.runtime.elastic import ElasticCheckpoints, ElasticState, response_cache_off

T_IMPORTED = time.time()


def process_started_at() -> float:
    """When this process was created: now minus its age (``/proc/self/stat`` start time
    against ``/proc/uptime``, both since boot, to 10 ms; the boot time of ``/proc/stat`` is
    a whole second, too coarse); nan without /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return float("nan")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="model versions to train")
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--stragglers", default="1",
                   help="straggler budget s of every world (capped at n - 1), or 'auto': chosen "
                        "from the delays, a fresh rule for each world's n (docs/control.md)")
    p.add_argument("--auto-options", dest="auto", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="options of --stragglers auto (AutoConfig's fields, comma-separated)")
    p.add_argument("--slow-host", default=None,
                   help="the rank on this host (HOROVOD_HOSTNAME) sleeps --slow seconds a step, "
                        "in every world: a persistent straggler that follows the host")
    p.add_argument("--slow", type=float, default=0.05)
    p.add_argument("--out", required=True, help="folder for the per-rank results")
    p.add_argument("--check-every", type=int, default=10,
                   help="versions between the joint checks for added hosts")
    p.add_argument("--compute-time", type=float, default=0.0,
                   help="emulated compute seconds per partition evaluated")
    p.add_argument("--timeout", type=float, default=60.0, help="pgc_hvd collective timeout")
    p.add_argument("--checkpoint-every", type=int, default=1,
                   help="versions between the checkpoints every rank writes to OUT/checkpoints "
                        "(0: none)")
    p.add_argument("--checkpoint-fsync", action="store_true",
                   help="fsync each checkpoint (survives the machine's crash, not only kills)")
    p.add_argument("--no-resume", action="store_true",
                   help="start from scratch even when OUT/checkpoints holds a checkpoint")
    p.add_argument("--progress", action="store_true",
                   help="append every version reached to OUT/progress/<attempt>-<host>-<pid>.txt")
    p.add_argument("--kill-host", default=None)
    p.add_argument("--kill-at", type=int, default=20)
    p.add_argument("--kill-n", type=int, default=4)
    p.add_argument("--add-host", default=None,
                   help="HOST:SLOTS that rank 0 appends to --hosts-file at version --add-at "
                        "(the discovery script lists that file): a rank joins")
    p.add_argument("--add-at", type=int, default=20)
    p.add_argument("--hosts-file", default=None)
    p.add_argument("--until-n", type=int, default=0,
                   help="keep training past --steps (up to --max-steps) until the world has this "
                        "many ranks, then 30 versions more (a test of a join that must not end "
                        "before the join)")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--stop-file", default=None,
                   help="a file that may come to hold a model version: training then ends at "
                        "that version (if below --steps); whoever writes it must choose a "
                        "version no rank has reached yet (benchmarks/elastic/elastic_soak.py)")
    p.add_argument("--no-cascade", action="store_true",
                   help="ElasticState(cascade=False): survivors wait for the gloo timeout")
    return p


def parse(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.auto = parse_options(args.auto, "--auto-options") if args.auto else None
        if args.stragglers != "auto":
            args.stragglers = int(args.stragglers)
    except ValueError as err:
        p.error(f"--stragglers {args.stragglers} / --auto-options: {err} (an int s, or "
                f"'auto' with --auto-options KEY=VALUE options)")
    if args.auto is not None and args.stragglers != "auto":
        p.error("--auto-options sets options of --stragglers auto: it needs --stragglers auto")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    # Horovod's response cache off unless HOROVOD_CACHE_CAPACITY is set (docs/elastic.md,
    # "Killing rank 0"), before hvd.init(), where every rank (a warm worker too, after it took
    # the client's environment) runs it
    response_cache_off()
    t_init0 = time.time()
    hvd.init()
    t_init = time.time()
    os.makedirs(args.out, exist_ok=True)
    host = os.environ.get("HOROVOD_HOSTNAME", "localhost")

    g = torch.Generator().manual_seed(11)
    X = torch.randn(2400, 16, generator=g)
    y = ((X[:, 0] + X[:, 1] * X[:, 2]) > 0).long()
    torch.manual_seed(1000 + hvd.rank())   # different on purpose: sync broadcasts rank 0's
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def make_optimizer(base_opt):
        n = hvd.size()
        s = "auto" if args.stragglers == "auto" else min(args.stragglers, n - 1)
        return pgc_hvd.DistributedOptimizer(
            base_opt, named_parameters=model.named_parameters(), scheme=args.scheme,
            stragglers=s, auto=args.auto, timeout=args.timeout)

    state = ElasticState(model, base, make_optimizer,
                         make_loader=lambda n: PartitionLoader(X, y, n=n, batch_size=16, seed=5),
                         events=os.path.join(args.out, "elastic.jsonl"),
                         check_every=args.check_every, cascade=not args.no_cascade)

    attempt = int(os.environ.get("PGC_ELASTIC_ATTEMPT", "0"))
    ckpt = None
    if args.checkpoint_every > 0:
        ckpt = ElasticCheckpoints(os.path.join(args.out, "checkpoints"),
                                  tag=f"{host}.{hvd.local_rank()}", every=args.checkpoint_every,
                                  fsync=args.checkpoint_fsync)
    resumed = None
    if ckpt is not None and not args.no_resume:
        resumed = ckpt.resume(state)
        if resumed is not None:
            print(f"ELASTIC resume rank={hvd.rank()} from version {resumed} "
                  f"({ckpt.folder}) attempt={attempt}", flush=True)
    progress = None
    if args.progress:
        os.makedirs(os.path.join(args.out, "progress"), exist_ok=True)
        progress = open(os.path.join(args.out, "progress",
                                     f"{attempt}-{host}-{os.getpid()}.txt"), "a")

    recorded = [None]   # the last version written to the progress file
    s_seen = []         # --stragglers auto: [world, version, s] whenever the s in force changed

    def checkpoint(force=False):
        """The version this rank reached: recorded (``--progress``), then saved."""
        if progress is not None and state.opt is not None and \
                int(state.opt.version) != recorded[0]:
            recorded[0] = int(state.opt.version)
            progress.write(f"{recorded[0]} {time.time():.3f} {hvd.size()}\n")
            progress.flush()
        if ckpt is not None:
            ckpt.save(state, force=force)

    start = {}   # what the first world starts from (a resumed checkpoint's version and model)
    stop_at = [None]   # the version read from --stop-file

    def stop_version() -> float:
        """The --stop-file's version once written; until then no bound (the loop's own goal,
        --steps or --until-n, holds)."""
        if stop_at[0] is None and args.stop_file and os.path.exists(args.stop_file):
            try:
                stop_at[0] = int(open(args.stop_file).read().split()[0])
            except (OSError, ValueError, IndexError):   # being written: read it next step
                pass
        return float("inf") if stop_at[0] is None else stop_at[0]

    def write_startup(t_first_step: float) -> None:
        """``OUT/startup/<host>-<pid>.json``: where this process's start-up went (seconds
        since the epoch: process created, script began, imports done, hvd.init entered and
        done, model and state built, first step done)."""
        os.makedirs(os.path.join(args.out, "startup"), exist_ok=True)
        path = os.path.join(args.out, "startup", f"{host}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:   # renamed: a reader never sees half a file
            json.dump({"host": host, "pid": os.getpid(), "process_started": process_started_at(),
                       "script": T_SCRIPT, "imported": T_IMPORTED, "init_entered": t_init0,
                       "init_done": t_init, "built": t_built, "first_step": t_first_step,
                       "first_step_version": int(state.opt.version), "n": hvd.size(),
                       "warm": os.environ.get("PGC_WARM_WORKER") is not None}, f)
        os.replace(path + ".tmp", path)

    @hvd.elastic.run
    def train(state):
        if not start:
            start.update(version=int(state.opt.version),
                         digest=tensors_digest(model.parameters()))
        checkpoint(force=True)   # the first version of this world
        goal = args.steps
        if args.until_n:   # the world this run waits for: 30 more versions in it
            goal = (max(args.steps, state.opt.version + 30) if hvd.size() >= args.until_n
                    else args.max_steps)
        while state.opt.version < min(goal, stop_version()):
            checkpoint()
            loss = None
            for xb, yb in state.batches():
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                if args.compute_time > 0:
                    time.sleep(args.compute_time)
            if args.slow_host == host:
                time.sleep(args.slow)
            state.step(loss=None if loss is None else loss.item())
            rule = state.opt.auto_stragglers
            if rule is not None and (not s_seen or s_seen[-1][0] != state.worlds
                                     or s_seen[-1][2] != rule.s):
                s_seen.append([state.worlds, int(state.opt.version), int(rule.s)])
            if len(state.step_times) == 1:
                write_startup(state.step_times[0][1])
            if state.worlds == 1 and len(state.step_times) == 1:   # for a killer outside
                with open(os.path.join(args.out, f"started-{host}.json"), "w") as f:
                    json.dump({"host": host, "pid": os.getpid(), "time": time.time(),
                               "rank": hvd.rank()}, f)
            if (args.kill_host == host and hvd.size() == args.kill_n
                    and state.opt.version >= args.kill_at
                    and not os.path.exists(os.path.join(args.out, "kill.json"))):
                with open(os.path.join(args.out, "kill.json"), "w") as f:
                    json.dump({"host": host, "version": state.opt.version, "time": time.time(),
                               "pid": os.getpid()}, f)
                os.kill(os.getpid(), signal.SIGKILL)
            if (args.add_host and hvd.rank() == 0 and state.opt.version >= args.add_at
                    and not os.path.exists(os.path.join(args.out, "add.json"))):
                with open(args.hosts_file, "a") as f:
                    f.write(args.add_host + "\n")
                with open(os.path.join(args.out, "add.json"), "w") as f:
                    json.dump({"host": args.add_host, "version": state.opt.version,
                               "time": time.time()}, f)
        state.close()
        checkpoint(force=True)

    t0 = t_built = time.time()
    train(state)
    if progress is not None:
        progress.close()
    res = {"rank": hvd.rank(), "n": hvd.size(), "host": host, "pid": os.getpid(),
           "version": int(state.opt.version), "digest": tensors_digest(model.parameters()),
           "worlds": state.worlds, "seconds": time.time() - t0, "changes": state.changes,
           "step_times": state.step_times, "attempt": attempt, "resumed_from": resumed,
           "start": start, "s_seen": s_seen,
           "checkpoint_writes": ckpt.writes if ckpt else 0,
           "checkpoint_s": ckpt.seconds if ckpt else 0.0}
    with open(os.path.join(args.out, f"rank-{host}-{os.getpid()}.json"), "w") as f:
        json.dump(res, f)
    if hvd.rank() == 0:   # the supervisor's sign that the job is complete
        with open(os.path.join(args.out, "done.json"), "w") as f:
            json.dump({"version": res["version"], "time": time.time(), "attempt": attempt}, f)
    print(f"ELASTIC done rank={hvd.rank()} n={hvd.size()} version={res['version']} "
          f"digest={res['digest']} worlds={state.worlds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
