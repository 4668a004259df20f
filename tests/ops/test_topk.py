"""Top-kappa compression: kernels vs the pure-PyTorch reference, adversarial inputs, the
threshold method's recall of the exact top-kappa's L2 mass, and input checks."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgc_hvd.ops import topk_compress
from pgc_hvd.ops._ext import library
from pgc_hvd.ops.compress import cuda_topk_from_env
from pgc_hvd.ops.reference import topk_compress_ref

from ops_helpers import DEVICES, DTYPES, sample_positions

METHODS = ["exact", "threshold"]


def assert_matches_ref(x: torch.Tensor, k: int, method: str, index_dtype=torch.int64,
                       **setting):
    """setting: the CUDA radix select's walk / compact arguments (the defaults when absent)."""
    values, indices = topk_compress(x, k, method, index_dtype=index_dtype, **setting)
    ref_v, ref_i = topk_compress_ref(x.cpu(), k, index_dtype=index_dtype)
    assert values.dtype == x.dtype and indices.dtype == index_dtype
    assert values.device == x.device and indices.device == x.device
    assert torch.equal(indices.cpu(), ref_i), (method, k, x.numel())
    assert torch.equal(values.cpu(), ref_v), (method, k, x.numel())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("d", [1, 7, 257, 1025, 70_001])
def test_random_matches_reference(device, method, d):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(d, generator=g).to(device)
    for k in sorted({0, 1, max(1, d // 100), d // 3, d - 1, d}):
        assert_matches_ref(x, k, method)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_dtypes(device, method, dtype, index_dtype):
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    assert_matches_ref(x, 1000, method, index_dtype)
    assert_matches_ref(x, 5000, method, index_dtype)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_large_input(device, method):
    d = 2_000_003
    torch.manual_seed(7)
    x = torch.distributions.StudentT(3.0).sample((d,)).to(device)
    for k in (d // 100, d // 20):
        assert_matches_ref(x, k, method)


ADVERSARIAL = {
    "all_equal": lambda d: torch.full((d,), 0.5),
    "all_zero": lambda d: torch.zeros(d),
    "signed_zeros": lambda d: torch.where(torch.arange(d) % 2 == 0, 0.0, -0.0),
    "many_ties": lambda d: torch.randint(-3, 4, (d,), generator=torch.Generator().manual_seed(3)).float(),
    "one_huge": lambda d: torch.randn(d, generator=torch.Generator().manual_seed(4)).index_fill_(0, torch.tensor([d // 2]), 3e38),
    "denormals": lambda d: torch.randn(d, generator=torch.Generator().manual_seed(5)) * 1e-42,
    "alternating_sign_ties": lambda d: torch.where(torch.arange(d) % 3 == 0, -1.0, 1.0),
    "ramp": lambda d: torch.arange(d, dtype=torch.float32) - d / 2,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
@pytest.mark.parametrize("d", [13, 1031, 131_101])  # none a multiple of a vector width
def test_adversarial(device, method, case, d):
    x = ADVERSARIAL[case](d).contiguous().to(device)
    for k in sorted({0, 1, 3, d // 10, d // 2, d}):
        assert_matches_ref(x, k, method)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_lower_index_first(device):
    x = torch.tensor([1.0, -2.0, 2.0, 0.5, -2.0, 2.0], device=device)
    for method in METHODS:
        v, i = topk_compress(x, 3, method)
        assert i.tolist() == [1, 2, 4] and v.tolist() == [-2.0, 2.0, -2.0]


@pytest.mark.parametrize("device", DEVICES)
def test_threshold_top_up(device):
    """Sampled positions hold the largest magnitudes but k exceeds the sample: the threshold
    keeps too few candidates and must be lowered (twice) to top the selection up to k."""
    d = 1_000_003
    x = torch.rand(d, generator=torch.Generator().manual_seed(9))
    x[sample_positions(d)] = 10.0
    k = 100_000  # > 65536 sampled positions
    assert_matches_ref(x.to(device), k, "threshold")
    # a milder case: one halving is enough
    x = torch.rand(d, generator=torch.Generator().manual_seed(9)) * 0.5 + 5.0
    x[sample_positions(d)] = 10.0
    assert_matches_ref(x.to(device), k, "threshold")


def l2_mass(x: torch.Tensor, values: torch.Tensor) -> float:
    return float(values.double().pow(2).sum() / x.double().pow(2).sum())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", ["gaussian", "student_t3"])
@pytest.mark.parametrize("frac", [0.01, 0.05])
def test_threshold_recall_of_exact_mass(device, dist, frac):
    d = 1_000_000
    torch.manual_seed(11)
    if dist == "gaussian":
        x = torch.randn(d)
    else:
        x = torch.distributions.StudentT(3.0).sample((d,))
    x = x.to(device)
    k = int(frac * d)
    v_exact, _ = topk_compress(x, k, "exact")
    v_thr, i_thr = topk_compress(x, k, "threshold")
    assert v_thr.numel() == k and torch.unique(i_thr).numel() == k
    recall = l2_mass(x, v_thr) / l2_mass(x, v_exact)
    assert recall >= 0.95, recall


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_raises(device, method, bad):
    x = torch.randn(100_000)
    x[12_345] = bad
    with pytest.raises(ValueError, match="Inf or NaN"):
        topk_compress(x.to(device), 100, method)
    # a sample full of non-finite values is caught before the compaction pass
    x = torch.full((100_000,), bad)
    with pytest.raises(ValueError, match="Inf or NaN"):
        topk_compress(x.to(device), 100, method)


@pytest.mark.parametrize("device", DEVICES)
def test_input_checks(device):
    x = torch.randn(100, device=device)
    with pytest.raises(ValueError, match=r"k must lie in \[0, d\]"):
        topk_compress(x, 101)
    with pytest.raises(ValueError, match=r"k must lie in \[0, d\]"):
        topk_compress(x, -1)
    with pytest.raises(TypeError, match="k must be an int"):
        topk_compress(x, 0.5)
    with pytest.raises(TypeError, match="k must be an int"):
        topk_compress(x, True)
    with pytest.raises(ValueError, match="method"):
        topk_compress(x, 3, "approximate")
    with pytest.raises(TypeError, match="index_dtype"):
        topk_compress(x, 3, index_dtype=torch.float32)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        topk_compress(x.double(), 3)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        topk_compress(x.int(), 3)
    with pytest.raises(ValueError, match="contiguous"):
        topk_compress(x[::2], 3)
    with pytest.raises(ValueError, match="1-D"):
        topk_compress(x.view(10, 10), 3)
    empty_v, empty_i = topk_compress(torch.empty(0, device=device), 0)
    assert empty_v.numel() == 0 and empty_i.numel() == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=300),
    kfrac=st.floats(0, 1),
    method=st.sampled_from(METHODS),
)
def test_hypothesis_matches_reference(data, kfrac, method):
    x = torch.tensor(data, dtype=torch.float32)
    k = int(round(kfrac * x.numel()))
    assert_matches_ref(x, k, method)


@settings(max_examples=25, deadline=None)
@given(
    levels=st.integers(1, 5),
    d=st.integers(1, 5000),
    kfrac=st.floats(0, 1),
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(METHODS),
)
def test_hypothesis_ties(levels, d, kfrac, seed, method):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-levels, levels + 1, (d,), generator=g).float() * 0.25
    assert_matches_ref(x, int(math.floor(kfrac * d)), method)


# Every CUDA radix-select setting, as the top-k ops' arguments: walk (who walks the radix digits;
# default from PGC_HVD_CUDA_TOPK_WALK) and compact (whether the device walk compacts the
# candidates; default from PGC_HVD_CUDA_TOPK_COMPACT).
CUDA_SETTINGS = [dict(walk="device", compact=True), dict(walk="host", compact=True),
                 dict(walk="device", compact=False)]


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", ["gaussian", "student_t3", "many_ties", "all_equal", "ramp"])
@pytest.mark.parametrize("d", [1, 1031, 300_007])
def test_cuda_walks_agree(method, case, d):
    """Both CUDA drivers of radix select (device-side walk, the default, with or without the
    compaction, and the host-driven first version) select exactly the reference's entries."""
    g = torch.Generator().manual_seed(d)
    if case == "gaussian":
        x = torch.randn(d, generator=g)
    elif case == "student_t3":
        x = torch.distributions.StudentT(3.0).sample((d,))
    else:
        x = ADVERSARIAL[case](d)
    x = x.contiguous().cuda()
    for setting in CUDA_SETTINGS:
        for k in sorted({1, max(1, d // 100), d // 3, d}):
            assert_matches_ref(x, k, method, **setting)
    x[d // 2] = float("nan")  # the check still comes before anything is returned
    with pytest.raises(ValueError, match="Inf or NaN"):
        topk_compress(x, 1, method)


def test_cuda_walk_settings_are_checked():
    """The environment's settings are checked when read (once per process), and so are the
    arguments, on every device (the CPU kernels ignore them but refuse a bad walk)."""
    assert cuda_topk_from_env({}) == ("device", True)
    assert cuda_topk_from_env({"PGC_HVD_CUDA_TOPK_WALK": "host",
                               "PGC_HVD_CUDA_TOPK_COMPACT": "0"}) == ("host", False)
    with pytest.raises(ValueError, match="PGC_HVD_CUDA_TOPK_WALK must be 'device'"):
        cuda_topk_from_env({"PGC_HVD_CUDA_TOPK_WALK": "sideways"})
    for walk in ("device", "host"):
        with pytest.raises(ValueError, match="PGC_HVD_CUDA_TOPK_COMPACT must be 1"):
            cuda_topk_from_env({"PGC_HVD_CUDA_TOPK_WALK": walk,
                                "PGC_HVD_CUDA_TOPK_COMPACT": "yes"})
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for method in METHODS:
            with pytest.raises(ValueError, match="walk must be one of"):
                topk_compress(torch.randn(10, device=device), 3, method, walk="sideways")
            with pytest.raises(ValueError, match='walk must be "device"'):
                library().topk_compress(torch.randn(10, device=device), 3, method, True,
                                        "sideways", True)


@pytest.mark.slow
def test_cuda_walk_settings_read_once():
    """pgc_hvd.ops reads PGC_HVD_CUDA_TOPK_WALK / _COMPACT once, at its import, and keeps them
    (a later change of the environment is not seen); a bad value makes a top-k raise ValueError
    on any device, naming the variable."""
    script = """
import os, torch
from pgc_hvd.ops import topk_compress
from pgc_hvd.ops.compress import cuda_topk_defaults
topk_compress(torch.randn(10), 3)
os.environ["PGC_HVD_CUDA_TOPK_WALK"] = "device"
os.environ["PGC_HVD_CUDA_TOPK_COMPACT"] = "1"
print(cuda_topk_defaults())
"""
    env = dict(os.environ, PGC_HVD_CUDA_TOPK_WALK="host", PGC_HVD_CUDA_TOPK_COMPACT="0")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('host', False)"
    env["PGC_HVD_CUDA_TOPK_WALK"] = "sideways"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "ValueError: PGC_HVD_CUDA_TOPK_WALK must be 'device'" in out.stderr


@pytest.mark.gpu
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(
    levels=st.integers(1, 40),
    d=st.integers(1, 20_000),
    kfrac=st.floats(0, 0.05) | st.floats(0, 1),  # small k (compaction) as often as any k
    seed=st.integers(0, 2**31 - 1),
    method=st.sampled_from(METHODS),
    setting=st.sampled_from(CUDA_SETTINGS),
    dtype=st.sampled_from(DTYPES),
)
def test_hypothesis_cuda_matches_reference(levels, d, kfrac, seed, method, setting, dtype):
    """Random sizes, tie structures and scales (values spread over 23 binades, so every radix
    digit decides somewhere; |x| <= 40 * 2^10 stays finite in float16) on the GPU, under both
    drivers of radix select (and the device walk without compaction)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-levels, levels + 1, (d,), generator=g).float()
    x = x * torch.exp2(torch.randint(-12, 11, (d,), generator=g).float())
    x = x * (1 + torch.randint(0, 4, (d,), generator=g).float() * 2.0**-21)  # float32's last digit
    assert_matches_ref(x.to("cuda", dtype), max(1, int(math.floor(kfrac * d))), method, **setting)
