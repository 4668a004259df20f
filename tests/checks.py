"""The lines multi-rank check scripts print and their tests read: written here, read here.

A script run by the ``horovodrun`` / ``torchrun`` fixtures (the ``scripts/`` folder beside each
part's tests; tests/conftest.py puts this folder on the ranks' PYTHONPATH, and pytest has it on
``sys.path`` for the tests) prints ``CHECK <name> ok rank=<r>`` through :func:`ok` after each
check, and its test reads those lines back with :func:`passed` (or :func:`passed_everywhere`),
and the ``ALL OK rank=<r>`` lines of a script that got to its end with :func:`all_ok`::

    from checks import ok                           # in the script
    ok("resume_is_exact")                           # CHECK resume_is_exact ok rank=1

    from checks import passed_everywhere            # in its test
    assert "resume_is_exact" in passed_everywhere(proc.stdout, 2)

:func:`on_loopback` reads the ``LOOPBACK`` lines of tests/multirank/scripts/loopback_checks.py.
:func:`params_digest` and :func:`same_on_every_rank` end a torchrun script the DDP way: a digest
of the parameters, compared across the ranks on torch's default process group.

May import: the standard library; the collective module the script already initialised
(``horovod.torch`` or ``pgc_hvd.torch``), only to ask its rank; torch (in the two functions
that need it).
"""

from __future__ import annotations

import re
import sys

ENGINES = ("horovod.torch", "pgc_hvd.torch")


def current_rank() -> int:
    """This process's rank, from the initialised engine module (``horovod.torch`` or
    ``pgc_hvd.torch``) the script imported."""
    for name in ENGINES:
        hvd = sys.modules.get(name)
        if hvd is not None and hvd.is_initialized():
            return int(hvd.rank())
    raise RuntimeError("checks.ok(name) without rank= needs an initialised horovod.torch or "
                       "pgc_hvd.torch (call hvd.init() first), or pass rank=")


def ok(name: str, rank: int | None = None) -> None:
    """Print ``CHECK <name> ok rank=<r>`` (``rank`` defaults to :func:`current_rank`)."""
    print(f"CHECK {name} ok rank={current_rank() if rank is None else rank}", flush=True)


#: one passed check as a rank prints it (a launcher may put a prefix such as ``[1]<stdout>:``
#: before it)
CHECK_LINE = re.compile(r"CHECK (\S+) ok rank=(\d+)")


def passed(out: str) -> dict[str, list[int]]:
    """``{check name: the ranks that printed it passed}`` in ``out`` (a launch's stdout): one
    entry per ``CHECK`` line, so a check a rank passes twice lists that rank twice; sorted."""
    found: dict[str, list[int]] = {}
    for m in CHECK_LINE.finditer(out):
        found.setdefault(m.group(1), []).append(int(m.group(2)))
    return {name: sorted(ranks) for name, ranks in found.items()}


def passed_everywhere(out: str, n: int) -> set[str]:
    """The checks that each of the ranks 0 .. n - 1 (and no other) printed passed."""
    return {name for name, ranks in passed(out).items() if set(ranks) == set(range(n))}


def all_ok(out: str) -> int:
    """How many ``ALL OK rank=<r>`` lines ``out`` holds (one per rank that got to the end)."""
    return len(re.findall(r"ALL OK rank=\d+", out))


def on_loopback(out: str, n: int, pinned: str) -> None:
    """Every one of the ``n`` ranks printed its ``LOOPBACK`` line (tests/multirank/scripts/
    loopback_checks.py), with no connection outside loopback, under the pin ``pinned``."""
    rows = re.findall(r"LOOPBACK rank=(\d+) n=(\d+) established=(\d+) pinned=(\S+) outside=(\S+)",
                      out)
    assert sorted(int(r[0]) for r in rows) == list(range(n)), out
    for rank, _, established, pin, outside in rows:
        assert int(established) >= 1, f"rank {rank} saw no connection at all: {out}"
        assert outside == "-", f"rank {rank} talked outside loopback: {outside}"
        assert pin == pinned, f"rank {rank}: gloo pinned to {pin!r}, not {pinned!r}"


def params_digest(module) -> str:
    """A short digest of ``module``'s parameters (fp32 bytes, in order)."""
    import hashlib
    h = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes()
                                for p in module.parameters()))
    return h.hexdigest()[:16]


def same_on_every_rank(value, what: str):
    """``value`` (picklable), which must be the same on every rank of torch's default process
    group (one ``all_gather_object``); else SystemExit naming ``what`` and every rank's."""
    import torch.distributed as dist
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    if len(set(got)) != 1:
        raise SystemExit(f"{what} differs across ranks: {got}")
    return got[0]
