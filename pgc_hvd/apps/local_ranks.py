"""A script on local ranks, and the one line of figures its rank 0 prints: the launcher and the
``RESULT`` line that the benchmarks (``benchmarks/``) share, and the tests of that launcher.

A benchmark's worker prints its figures on rank 0 as one line, ``RESULT <json>``
(:func:`print_result`); whoever started it reads them back with :func:`read_result`.
:func:`run_ranks` starts ``horovodrun --gloo -np N -H localhost:N --network-interface lo
python SCRIPT --worker ARGS`` (gloo kept on the loopback interface) and returns rank 0's figures;
:func:`torchrun_command` is the same launch under ``torchrun --standalone`` (the torch engine).
The ranks import the same ``pgc_hvd`` as the caller (its folder first on their PYTHONPATH).

May import: the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

#: the first word of the line that holds a worker's figures
RESULT = "RESULT "

#: the folder that holds the ``pgc_hvd`` package the caller imported (the repository root of a
#: source checkout or an editable install)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def print_result(figures: dict) -> None:
    """Print ``RESULT <json of figures>`` (on rank 0 of a benchmark's worker), flushed."""
    print(RESULT + json.dumps(figures), flush=True)


def read_result(text: str) -> Optional[dict]:
    """The figures of the first ``RESULT`` line of ``text`` (a run's output; a launcher's prefix
    such as ``[0]<stdout>:`` before the word is allowed), or None when there is none."""
    for line in text.splitlines():
        if RESULT in line:
            return json.loads(line.split(RESULT, 1)[1])
    return None


def ranks_environment(extra: Optional[dict] = None) -> dict:
    """This process's environment for local ranks: one OpenMP thread per rank, the caller's
    ``pgc_hvd`` first on PYTHONPATH, then ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


def horovodrun_command(np_: int, script: str, args: list) -> list:
    """``horovodrun --gloo -np np_ -H localhost:np_ --network-interface lo python script
    *args`` with this Python and the ``horovodrun`` beside it."""
    exe = Path(sys.executable).with_name("horovodrun")
    return [str(exe), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", "--network-interface",
            "lo", sys.executable, str(Path(script).resolve()), *map(str, args)]


def torchrun_command(np_: int, args: list) -> list:
    """``torchrun --standalone --nproc-per-node np_ *args`` with this Python (``args``: a
    script and its arguments, or ``-m MODULE ...``); pin gloo with ``GLOO_SOCKET_IFNAME=lo``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={np_}", *map(str, args)]


def run_ranks(np_: int, script: str, worker_args: list, timeout: float,
              on_line: Optional[Callable[[str], None]] = None) -> dict:
    """``python script --worker *worker_args`` on ``np_`` local Horovod ranks
    (:func:`horovodrun_command`); rank 0's figures (:func:`read_result`). Exits with both output
    streams when the job fails or prints no figures. ``on_line`` sees every line of the output
    (stderr's first)."""
    cmd = horovodrun_command(np_, script, ["--worker", *worker_args])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=ranks_environment())
    if on_line is not None:
        for line in proc.stderr.splitlines() + proc.stdout.splitlines():
            on_line(line)
    figures = read_result(proc.stdout)
    if proc.returncode != 0 or figures is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return figures
