"""The DDP door's settings are the optimizer's: one name per setting (API, Lightning strategy)."""

import inspect

from pgc_hvd.runtime.ddp import RUNTIME_OPTIONS, DistributedDataParallel
from pgc_hvd.runtime.distributed import DistributedOptimizer


def test_every_runtime_option_of_the_wrap_is_a_keyword_of_the_optimizer():
    params = inspect.signature(DistributedOptimizer).parameters
    assert set(RUNTIME_OPTIONS) <= set(params), set(RUNTIME_OPTIONS) - set(params)
    # what the wrap decides itself is not an option: the engine and the parameters
    assert not {"hvd", "engine", "named_parameters"} & set(RUNTIME_OPTIONS)


def test_the_door_is_torchs_ddp():
    import torch
    assert issubclass(DistributedDataParallel, torch.nn.parallel.DistributedDataParallel)
    import pgc_hvd
    import pgc_hvd.torch as pt
    assert pgc_hvd.DistributedDataParallel is DistributedDataParallel is pt.DistributedDataParallel
    assert pgc_hvd.CodedSampler is pt.CodedSampler
