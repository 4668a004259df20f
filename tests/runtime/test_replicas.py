"""The replicas on their own, in one process: :class:`~pgc_hvd.runtime.capture.
ReplicaRNG` (the forward pass's randomness as a function of (seed, partition, step), the user's
generator restored after the scope) and the first step's batch digests of
:class:`~pgc_hvd.runtime.replicas.ReplicaDataCheck` (their comparison across ranks is
tested under horovodrun: test_lifecycle.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from pgc_hvd.runtime.capture import ReplicaRNG, replica_seed
from pgc_hvd.runtime.replicas import ReplicaDataCheck, batch_digest


def masks(rng, partition, step):
    drop = nn.Dropout(0.5).train()
    with rng.scope(partition, step):
        return drop(torch.ones(64)) != 0


def test_a_partitions_dropout_is_the_same_on_every_replica_and_step_dependent():
    a, b = ReplicaRNG(seed=11), ReplicaRNG(seed=11)
    torch.manual_seed(1)                    # the replicas' own generators differ
    m_a = masks(a, 3, 5)
    torch.manual_seed(2)
    m_b = masks(b, 3, 5)
    assert torch.equal(m_a, m_b)
    assert not torch.equal(masks(a, 3, 6), m_a) and not torch.equal(masks(a, 4, 5), m_a)
    assert not torch.equal(masks(ReplicaRNG(seed=12), 3, 5), m_a)
    assert replica_seed(11, 3, 5) == replica_seed(11, 3, 5) != replica_seed(11, 5, 3)


def test_the_users_generator_is_restored_after_the_scope_even_on_error():
    rng = ReplicaRNG(seed=0)
    torch.manual_seed(123)
    state = torch.random.default_generator.get_state()
    with pytest.raises(ZeroDivisionError):
        with rng.scope(0, 0):
            torch.rand(3)
            1 / 0
    assert torch.equal(torch.random.default_generator.get_state(), state)


def test_batch_digests_see_every_tensor_and_array_in_order():
    x, y = torch.arange(6.0), torch.tensor([1, 0])
    assert batch_digest((x, y)) == batch_digest([x.clone(), y.clone()])
    assert batch_digest((x, y)) != batch_digest((y, x))
    assert batch_digest({"b": y, "a": x}) == batch_digest({"a": x, "b": y})
    assert batch_digest((np.arange(3.0),)) == batch_digest((torch.arange(3.0, dtype=torch.float64),))
    assert batch_digest((x + 1e-6, y)) != batch_digest((x, y))


def test_only_the_first_steps_batches_are_noted():
    check = ReplicaDataCheck(n=3, rank=1)
    check.note(1, (torch.ones(2),))
    check.note(2, (torch.zeros(2),))
    assert set(check.digests) == {1, 2}
    check.done = True                      # after the first step's comparison
    check.note(0, (torch.ones(2),))
    assert set(check.digests) == {1, 2}
