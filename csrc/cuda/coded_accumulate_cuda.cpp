// Tensor glue for the CUDA coded accumulation (compiled only when CUDA is enabled).
// Only c10/cuda headers are used: ATen/cuda/CUDAContext.h pulls in cuBLAS/cuSPARSE headers that
// a minimal CUDA toolkit lacks.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "coded_accumulate.h"
#include "cuda/kernels.h"

namespace pgc::cuda {

static kernels::DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::DType::kFloat32;
    case at::kHalf: return kernels::DType::kFloat16;
    case at::kBFloat16: return kernels::DType::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "unsupported slot dtype ", t.scalar_type());
  }
}

void coded_accumulate(at::Tensor& out, const std::vector<at::Tensor>& slots,
                      const std::vector<float>& coeffs, bool accumulate) {
  const c10::cuda::CUDAGuard guard(out.device());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto dtype = dtype_of(slots[0]);
  const int c = static_cast<int>(slots.size());
  for (int lo = 0; lo < c; lo += kernels::kMaxSlotsPerLaunch) {
    const int n = std::min(kernels::kMaxSlotsPerLaunch, c - lo);
    const void* ptrs[kernels::kMaxSlotsPerLaunch];
    for (int l = 0; l < n; ++l) ptrs[l] = slots[lo + l].data_ptr();
    kernels::coded_accumulate(out.data_ptr<float>(), ptrs, coeffs.data() + lo, n, out.numel(),
                              dtype, accumulate || lo > 0, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pgc::cuda
