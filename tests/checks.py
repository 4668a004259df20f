"""What the multi-rank check scripts share: the line that says a check passed on a rank.

A script run by the ``horovodrun`` / ``torchrun`` fixtures (tests/conftest.py puts this folder on
the ranks' PYTHONPATH; pytest has it on ``sys.path`` for the scripts it runs in its own process)
prints ``CHECK <name> ok rank=<r>`` through :func:`ok` after each check, and its test counts those
lines per rank::

    from checks import ok
    ...
    ok("resume_is_exact")                # CHECK resume_is_exact ok rank=1

May import: the standard library; the collective module the script already initialised
(``horovod.torch`` or ``pgc_hvd.torch``), only to ask its rank.
"""

from __future__ import annotations

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
