"""The cross-rank consistency pieces as pure functions (no Horovod): fingerprints of what must
agree, the differences between ranks' fingerprints and their message, parameter digests. The
collectives around them are tested under horovodrun (test_consistency_faults.py)."""

from __future__ import annotations

import json

import torch

from pgc_hvd.runtime import PartitionLoader
from pgc_hvd.runtime.consistency import (canonical, fingerprint_differences, loader_fingerprint,
                                         mismatch_message, optimizer_fingerprint, tensors_digest)


def fingerprint(opt, **kw):
    args = dict(scheme="pgc-cr", stragglers=1, options={}, compression=None, control="allgather",
                name="pgc", optimistic=True)
    args.update(kw)
    params = [p for g in opt.param_groups for p in g["params"]]
    # a rank's fingerprint travels as JSON: compare what arrives
    return json.loads(json.dumps(optimizer_fingerprint(type(opt), opt.param_groups, params,
                                                       **args)))


def model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(dtype)


def test_every_hyper_parameter_and_setting_is_a_named_field():
    m = model()
    rows = [fingerprint(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)),
            fingerprint(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)),
            fingerprint(torch.optim.SGD(m.parameters(), lr=0.1 + 1e-12, momentum=0.9),
                        name="other", optimistic=False)]
    diffs = fingerprint_differences(rows)
    assert [(f, bad) for f, bad, _ in diffs] == [("name", [2]), ("optimistic", [2]),
                                                  ("param_groups[0]['lr']", [2])]
    msg = mismatch_message(diffs, what="X", fix="Fix it.")
    assert "ranks [2] were built with a different param_groups[0]['lr'] than rank 0" in msg
    assert "rank 0: 0.1;" in msg and "rank 2: 0.100000000001" in msg and msg.endswith("Fix it.")
    assert "it names the collectives" in msg  # the hint of the name field


def test_class_dtype_device_and_groups_are_compared():
    m = model()
    sgd = fingerprint(torch.optim.SGD(m.parameters(), lr=0.1))
    adam = fingerprint(torch.optim.Adam(m.parameters(), lr=0.1))
    fields = {f for f, _, _ in fingerprint_differences([sgd, adam])}
    assert {"optimizer class", "param_groups[0]['betas']", "param_groups[0]['momentum']"} <= fields
    m64 = model(torch.float64)
    f64 = fingerprint(torch.optim.SGD(m64.parameters(), lr=0.1))
    diffs = fingerprint_differences([sgd, f64])
    assert [f for f, _, _ in diffs] == ["parameter dtypes"], diffs
    assert diffs[0][2] == {0: "float32 x4", 1: "float64 x4"}
    two = fingerprint(torch.optim.SGD([{"params": m[0].parameters()},
                                       {"params": m[1].parameters(), "lr": 0.01}], lr=0.1))
    fields = [f for f, _, _ in fingerprint_differences([sgd, two])]
    assert fields[0] == "param_groups (parameters per group)" and "param_groups[1]['lr']" in fields
    # many differing fields: the first four in full, the rest named
    msg = mismatch_message(fingerprint_differences([sgd, two]), what="X", fix="F.")
    assert "more fields differ" in msg


def test_the_same_settings_give_the_same_fingerprint():
    a, b = model(), model()
    assert fingerprint_differences([fingerprint(torch.optim.SGD(a.parameters(), lr=0.1)),
                                    fingerprint(torch.optim.SGD(b.parameters(), lr=0.1))]) == []
    # values that repr with a memory address are named by their class, not the address
    assert canonical(object()) == canonical(object()) == "<builtins.object>"
    assert canonical(torch.tensor(0.5)) == {"tensor": [0.5], "dtype": "torch.float32"}
    assert canonical((0.9, 0.999)) == [0.9, 0.999] and canonical(float("inf")) == "inf"


def test_loader_fingerprint_names_seed_batch_size_and_data():
    X, y = torch.randn(60, 3), torch.arange(60) % 2
    base = loader_fingerprint(PartitionLoader(X, y, 3, batch_size=8, seed=1))
    assert base == loader_fingerprint(PartitionLoader(X, y, 3, batch_size=8, seed=1))
    for other, field in ((PartitionLoader(X, y, 3, batch_size=8, seed=2), "loader seed"),
                         (PartitionLoader(X, y, 3, batch_size=4, seed=1), "loader batch_size"),
                         (PartitionLoader(X, 1 - y, 3, batch_size=8, seed=1), "loader labels")):
        fields = [f for f, _, _ in fingerprint_differences([base, loader_fingerprint(other)])]
        assert field in fields, (field, fields)


def test_tensors_digest_is_bit_exact_and_dtype_aware():
    a = [torch.ones(5), torch.zeros(3)]
    assert tensors_digest(a) == tensors_digest([t.clone() for t in a])
    assert 0 <= tensors_digest(a) < 2 ** 63
    assert tensors_digest(a) != tensors_digest([torch.ones(5), -torch.zeros(3)])   # -0.0
    assert tensors_digest([torch.ones(4)]) != tensors_digest([torch.ones(4, dtype=torch.int32)])
    assert tensors_digest([torch.ones(2, dtype=torch.bfloat16)]) != tensors_digest(
        [torch.ones(2, dtype=torch.float16)])
