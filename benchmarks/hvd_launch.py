"""Run a benchmark script's worker mode on local gloo ranks and read back rank 0's result.

The worker prints one line ``RESULT <json>`` on rank 0; :func:`run_ranks` returns that object,
or exits with both output streams when the job fails or prints no result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent


def run_ranks(np_: int, script: str, worker_args: list, timeout: float,
              on_line: Optional[Callable[[str], None]] = None) -> dict:
    """``horovodrun --gloo -np np_ -H localhost:np_ --network-interface lo python script --worker
    *worker_args``; rank 0's RESULT. gloo stays on the loopback interface."""
    exe = Path(sys.executable).with_name("horovodrun")
    cmd = [str(exe), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", "--network-interface",
           "lo", sys.executable, str(Path(script).resolve()), "--worker", *map(str, worker_args)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if on_line is not None:
        for line in proc.stderr.splitlines() + proc.stdout.splitlines():
            on_line(line)
    res = [l.split("RESULT ", 1)[1] for l in proc.stdout.splitlines() if "RESULT " in l]
    if proc.returncode != 0 or not res:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(res[0])
