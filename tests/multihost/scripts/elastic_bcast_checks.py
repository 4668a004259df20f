"""Runs on every rank under horovodrun -np 2: elastic.bcast_object sends tensors and plain types
and never builds anything else from a peer's bytes.

    python elastic_bcast_checks.py

1. an optimizer's state_dict() (tensors, numbers, lists) from rank 1 arrives equal on rank 0;
2. a root whose object holds something else (an object whose ``__reduce__`` calls
   ``os.system``): every rank raises NotPlain with the root's message naming the entry;
3. a hostile peer: rank 0 broadcasts, under bcast_object's tensor names, the bytes of
   ``torch.save`` of that object (as a peer that skips the check would); rank 1, in
   bcast_object, refuses it naming the global, and the command never runs;
4. ``ElasticState.commit()`` (Horovod's host-update check, whose tuple carries an IntFlag)
   goes through it.

Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import io
import os

import horovod.torch as hvd
import numpy as np
import torch

from pgc_hvd.runtime.elastic import ElasticState, bcast_object
from pgc_hvd.runtime.plain import NotPlain
from checks import ok   # tests/checks.py

MARKER = os.path.abspath("code-ran")


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def main():
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(r)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    got = bcast_object(hvd, opt.state_dict(), root_rank=1, name="t.sd")
    sent = bcast_object(hvd, opt.state_dict() if r == 1 else None, root_rank=1, name="t.sd2")
    for sd in (got, sent):
        assert sd["param_groups"][0]["lr"] == 0.2, sd["param_groups"]
        bufs = [sd["state"][i]["momentum_buffer"] for i in (0, 1)]
        same = hvd.allgather(torch.cat([b.reshape(-1) for b in bufs]).view(1, -1), name="t.cmp")
        assert torch.equal(same[0], same[1]), "the ranks got different optimizer states"
    ok("state_dict_arrives")

    try:
        bcast_object(hvd, {"fine": 1, "bad": [RunsCode()]}, root_rank=0, name="t.bad")
    except NotPlain as err:
        want = "bcast_object from rank 0: the object['bad'][0] is a __main__.RunsCode"
        assert want in str(err), err
    else:
        raise AssertionError("bcast_object sent an object that is not tensors and plain types")
    ok("root_refuses_objects")

    if r == 0:   # a peer that skips the check and sends a pickled callable
        buf = io.BytesIO()
        torch.save({"x": RunsCode()}, buf)
        raw = np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()
        hvd.broadcast(torch.tensor([len(raw)], dtype=torch.int64), 0, name="t.evil.len")
        hvd.broadcast(torch.from_numpy(raw), 0, name="t.evil.data")
    else:
        try:
            bcast_object(hvd, None, root_rank=0, name="t.evil")
        except ValueError as err:
            assert "rank 1: bcast_object refused what rank 0 sent" in str(err), err
            assert "posix.system" in str(err), err
        else:
            raise AssertionError("bcast_object built a pickled callable from a peer's bytes")
    hvd.allreduce(torch.zeros(1), name="t.after")
    assert not os.path.exists(MARKER), "a peer's bytes ran a command"
    ok("peer_bytes_never_run")

    state = ElasticState(model, opt, make_optimizer=lambda base: None)
    state.commit()      # save() + Horovod's check_host_updates() through bcast_object
    ok("commit_host_check")
    print(f"ALL OK rank={r}", flush=True)


if __name__ == "__main__":
    main()
