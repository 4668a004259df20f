"""``CodedSampler`` and ``batch_layout`` in one process, against the real schemes' plans (the
source is the smallest object with the DDP door's four members, fed by the real
``loop_plan`` rule)."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pgc_hvd.data import partition
from pgc_hvd.data.coded_sampler import CodedSampler, DealRule, batch_layout
from pgc_hvd.runtime.capture import loop_plan
from pgc_hvd.schemes import Ring, get_scheme


class Source:
    """n, version, loop_partitions, expect_batch_size: what the sampler asks of the door."""

    def __init__(self, scheme, rank):
        self.scheme, self.rank, self.n, self.version = scheme, rank, scheme.n, 0
        self.ring_mode = scheme.pipelined
        self.batch = None
        self.loop_width = max(len(loop_plan(scheme, r, t, self.ring_mode).evaluate)
                              for r in range(self.n) for t in range(8))

    def loop_partitions(self, step):
        plan = loop_plan(self.scheme, self.rank, step, self.ring_mode)
        if self.ring_mode:
            return tuple((q, 1.0) for q, _ in plan.evaluate)
        coef = dict(plan.combine)
        return tuple((q, float(coef[sl])) for q, sl in plan.evaluate)

    def expect_batch_size(self, b):
        self.batch = b


def test_batch_layout_weights_rows_so_one_backward_gives_the_message():
    b, rows = batch_layout(((3, 0.5), (4, 2.0), (5, 1.0)), 32, 3)
    assert b == 10 and rows == [(0, 10, 1.6), (10, 20, 6.4), (20, 30, 3.2), (30, 32, 0.0)]
    # mean loss over 32 rows, rows scaled: sum_j w_j * mean over partition j's 10 rows
    g = torch.randn(32)
    scale = torch.zeros(32)
    for s0, s1, w in rows:
        scale[s0:s1] = w
    want = 0.5 * g[:10].mean() + 2.0 * g[10:20].mean() + 1.0 * g[20:30].mean()
    assert torch.allclose((g * scale).mean(), want)
    with pytest.raises(ValueError, match="batch_size >= 3"):
        batch_layout(((0, 1.0), (1, 1.0), (2, 1.0)), 2, 3)
    b, rows = batch_layout(((7, 1.0),), 32, 4)      # a rank with one partition where others have 4
    assert b == 8 and rows == [(0, 8, 4.0), (8, 32, 0.0)]


@pytest.mark.parametrize("split", ["deal", "fixed"])
@pytest.mark.parametrize("name,n", [("pgc-cr", 4), ("dgd", 4), ("bcgc", 4), ("bcgc", 3),
                                    ("gc-cr", 4), ("bounded-staleness", 4)])
def test_sampler_batches_are_the_plans_partitions_replicas_agree(name, n, split):
    N, B = 400, 16
    scheme = get_scheme(name, n, 1 if name != "dgd" else 0)
    fixed = partition(N, n, seed=3) if split == "fixed" else None
    samplers = [CodedSampler(N, batch_size=B, seed=3, partitions=fixed).bind(Source(scheme, r))
                for r in range(n)]
    assert samplers[0].dealt == (split == "deal")
    k = samplers[0].source.loop_width       # b = B // k rows a partition, on every rank
    E = -(-N // n) // (B // k)
    if split == "deal":                     # partition q of epoch e: the deal's row q
        deal = DealRule(N, n, B // k, 3)
        parts_at = lambda t: deal.deal(t // E)
    else:
        parts_at = lambda t: fixed
    for t in (0, E):       # every index once (the deal pads n - N % n with repeats)
        every = np.concatenate(parts_at(t)).tolist()
        assert set(every) == set(range(N)) and len(every) == (-(-N // n) * n if fixed is None
                                                              else N)
    for r, smp in enumerate(samplers):
        assert len(smp) == E * B
        idx = list(smp)
        assert len(idx) == E * B
        for t in range(E):
            batch = idx[t * B:(t + 1) * B]
            layout = smp.source.loop_partitions(t)
            assert 1 <= len(layout) <= k
            for j, (q, _) in enumerate(layout):
                chunk = batch[j * (B // k):(j + 1) * (B // k)]
                assert set(chunk) <= set(parts_at(t)[q].tolist())
    # two ranks that evaluate partition q at step t get the same samples of it
    seen = {}
    for r, smp in enumerate(samplers):
        for t in (0, 1, 2, E, E + 1):
            batch = smp.indices(t)
            for j, (q, _) in enumerate(smp.source.loop_partitions(t)):
                chunk = tuple(batch[j * (B // k):(j + 1) * (B // k)])
                assert seen.setdefault((q, t), chunk) == chunk


@pytest.mark.parametrize("N,n,B", [(400, 4, 16), (403, 4, 16), (10, 4, 2), (7, 3, 1)])
def test_the_deal_is_distributed_samplers_batches_every_epoch(N, n, B):
    """At one partition a step (dgd), rank r's batch of step t is the one DataLoader +
    DistributedSampler(seed, set_epoch) gives rank r: padding (N not a multiple of n) and the
    epochs' reshuffles included; its last, partial batch is dropped (E = ceil(N / n) // B)."""
    from torch.utils.data import DistributedSampler
    scheme = get_scheme("dgd", n, 0)
    for r in range(n):
        smp = CodedSampler(N, batch_size=B, seed=5).bind(Source(scheme, r))
        E = -(-N // n) // B
        assert len(smp) == E * B
        ds = DistributedSampler(range(N), num_replicas=n, rank=r, shuffle=True, seed=5)
        for epoch in range(3):
            ds.set_epoch(epoch)
            want = list(DataLoader(range(N), batch_size=B, sampler=ds, drop_last=True))
            assert len(want) == E
            for j in range(E):
                assert smp.indices(epoch * E + j).tolist() == want[j].tolist()
    rule = DealRule(N, n, B, 5)
    for e in range(5):
        rule.deal(e)
    assert rule.cached_deals == DealRule.KEPT     # nothing grows with the run
    with pytest.raises(ValueError, match="fewer than"):
        DealRule(N, n, -(-N // n) + 1, 5)


def test_pipelined_warmup_evaluates_one_slot_of_the_rotation():
    scheme = get_scheme("pgc-cr", 4, 1)
    assert len(scheme.work_plan(0, 0).evaluate) == 2           # the scheme's warm-up
    ev0 = loop_plan(scheme, 0, 0, ring_mode=True).evaluate
    assert ev0 == scheme.work_plan(0, 2).evaluate and len(ev0) == 1
    assert Ring(scheme, 0).size == 2


def test_sampler_with_a_dataloader_follows_the_version_and_tells_the_batch_size():
    X = torch.arange(200, dtype=torch.float32).view(-1, 1)
    ds = TensorDataset(X, torch.zeros(200, dtype=torch.long))
    src = Source(get_scheme("pgc-cr", 2, 1), 1)
    smp = CodedSampler(ds, batch_size=10).bind(src)
    first = [xb[:, 0].long().tolist() for xb, _ in DataLoader(ds, batch_size=10, sampler=smp)]
    assert src.batch == 10 and len(first) == len(smp) // 10 == 10
    src.version = 10       # the next epoch starts where the version is
    second = [xb[:, 0].long().tolist() for xb, _ in DataLoader(ds, batch_size=10, sampler=smp)]
    assert second[0] == smp.indices(10).tolist() and second != first


def test_unbound_sampler_names_the_fix():
    # no DDP door is built in the pytest process (the door's tests run under torchrun)
    with pytest.raises(RuntimeError, match="DistributedDataParallel"):
        len(CodedSampler(100, batch_size=10))
    with pytest.raises(ValueError, match="batch_size"):
        CodedSampler(100, batch_size=0)
