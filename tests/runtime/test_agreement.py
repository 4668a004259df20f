"""runtime/agreement.py in one process: the poll and its deadline, and the collectives on a real
one-rank Horovod world (``python -c`` under no launcher, as tests/runtime/test_one_process.py);
their use across ranks is covered by the consistency, checkpoint and elastic tests under
horovodrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgc_hvd.runtime.agreement import no_answer, poll_until

REPO = Path(__file__).resolve().parents[2]

ONE_RANK = r"""
import horovod.torch as hvd, torch
from pgc_hvd.runtime import agreement as ag
from pgc_hvd.runtime.errors import AgentError
hvd.init()
assert ag.gather_rows(hvd, [3, 2 ** 62], name="t.rows", timeout=10) == [[3, 2 ** 62]]
assert ag.gather_rows(hvd, [0.5], name="t.f", timeout=None, dtype=torch.float64) == [[0.5]]
assert ag.gather_bytes(hvd, b"abc", name="t.bytes", timeout=10) == [b"abc"]
assert ag.gather_bytes(hvd, b"", name="t.empty", timeout=10) == [b""]
assert ag.broadcast_bytes(hvd, b"xyz", rank=0, root_rank=0, name="t.b") == (b"xyz", False)
assert ag.broadcast_bytes(hvd, b"no", rank=0, root_rank=0, name="t.r", refused=True) == (b"no", True)
assert ag.gather_versions(hvd, 7, name="t.v", timeout=10, rank=0) == [7]
rows = ag.allgather_polled(hvd, torch.ones(1, 2, dtype=torch.int64), name="t.p", timeout=10,
                           rank=0, what="x")
assert rows.tolist() == [[1, 1]]
print("AGREEMENT-OK", flush=True)
"""


def test_poll_until_returns_when_ready_and_gives_up_at_the_deadline():
    calls = []
    assert poll_until(lambda: calls.append(1) or len(calls) >= 3, timeout=5.0)
    assert len(calls) == 3
    t0 = time.monotonic()
    assert not poll_until(lambda: False, timeout=0.05)
    assert 0.05 <= time.monotonic() - t0 < 1.0


def test_no_answer_names_the_rank_the_check_and_the_deadline():
    msg = no_answer(2, "the comparison of loader 0", 8.0)
    assert msg.startswith("rank 2: the comparison of loader 0 got no answer within 8s")


@pytest.mark.slow
def test_the_collectives_on_a_one_rank_horovod_world():
    pytest.importorskip("horovod.torch")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOROVOD_", "TORCHELASTIC_", "OMPI_", "PMI_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "-c", ONE_RANK], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "AGREEMENT-OK" in proc.stdout, proc.stdout + proc.stderr
