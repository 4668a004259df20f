"""What the elastic benchmarks share: finding the recipe's worker processes and killing one,
and reading what its ranks and the supervisor recorded (benchmarks/elastic/elastic_startup_kills.py,
benchmarks/elastic/elastic_soak.py).

A worker is a process running ``launch/elastic_train.py --out OUT``: either a cold one (its
``/proc/<pid>/cmdline`` is ``python .../elastic_train.py ... OUT ...``, its host the
``HOROVOD_HOSTNAME`` of its environment) or the child a warm-worker server forked for one
(``launch/warm_worker.py``: the child's command line is the server's, so the child is found as
the child of a server whose ``serve`` command names its host, and that ran the recipe: it
registered itself in ``<server folder>/children/<pid>`` with the script's arguments).

Also the ``--env KEY=VALUE`` option of the benchmarks that launch the recipe
(:func:`add_env_option`, :func:`env_option`: benchmarks/elastic/elastic_random_kills.py,
benchmarks/elastic/elastic_cache_overhead.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Callable, Optional


def _cmdline(pid: str) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def workers(out: Path) -> list[tuple[int, str]]:
    """``(pid, host)`` of the recipe's processes writing to ``out`` (module doc)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            args = _cmdline(d)
            if len(args) < 2 or not os.path.basename(args[0]).startswith("python"):
                continue
            if args[1].endswith("elastic_train.py") and str(out) in args:
                env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
                host = next((e.split(b"=", 1)[1].decode() for e in env
                             if e.startswith(b"HOROVOD_HOSTNAME=")), None)
                if host is not None:
                    found.append((int(d), host))
            elif args[1].endswith("warm_worker.py") and "serve" in args:
                found += _warm_children(int(d), args, str(out))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def _parent(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _warm_children(server: int, serve_args: list[str], out: str) -> list[tuple[int, str]]:
    """The children the warm-worker server ``server`` (``warm_worker.py serve --dir D --host
    H``) forked that run the recipe for ``out`` (registered as ``D/children/<pid>``, the
    script's argv; several servers may share ``D``: a child is its parent's)."""
    try:
        folder = Path(serve_args[serve_args.index("--dir") + 1]) / "children"
        host = serve_args[serve_args.index("--host") + 1]
    except (ValueError, IndexError):
        return []
    got = []
    for f in folder.glob("*") if folder.is_dir() else []:
        try:
            argv = f.read_text().split("\0")
        except OSError:
            continue
        if not (f.name.isdigit() and out in argv
                and any(a.endswith("elastic_train.py") for a in argv)):
            continue
        try:
            if _parent(f.name) == server:
                got.append((int(f.name), host))
        except (OSError, ValueError, IndexError):   # gone
            continue
    return got


def kill_random(out: Path, rng: random.Random, exclude=(),
                note: Optional[Callable[[], dict]] = None) -> Optional[dict]:
    """SIGKILL one of the recipe's worker processes for ``out`` (not a pid in ``exclude``),
    drawn with ``rng``; a process gone before the signal is drawn again. Returns what was
    killed, as seen just before the signal (``pid``, ``host``, ``workers_then``, ``version``:
    the highest recorded, ``t``: ``time.time()``, plus ``note()``'s entries), or None when no
    such process runs."""
    while True:
        procs = [w for w in workers(out) if w[0] not in exclude]
        if not procs:
            return None
        pid, host = rng.choice(sorted(procs))
        got = {"pid": pid, "host": host, "workers_then": len(procs), "version": highest(out),
               "t": time.time(), **(note() if note is not None else {})}
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        return got


def progress_rows(out: Path) -> dict[str, list[tuple[int, float, int]]]:
    """file name -> its ``(version, time, n)`` lines, in the order written."""
    got = {}
    for p in (out / "progress").glob("*.txt"):
        rows = []
        for line in p.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                try:
                    rows.append((int(parts[0]), float(parts[1]), int(parts[2])))
                except ValueError:   # a line being written
                    pass
        got[p.name] = rows
    return got


def progress(out: Path) -> dict[int, list[list[int]]]:
    """attempt -> the version lists of its ranks' progress files (``--progress``; a file is
    ``<attempt>-<host>-<pid>.txt``)."""
    got: dict[int, list[list[int]]] = {}
    for name, rows in progress_rows(out).items():
        if rows:
            got.setdefault(int(name.split("-", 1)[0]), []).append([v for v, _, _ in rows])
    return got


def highest(out: Path) -> int:
    """The highest version any rank recorded (-1: none yet)."""
    return max((max(r) for rows in progress(out).values() for r in rows), default=-1)


def attempts_resumed(out: Path) -> tuple[dict, dict, list[str]]:
    """Each supervisor attempt's first and highest recorded version (``starts``, ``reached``)
    and, for each attempt that started below the highest version recorded before it, a line
    saying so (nothing decided lost: the list is empty)."""
    prog = progress(out)
    starts, reached, why, before = {}, {}, [], -1
    for a in sorted(prog):
        starts[a] = min(r[0] for r in prog[a])
        reached[a] = max(max(r) for r in prog[a])
        if a > 0 and starts[a] < before:
            why.append(f"attempt {a} started at {starts[a]} < {before} recorded before it")
        before = max(before, reached[a])
    return starts, reached, why


def loads_or_none(text: str):
    """``json.loads(text)``, or None for a record still being written."""
    try:
        return json.loads(text)
    except ValueError:   # a line being appended
        return None


def events(out: Path) -> list[dict]:
    """The ranks' ``world_change`` records (``OUT/elastic.jsonl``; a line being written is
    skipped)."""
    f = out / "elastic.jsonl"
    got = [loads_or_none(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
    return [g for g in got if g is not None]


def final_ranks(out: Path) -> tuple[list[dict], list[dict]]:
    """The last attempt's rank results (``OUT/rank-*.json``) and the supervisor's attempt
    records (``OUT/supervisor.jsonl``)."""
    att = [json.loads(x) for x in (out / "supervisor.jsonl").read_text().splitlines()] \
        if (out / "supervisor.jsonl").exists() else []
    last = att[-1]["attempt"] if att else 0
    return [r for r in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))
            if r.get("attempt") == last], att


def add_env_option(p, example: str) -> None:
    """``--env KEY=VALUE``, repeatable: an environment variable for every rank (horovodrun
    passes its environment on)."""
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help=f"an environment variable for every rank (horovodrun passes its "
                        f"environment on), e.g. {example}; repeatable")


def env_option(p, pairs: list) -> dict:
    """``--env``'s pairs as a dict; the parser's error names a malformed one."""
    bad = [e for e in pairs if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        p.error(f"--env wants KEY=VALUE, got {bad[0]!r}")
    return dict(e.split("=", 1) for e in pairs)
