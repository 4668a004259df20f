// The CUDA kernels of the torch library pgc_hvd (schemas and CPU kernels in library.cpp).
#include <torch/library.h>

#include "ops.h"

namespace pgc {
namespace {

constexpr DeviceKernels kCuda{
    &cuda::coded_accumulate,
    &cuda::topk_compress,
    &cuda::error_feedback_compress,
    {&cuda::inspect_contents, &cuda::coded_accumulate, &cuda::scatter_add},
};

}  // namespace
}  // namespace pgc

TORCH_LIBRARY_IMPL(pgc_hvd, CUDA, m) { pgc::impl_ops<pgc::kCuda>(m); }
