// Tensor glue of CUDA decode-accumulate (kernels in decode.cu). The checks block for a two-int
// read-back so that errors are raised before out is written.
#include "cuda/glue.h"
#include "decode.h"

namespace pgc::cuda {

bool all_finite(const at::Tensor& t) {
  const c10::cuda::CUDAGuard guard(t.device());
  at::Tensor flags = at::zeros({1}, t.options().dtype(at::kInt));
  kernels::check_finite(t.data_ptr(), kernel_dtype(t), t.numel(), flags.data_ptr<int>(),
                        current_stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return to_host(flags).item<int>() == 0;
}

IndexReport inspect_indices(const at::Tensor& indices, int64_t d) {
  const c10::cuda::CUDAGuard guard(indices.device());
  at::Tensor flags = at::zeros({2}, indices.options().dtype(at::kInt));
  kernels::check_indices(indices.data_ptr(), indices.scalar_type() == at::kLong, indices.numel(),
                         d, flags.data_ptr<int>(), current_stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor h = to_host(flags);
  return {h[0].item<int>() == 0, h[1].item<int>() == 0};
}

void scatter_add(at::Tensor& out, const at::Tensor& values, const at::Tensor& indices, float w,
                 bool /*increasing: atomics handle both*/) {
  const c10::cuda::CUDAGuard guard(out.device());
  kernels::scatter_add(out.data_ptr<float>(), values.data_ptr(), kernel_dtype(values),
                       indices.data_ptr(), indices.scalar_type() == at::kLong, values.numel(), w,
                       current_stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pgc::cuda
