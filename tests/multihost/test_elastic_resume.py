"""Kills at any moment: the elastic recipe's durable progress and the
supervisor that restarts a failed job.

* ``pgc_hvd.runtime.elastic.checkpoints``: atomic files named by version, the tag's older ones
  removed, read with ``weights_only=True`` (a pickled callable is refused), and a resume that
  makes :class:`ElasticState`'s first ``sync()`` start at the saved version with the saved
  model and momentum (in-process, a one-rank stand-in for Horovod's collectives);
* ``launch/elastic_run.py``: restarts a command that fails, with a log line naming the exit
  status and the version it resumes from, until the done marker is written; gives up after
  ``--restarts``; ends a hung attempt (a scripted command: this tests the supervisor, not
  Horovod);
* one real run (``horovodrun -np 2`` elastic, localhost): the recipe started on a checkpoint of
  version 7 continues at 8 from that checkpoint's parameters and ends identical on both ranks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "launch"))

from pgc_hvd.runtime.elastic import checkpoints as ec  # noqa: E402


def _model(seed=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))


def _momentum(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    return opt


def test_files_are_atomic_named_by_version_and_replace_older(tmp_path):
    m = _model()
    opt = _momentum(m)
    for v in (3, 4):
        ec.write(tmp_path, "127.0.0.2.0", v, m.state_dict(), opt.state_dict(), n=4)
    ec.write(tmp_path, "127.0.0.3.0", 2, m.state_dict(), opt.state_dict(), n=4)
    assert [(v, t) for v, t, _ in ec.checkpoint_files(tmp_path)] == [(2, "127.0.0.3.0"),
                                                                    (4, "127.0.0.2.0")]
    assert ec.latest_version(tmp_path) == 4 and ec.latest_version(tmp_path / "none") is None
    assert not list(tmp_path.glob("*.tmp"))
    got = ec.read(tmp_path / "127.0.0.2.0.v4.pt")
    assert got["version"] == 4 and got["n"] == 4
    assert torch.equal(got["model"]["0.weight"], m[0].weight)


def test_a_file_carrying_a_pickled_callable_is_refused(tmp_path):
    bad = tmp_path / "x.v9.pt"
    torch.save({"format": 1, "version": 9, "model": {}, "optimizer": {}, "hook": os.system},
               bad)
    with pytest.raises(ec.ElasticCheckpointError, match="cannot be read"):
        ec.read(bad)
    with pytest.raises(TypeError, match="only tensors and plain types"):
        ec.write(tmp_path, "t", 1, {"f": os.system}, {})


class _OneRank:
    """Horovod's collectives for a world of one rank (what ElasticState.sync calls)."""

    def size(self):
        return 1

    def rank(self):
        return 0

    def allgather(self, t, name=None):
        return t

    def broadcast_parameters(self, *a, **k):
        raise AssertionError("nothing to broadcast in a world of one")


class _Opt(torch.optim.SGD):
    """What ElasticState and ElasticCheckpoints use of a pgc_hvd optimizer."""

    def __init__(self, base):
        super().__init__(base.param_groups[0]["params"], lr=0.05, momentum=0.9)
        self.load_state_dict(base.state_dict())
        self.n, self.version, self.config = 1, 0, None

    def start_at(self, v):
        self.version = v


def test_resume_starts_the_first_world_at_the_saved_version_with_its_state(tmp_path):
    pytest.importorskip("horovod.common.elastic")
    from pgc_hvd.runtime.elastic import ElasticState

    saved = _model(seed=3)
    saved_opt = _momentum(saved)
    ec.write(tmp_path, "h.0", 7, saved.state_dict(), saved_opt.state_dict(), n=4)

    model = _model(seed=99)           # another initialisation: the resume must replace it
    base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = ElasticState(model, base, make_optimizer=lambda b: _Opt(b), hvd=_OneRank())
    ckpt = ec.ElasticCheckpoints(tmp_path, tag="h.0")
    assert ckpt.resume(state) == 7
    state.sync()
    assert state.opt.version == 7
    for a, b in zip(model.parameters(), saved.parameters()):
        assert torch.equal(a, b)
    buf = state.opt.state[next(iter(model.parameters()))]["momentum_buffer"]
    assert torch.equal(buf, saved_opt.state[next(iter(saved.parameters()))]["momentum_buffer"])
    assert ckpt.save(state) is None              # version 7 is on disk already
    state.opt.version = 8
    assert ckpt.save(state).endswith("h.0.v8.pt") and ec.latest_version(tmp_path) == 8
    assert [v for v, _, _ in ec.checkpoint_files(tmp_path)] == [8]
    every = ec.ElasticCheckpoints(tmp_path / "e", tag="h.0", every=5)
    assert every.save(state) is None and every.save(state, force=True) is not None


# -- the supervisor ------------------------------------------------------------------------

FAKE = """
import json, os, sys, time
out, fails = sys.argv[1], int(sys.argv[2])
n = int(os.environ["PGC_ELASTIC_ATTEMPT"])
os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
open(os.path.join(out, "checkpoints", f"h.0.v{10 * (n + 1)}.pt"), "w").close()
if len(sys.argv) > 3 and n == 0:
    time.sleep(60)          # a hung first attempt
if n < fails:
    sys.exit(3)
json.dump({"attempt": n}, open(os.path.join(out, "done.json"), "w"))
"""


def _supervise(tmp_path, fails, restarts=5, capsys=None, extra=(), timeout=None):
    import elastic_run

    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    out = tmp_path / "out"
    pauses = []
    rc = elastic_run.supervise([sys.executable, str(script), str(out), str(fails), *extra],
                               out, restarts=restarts, backoff=2.0, max_backoff=5.0,
                               attempt_timeout=timeout, sleep=pauses.append)
    rows = [json.loads(x) for x in (out / "supervisor.jsonl").read_text().splitlines()]
    return rc, rows, pauses


def test_supervisor_restarts_until_done_and_names_status_and_version(tmp_path, capsys):
    rc, rows, pauses = _supervise(tmp_path, fails=2)
    err = capsys.readouterr().err
    assert rc == 0
    assert [r["rc"] for r in rows] == [3, 3, 0] and [r["done"] for r in rows] == [0, 0, 1]
    assert [r["resumed_from"] for r in rows] == [None, 10, 20]
    assert pauses == [2.0, 4.0]                      # doubling backoff
    assert "attempt 0: exit status 3; restarting in 2 s from version 10 (restart 1 of 5)" in err
    assert "attempt 2: completed at version 30 after 2 restart(s)" in err


def test_supervisor_gives_up_after_its_restarts(tmp_path, capsys):
    rc, rows, pauses = _supervise(tmp_path, fails=9, restarts=2)
    assert rc == 3 and len(rows) == 3 and pauses == [2.0, 4.0]
    assert "no restart left (2 allowed): giving up, the newest checkpoint is version 30" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_supervisor_exit_0_without_done_marker_is_a_failure_and_a_hang_is_ended(tmp_path,
                                                                                capsys):
    import elastic_run

    out = tmp_path / "out"
    out.mkdir()
    (out / "done.json").write_text("{}")             # stale: removed before the first attempt
    rc = elastic_run.supervise([sys.executable, "-c", "pass"], out, restarts=1,
                               sleep=lambda s: None)
    assert rc == 1 and "exit status 0 without the done marker" in capsys.readouterr().err
    rc, rows, _ = _supervise(tmp_path / "hang", fails=0, extra=("hang",), timeout=3)
    assert rc == 0 and rows[0]["rc"] is None and rows[1]["rc"] == 0
    assert "attempt 0: timed out; restarting" in capsys.readouterr().err


# -- one real run ----------------------------------------------------------------------------

@pytest.mark.multirank
def test_recipe_resumes_from_a_checkpoint_on_two_ranks(tmp_path):
    """horovodrun -np 2 (elastic, localhost): the recipe started on a checkpoint of version 7
    continues at 8 from exactly that model and ends at 12 with identical parameters."""
    exe = Path(sys.executable).with_name("horovodrun")
    if not exe.exists():
        pytest.skip("horovod is not installed (run bash launch/setup.sh)")
    from pgc_hvd.runtime.consistency import tensors_digest

    saved = _model(seed=5)
    out = tmp_path / "run"
    ec.write(out / "checkpoints", "elsewhere.0", 7, saved.state_dict(),
             _momentum(saved).state_dict(), n=3)
    disc = tmp_path / "discover.sh"
    disc.write_text("#!/bin/sh\necho localhost:2\n")
    disc.chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [str(exe), "--gloo", "-np", "2", "--min-np", "2", "--max-np", "2",
           "--host-discovery-script", str(disc), "--network-interface", "lo", sys.executable,
           str(ROOT / "launch" / "elastic_train.py"), "--steps", "12", "--out", str(out),
           "--progress"]
    proc = run_watched(cmd, env=env, cwd=tmp_path, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    assert len(rows) == 2 and {r["resumed_from"] for r in rows} == {7}
    assert {r["start"]["version"] for r in rows} == {7}
    assert {r["start"]["digest"] for r in rows} == {tensors_digest(saved.parameters())}
    assert {r["version"] for r in rows} == {12} and len({r["digest"] for r in rows}) == 1
    for p in (out / "progress").glob("*.txt"):
        assert [int(x.split()[0]) for x in p.read_text().splitlines()] == list(range(7, 13))
    assert json.loads((out / "done.json").read_text())["version"] == 12
    assert ec.latest_version(out / "checkpoints") == 12
