"""Which sums of an agent's data group go by recursive halving and doubling
(pgc_hvd.torchdist.halving): the rule alone; the sums themselves run under torchrun
(test_torchrun.py: ``test_agent_sums_by_halving``, a dead and a frozen partner, the census at
np 4)."""

import pytest
import torch

from pgc_hvd.torchdist import halving


@pytest.mark.parametrize("n, taken", [(1, False), (2, True), (3, False), (4, True), (6, False),
                                      (8, True), (64, True)])
def test_a_power_of_two_ranks(n, taken):
    assert halving.applies(torch.zeros(1000), n) is taken


def test_floating_cpu_tensors_from_n_elements_to_one_mib():
    assert halving.applies(torch.zeros(4), 4)
    assert not halving.applies(torch.zeros(3), 4)                       # fewer words than ranks
    assert halving.applies(torch.zeros(halving.MAX_BYTES // 4), 4)      # 1 MiB of float32
    assert not halving.applies(torch.zeros(halving.MAX_BYTES // 4 + 1), 4)
    assert halving.applies(torch.zeros(halving.MAX_BYTES // 2, dtype=torch.float16), 4)
    assert not halving.applies(torch.zeros(1000, dtype=torch.int64), 4)
    assert not halving.applies(torch.zeros(1000, dtype=torch.complex64), 4)
    assert not halving.applies(torch.zeros(40, 50).t(), 4)              # not contiguous
