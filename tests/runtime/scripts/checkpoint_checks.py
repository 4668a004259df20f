"""Runs on every rank under horovodrun -np 2: checks of save_checkpoint / load_checkpoint.

    python checkpoint_checks.py refuse   # bad files are refused on every rank, naming the file,
                                         #   with model and optimizer untouched; a good one then
                                         #   restores into the same objects
    python checkpoint_checks.py agree    # ranks whose files hold different steps, or where one
                                         #   rank's file is missing or damaged, all refuse with one
                                         #   message and restore nothing
    python checkpoint_checks.py save     # saves fsync the file and its folder; a failed or
                                         #   interrupted save leaves no .tmp and the old file
                                         #   intact; an object in extra is refused first

Files live in the current folder (the pytest fixture runs each launch in a fresh tmp_path).
Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import zlib
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd
from pgc_hvd.compress import TopK
from pgc_hvd.runtime import PartitionLoader, load_checkpoint, save_checkpoint
from pgc_hvd.runtime.checkpoint import CheckpointError
from checks import ok   # tests/checks.py

torch.set_num_threads(1)


def model(hidden=10, seed=11):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def loader():
    g = torch.Generator().manual_seed(7)
    X = torch.randn(120, 6, generator=g)
    return PartitionLoader(X, (X[:, 0] > 0).long(), hvd.size(), batch_size=12, seed=3)


def build(m, name, s=1, compression=None):
    return pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                        m.named_parameters(), scheme="pgc-cr", stragglers=s,
                                        compression=compression, name=name, timeout=30)


def run(m, opt, steps):
    data = loader()
    while opt.version < steps:
        for xb, yb in opt.batches(data):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    opt.close()


def saved_run(path, steps, name):
    """Train ``steps`` steps and save every rank's checkpoint to ``path``."""
    m = model()
    opt = build(m, name)
    run(m, opt, steps)
    save_checkpoint(path, m, opt)
    return m


def params(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).clone()


def refused(path, m, opt, *needles):
    """load_checkpoint must raise CheckpointError containing every one of ``needles`` and change
    nothing; returns the message."""
    before, ring = params(m), [b.clone() for b in opt.pgc_state_dict()["ring"]]
    rng = torch.get_rng_state()
    try:
        load_checkpoint(path, m, opt)
    except CheckpointError as err:
        msg = str(err)
    else:
        raise AssertionError(f"{path}: load_checkpoint accepted it")
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert torch.equal(params(m), before), f"{path}: refused, but the model was changed"
    assert opt.version == 0, f"{path}: refused, but the optimizer is at step {opt.version}"
    assert all(torch.equal(a, b) for a, b in zip(opt.pgc_state_dict()["ring"], ring))
    assert torch.equal(torch.get_rng_state(), rng), f"{path}: refused, but the RNG was restored"
    return msg


def same_message_on_all_ranks(msg):
    h = hvd.allgather(torch.tensor([zlib.crc32(msg.encode())], dtype=torch.int64), name="msg")
    assert len(set(h.tolist())) == 1, f"ranks raised different messages: {msg}"


def check_refuse():
    r = hvd.rank()
    mine = f"good.rank{r}"
    saved_run("good", 4, "ck-good")
    raw = Path(mine).read_bytes()
    state = torch.load(mine, weights_only=True)

    def variant(tag, write):
        write(f"{tag}.rank{r}")
        return tag

    cases = [
        (variant("empty", lambda f: Path(f).write_bytes(b"")), "is empty"),
        (variant("truncated", lambda f: Path(f).write_bytes(raw[: len(raw) // 2])),
         "truncated or damaged"),
        (variant("other", lambda f: torch.save({"weights": torch.zeros(3)}, f)),
         "is not a pgc_hvd checkpoint"),
        (variant("noring", lambda f: torch.save(
            {**state, "pgc": {k: v for k, v in state["pgc"].items() if k != "ring"}}, f)),
         "lacks ['ring']"),
        (variant("badring", lambda f: torch.save(
            {**state, "pgc": {**state["pgc"], "ring": [b[:-1] for b in state["pgc"]["ring"]]}}, f)),
         "ring buffers"),
        ("missing", "does not exist"),
    ]
    m = model(seed=5)                       # a different init: a restore would change it
    opt = build(m, "ck-refuse")
    for path, needle in cases:
        msg = refused(path, m, opt, needle)
        assert f"{path}.rank{r}" in msg, f"the error does not name the file: {msg}"
        same_message_on_all_ranks(msg)
    # a checkpoint of another run set-up: refused before the model is touched
    for tag, kwargs, needle in (("shape", {"hidden": 12}, "model tensor shapes differ"),
                                ("s0", {"s": 0}, "saved with s=1, this run has s=0"),
                                ("topk", {"compression": TopK(0.5)}, "error-feedback residual")):
        other = model(hidden=kwargs.pop("hidden", 10))
        refused("good", other, build(other, f"ck-{tag}", **kwargs), needle)
    opt.close()
    # after all that, the same objects restore the good file and continue
    m = model(seed=5)
    opt = build(m, "ck-after")
    for path, needle in cases[:2]:
        refused(path, m, opt, needle)
    load_checkpoint("good", m, opt)
    assert opt.version == 4
    run(m, opt, 6)
    ok("refused_checkpoints_change_nothing")


def check_agree():
    r = hvd.rank()
    saved_run("four", 4, "ck-four")
    saved_run("six", 6, "ck-six")
    # rank 0 holds a step-4 file, rank 1 a step-6 one
    shutil.copy(f"four.rank{r}" if r == 0 else f"six.rank{r}", f"mixed.rank{r}")
    # only rank 0 has a file
    if r == 0:
        shutil.copy("four.rank0", "half.rank0")
    # rank 1's file is damaged
    shutil.copy(f"four.rank{r}", f"hurt.rank{r}")
    if r == 1:
        with open("hurt.rank1", "r+b") as f:
            f.truncate(100)
    m = model(seed=5)
    opt = build(m, "ck-agree")
    msg = refused("mixed", m, opt, "different steps")
    assert "rank 0: step 4" in msg and "rank 1: step 6" in msg, msg
    same_message_on_all_ranks(msg)
    msg = refused("half", m, opt, "half.rank1 does not exist")
    assert "rank 0: step 4" in msg, msg
    same_message_on_all_ranks(msg)
    msg = refused("hurt", m, opt, "hurt.rank1 cannot be read")
    same_message_on_all_ranks(msg)
    load_checkpoint("four", m, opt)         # the refusals left it restorable
    assert opt.version == 4
    run(m, opt, 6)
    ok("ranks_agree_or_all_refuse")


class Unpicklable:
    def __init__(self, exc):
        self.exc = exc

    def __reduce__(self):
        raise self.exc


def check_save():
    r = hvd.rank()
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.fstat(fd).st_mode)
        real_fsync(fd)

    os.fsync = recording_fsync
    try:
        saved_run("ck/a", 3, "ck-save")
    finally:
        os.fsync = real_fsync
    assert any(stat.S_ISREG(mode) for mode in synced), "the checkpoint file was not fsync'ed"
    assert any(stat.S_ISDIR(mode) for mode in synced), "its folder was not fsync'ed"
    good = Path(f"ck/a.rank{r}").read_bytes()
    m = model()
    opt = build(m, "ck-save2")
    real_save = torch.save
    for exc in (RuntimeError("cannot pickle this"), KeyboardInterrupt()):
        def failing_save(obj, f, exc=exc):    # torch.save fails half-way through the file
            f.write(b"partial checkpoint")
            raise exc
        torch.save = failing_save
        try:
            save_checkpoint("ck/a", m, opt, extra={"epoch": 1})
        except type(exc):
            pass
        else:
            raise AssertionError("save_checkpoint did not raise")
        finally:
            torch.save = real_save
        assert not os.path.exists(f"ck/a.rank{r}.tmp"), f"{type(exc).__name__} left a .tmp"
        assert Path(f"ck/a.rank{r}").read_bytes() == good, "the previous checkpoint was changed"
    # an object that is not a tensor or plain type is refused before anything is written
    try:
        save_checkpoint("ck/a", m, opt, extra={"bad": Unpicklable(RuntimeError("unreached"))})
    except TypeError as err:
        assert "extra['bad'] is a __main__.Unpicklable" in str(err), err
    else:
        raise AssertionError("save_checkpoint accepted an object in extra")
    assert not os.path.exists(f"ck/a.rank{r}.tmp")
    assert Path(f"ck/a.rank{r}").read_bytes() == good, "the previous checkpoint was changed"
    opt.close()
    ok("save_fsyncs_and_cleans_up")


def main():
    hvd.init()
    mode = sys.argv[1]
    {"refuse": check_refuse, "agree": check_agree, "save": check_save}[mode]()
    print(f"ALL OK rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
