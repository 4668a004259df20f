// Tensor glue of the CUDA coded accumulation (compiled only when CUDA is enabled; the checks
// come first, in coded_accumulate.cpp).
// Only c10/cuda headers are used: ATen/cuda/CUDAContext.h pulls in cuBLAS/cuSPARSE headers that
// a minimal CUDA toolkit lacks.
#include "coded_accumulate.h"
#include "cuda/glue.h"

namespace pgc::cuda {

void coded_accumulate(const at::Tensor& out, at::TensorList slots,
                      const std::vector<float>& coeffs, bool accumulate) {
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = current_stream();
  const auto dtype = kernel_dtype(slots[0]);
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
