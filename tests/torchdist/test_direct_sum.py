"""Which sums of an agent's data group go by direct exchanges (pgc_hvd.torchdist.direct_sum):
the rule alone; the sums themselves run under torchrun (test_torchrun.py:
``test_agent_sums_by_direct_exchanges`` at np 3 and 4, a dead and a frozen partner, the census)."""

import pytest
import torch

from pgc_hvd.torchdist import direct_sum


@pytest.mark.parametrize("n, taken", [(1, False), (2, False), (3, True), (4, True), (6, True),
                                      (8, True), (9, False), (64, False)])
def test_three_to_eight_ranks(n, taken):
    """At 2 ranks gloo's allreduce is faster; above 8 the rounds' n - 1 messages a rank are
    not measured (docs/benchmarks.md, session 27)."""
    assert (direct_sum.MIN_RANKS, direct_sum.MAX_RANKS) == (3, 8)
    assert direct_sum.applies(torch.zeros(1000), n) is taken


def test_floating_cpu_tensors_from_n_elements_to_one_mib():
    assert direct_sum.applies(torch.zeros(4), 4)
    assert not direct_sum.applies(torch.zeros(3), 4)                       # fewer words than ranks
    assert direct_sum.applies(torch.zeros(direct_sum.MAX_BYTES // 4), 4)   # 1 MiB of float32
    assert not direct_sum.applies(torch.zeros(direct_sum.MAX_BYTES // 4 + 1), 4)
    assert direct_sum.applies(torch.zeros(direct_sum.MAX_BYTES // 2, dtype=torch.float16), 4)
    assert not direct_sum.applies(torch.zeros(1000, dtype=torch.int64), 4)
    assert not direct_sum.applies(torch.zeros(1000, dtype=torch.complex64), 4)
    assert not direct_sum.applies(torch.zeros(40, 50).t(), 4)              # not contiguous
