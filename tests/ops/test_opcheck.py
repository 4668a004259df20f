"""The kernels as torch ops (``torch.ops.pgc_hvd``, csrc/library.cpp): ``torch.library.opcheck``
on each op (schema and its mutations, fake kernel vs the real one, tracing by AOT autograd with
static and dynamic shapes), torch.compile through the Python face of pgc_hvd.ops with the
results of the eager kernels, and the fake kernels' shapes. CPU here; on CUDA with a GPU."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import opcheck

from pgc_hvd import ops
from pgc_hvd.ops._ext import library

from ops_helpers import DEVICES, DTYPES


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def coded_samples(device):
    g = _gen(0)
    for dtype in DTYPES:
        for c, d in ((1, 7), (3, 1025), (17, 300)):
            slots = [torch.randn(d, generator=g).to(device, dtype) for _ in range(c)]
            coeffs = torch.randn(c, generator=g).tolist()
            for accumulate in (False, True):
                yield (torch.randn(d, generator=g).to(device), slots, coeffs, accumulate)
    yield (torch.randn(5, generator=g).to(device), [], [], False)  # no slots: zeroes out


def topk_samples(device):
    g = _gen(1)
    for dtype in DTYPES:
        for d in (1, 1031):
            x = torch.randn(d, generator=g).to(device, dtype)
            for k in sorted({0, d // 3, d}):
                for method in ("exact", "threshold"):
                    yield (x, k, method, k % 2 == 0, "device", True)
    x = torch.randn(1031, generator=g).to(device)
    for walk, compact in (("host", True), ("device", False)):  # the CUDA variants
        yield (x, 10, "exact", True, walk, compact)


def error_feedback_samples(device):
    g = _gen(2)
    for dtype in DTYPES:
        for d in (1, 1031):
            x = torch.randn(d, generator=g).to(device, dtype)
            for k in sorted({0, d // 3, d}):
                for method in ("exact", "threshold"):
                    residual = torch.randn(d, generator=g).to(device)
                    yield (x, residual, k, method, k % 2 == 0, "device", True)


def decode_samples(device):
    g = _gen(3)
    d = 4099
    for dtype in DTYPES:
        dense = [torch.randn(d, generator=g).to(device, dtype) for _ in range(2)]
        sv, si = [], []
        for index_dtype in (torch.int64, torch.int32):
            n = 300
            sv.append(torch.randn(n, generator=g).to(device, dtype))
            si.append(torch.randint(0, d, (n,), generator=g).to(device, index_dtype))  # repeats
        for accumulate in (True, False):
            for check_finite in (True, False):
                yield (torch.randn(d, generator=g).to(device), dense, [0.5, -2.0], sv, si,
                       [1.0, 0.25], accumulate, check_finite)
    yield (torch.randn(d, generator=g).to(device), [], [], [], [], [], False, True)  # nothing


OPS = {
    "coded_accumulate": coded_samples,
    "topk_compress": topk_samples,
    "error_feedback_compress": error_feedback_samples,
    "decode_accumulate": decode_samples,
}


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(device, name):
    op = getattr(library(), name).default
    assert torch.Tag.pt2_compliant_tag in op.tags
    for args in OPS[name](device):
        opcheck(op, args)


def test_every_op_has_a_kernel_per_device():
    """CPU and CUDA kernels from pgc_hvd._C (in a build without CUDA, its CUDA entry raises the
    error that says how to rebuild), Meta from the fake kernel."""
    library()
    for name in OPS:
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pgc_hvd::{name}", key), \
                (name, key)


def test_schemas_mark_what_the_ops_write():
    """Only out (coded, decode) and residual (error feedback) are written; the accumulating
    ops return nothing (no alias of an input), top-k and error feedback two new tensors."""
    lib = library()
    written = {}
    for name in OPS:
        schema = getattr(lib, name).default._schema
        written[name] = [a.name for a in schema.arguments
                         if a.alias_info is not None and a.alias_info.is_write]
        assert all(r.alias_info is None for r in schema.returns)
    assert written == {"coded_accumulate": ["out"], "topk_compress": [],
                       "error_feedback_compress": ["residual"], "decode_accumulate": ["out"]}


def test_fake_kernels_give_the_output_metadata():
    lib = library()
    with FakeTensorMode():
        x = torch.empty(1000, dtype=torch.bfloat16)
        v, i = lib.topk_compress(x, 17, "threshold", False, "device", True)
        assert (v.shape, v.dtype, i.shape, i.dtype) == ((17,), torch.bfloat16, (17,), torch.int32)
        r = torch.empty(1000)
        v, i = lib.error_feedback_compress(x, r, 5, "exact", True, "host", False)
        assert (v.shape, v.dtype, i.shape, i.dtype) == ((5,), torch.float32, (5,), torch.int64)
        with pytest.raises(RuntimeError, match="k must lie in"):
            lib.topk_compress(x, 1001, "exact", True, "device", True)
        assert lib.coded_accumulate(r, [x], [1.0], False) is None
        assert lib.decode_accumulate(r, [x], [1.0], [], [], [], True, True) is None


def _step(grad, residual, slots, out):
    """One worker's and one decoder's use of all four ops through the Python face."""
    ops.coded_accumulate(grad, slots, [1.0, -0.5, 2.0])
    ops.add_slot(grad, slots[0], 0.25)
    v1, i1 = ops.topk_compress(grad, 40)
    v2, i2 = ops.error_feedback_compress(grad, residual, 40, "threshold",
                                         index_dtype=torch.int32)
    ops.decode_accumulate(out, [grad, (v1, i1), (v2, i2)], [0.5, 1.0, -1.0], accumulate=False)
    return out * 2, v1, i2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_traces_the_ops(device, dynamic):
    """torch.compile (fullgraph: no graph break) through pgc_hvd.ops puts the four ops in one
    graph, and it computes what the eager kernels compute, written buffers included."""
    g = _gen(4)
    d = 3001
    slots = [torch.randn(d, generator=g).to(device, torch.float16) for _ in range(3)]
    args = [torch.randn(d, generator=g).to(device) for _ in range(3)]
    eager_args = [a.clone() for a in args]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(_step, backend=backend, fullgraph=True, dynamic=dynamic)
    got = compiled(args[0], args[1], slots, args[2])
    assert len(graphs) == 1
    for name in OPS:
        assert f"pgc_hvd.{name}" in graphs[0], (name, graphs[0])
    want = _step(eager_args[0], eager_args[1], slots, eager_args[2])
    for a, b in zip(list(got) + args, list(want) + eager_args):
        assert torch.equal(a, b)
