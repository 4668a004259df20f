// The torch library pgc_hvd: the schemas of its four ops, their CPU kernels and, in a build
// without CUDA, a CUDA entry that says how to rebuild. The CUDA kernels are registered in
// cuda/library_cuda.cpp; the fake (meta) kernels that torch.compile traces with are registered
// in Python (pgc_hvd/ops/_fake.py). pgc_hvd.ops documents every op and calls it as
// torch.ops.pgc_hvd.<name>.
//
// Each op mutates only what its schema marks (a!): coded_accumulate and decode_accumulate write
// out and return nothing (an op that returns an alias of its input does not functionalise);
// error_feedback_compress updates residual and returns new (values, indices).
// walk and compact choose how the CUDA radix select runs (topk.h); every choice selects the
// same entries, and pgc_hvd.ops reads their defaults from the environment once.
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

#include "common.h"
#include "ops.h"

namespace pgc {
namespace {

constexpr DeviceKernels kCpu{
    &cpu::coded_accumulate,
    &cpu::topk_compress,
    &cpu::error_feedback_compress,
    {&cpu::inspect_contents, &cpu::coded_accumulate, &cpu::scatter_add},
};

#ifndef PGC_HVD_WITH_CUDA
// A CUDA tensor in a build without the CUDA kernels: the op's checks still run first (so a
// mix of devices gets its own message), then these raise.
void no_cuda_coded(const at::Tensor&, at::TensorList, const std::vector<float>&, bool) {
  no_cuda_kernels();
}
std::tuple<at::Tensor, at::Tensor> no_cuda_topk(const at::Tensor&, int64_t, const TopkOptions&) {
  no_cuda_kernels();
}
std::tuple<at::Tensor, at::Tensor> no_cuda_error_feedback(const at::Tensor&, const at::Tensor&,
                                                          int64_t, const TopkOptions&) {
  no_cuda_kernels();
}
ContentReport no_cuda_inspect(at::TensorList, at::TensorList, at::TensorList, int64_t, bool) {
  no_cuda_kernels();
}
void no_cuda_scatter(const at::Tensor&, const at::Tensor&, const at::Tensor&, float, bool) {
  no_cuda_kernels();
}

constexpr DeviceKernels kNoCuda{
    &no_cuda_coded,
    &no_cuda_topk,
    &no_cuda_error_feedback,
    {&no_cuda_inspect, &no_cuda_coded, &no_cuda_scatter},
};
#endif

}  // namespace
}  // namespace pgc

TORCH_LIBRARY(pgc_hvd, m) {
  // opcheck (tests/ops/test_opcheck.py) verifies what pt2_compliant_tag promises: the schema's
  // mutations, the fake kernels, and tracing under torch.compile. (The tags go as a braced list:
  // a named vector would pick the def(schema, function) overload.)
  m.def("coded_accumulate(Tensor(a!) out, Tensor[] slots, float[] coeffs, "
        "bool accumulate=False) -> ()",
        {at::Tag::pt2_compliant_tag});
  m.def("topk_compress(Tensor x, int k, str method=\"exact\", bool index64=True, "
        "str walk=\"device\", bool compact=True) -> (Tensor values, Tensor indices)",
        {at::Tag::pt2_compliant_tag});
  m.def("error_feedback_compress(Tensor x, Tensor(a!) residual, int k, str method=\"exact\", "
        "bool index64=True, str walk=\"device\", bool compact=True) "
        "-> (Tensor values, Tensor indices)",
        {at::Tag::pt2_compliant_tag});
  m.def("decode_accumulate(Tensor(a!) out, Tensor[] dense, float[] dense_weights, "
        "Tensor[] sparse_values, Tensor[] sparse_indices, float[] sparse_weights, "
        "bool accumulate=True, bool check_finite=True) -> ()",
        {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(pgc_hvd, CPU, m) { pgc::impl_ops<pgc::kCpu>(m); }

#ifndef PGC_HVD_WITH_CUDA
TORCH_LIBRARY_IMPL(pgc_hvd, CUDA, m) { pgc::impl_ops<pgc::kNoCuda>(m); }
#endif
