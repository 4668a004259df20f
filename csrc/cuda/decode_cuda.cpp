// Tensor glue of CUDA decode-accumulate (kernels in decode.cu). All content checks of one
// decode are queued first and read back together (one blocking read of 3 ints per sparse and
// 1 per dense message), so that errors are raised before out is written.
#include "cuda/glue.h"
#include "decode.h"

namespace pgc::cuda {

ContentReport inspect_contents(at::TensorList dense, at::TensorList sparse_values,
                               at::TensorList sparse_indices, int64_t d, bool check_finite) {
  const size_t ns = sparse_values.size(), nd = dense.size();
  ContentReport r(ns, nd);
  if (ns + nd == 0 || (!check_finite && ns == 0)) return r;
  const at::Tensor& any = ns > 0 ? sparse_values[0] : dense[0];
  const c10::cuda::CUDAGuard guard(any.device());
  const auto stream = current_stream();
  // flags[3i]: index out of range, [3i+1]: indices not increasing, [3i+2]: non-finite value of
  // sparse message i; flags[3 ns + j]: non-finite value of dense message j.
  at::Tensor flags = at::zeros({static_cast<int64_t>(3 * ns + nd)}, any.options().dtype(at::kInt));
  int* f = flags.data_ptr<int>();
  for (size_t i = 0; i < ns; ++i) {
    const at::Tensor& ix = sparse_indices[i];
    if (ix.numel() == 0) continue;
    kernels::check_indices(ix.data_ptr(), ix.scalar_type() == at::kLong, ix.numel(), d, f + 3 * i,
                           stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (check_finite) {
      const at::Tensor& v = sparse_values[i];
      kernels::check_finite(v.data_ptr(), kernel_dtype(v), v.numel(), f + 3 * i + 2, stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  if (check_finite) {
    for (size_t j = 0; j < nd; ++j) {
      kernels::check_finite(dense[j].data_ptr(), kernel_dtype(dense[j]), dense[j].numel(),
                            f + 3 * ns + j, stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  const at::Tensor h = to_host(flags);
  const int* hf = h.data_ptr<int>();
  for (size_t i = 0; i < ns; ++i) {
    r.sparse_indices[i] = {hf[3 * i] == 0, hf[3 * i + 1] == 0};
    r.sparse_finite[i] = hf[3 * i + 2] == 0;
  }
  for (size_t j = 0; j < nd; ++j) r.dense_finite[j] = hf[3 * ns + j] == 0;
  return r;
}

void scatter_add(const at::Tensor& out, const at::Tensor& values, const at::Tensor& indices,
                 float w, bool /*increasing: atomics handle both*/) {
  const c10::cuda::CUDAGuard guard(out.device());
  kernels::scatter_add(out.data_ptr<float>(), values.data_ptr(), kernel_dtype(values),
                       indices.data_ptr(), indices.scalar_type() == at::kLong, values.numel(), w,
                       current_stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pgc::cuda
