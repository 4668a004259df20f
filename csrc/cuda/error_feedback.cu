// CUDA kernels of error-feedback compression (launchers declared in kernels.h): the residual
// update before top-kappa's selection (add_into) and the move of the selected entries out of the
// residual after it (take_and_zero). The selection itself is topk.cu's.
#include "device_utils.cuh"
#include "kernels.h"

namespace pgc::cuda::kernels {
namespace {

using detail::to_f32;

template <typename T>
__global__ void __launch_bounds__(256)
    add_into_kernel(float* __restrict__ r, const T* __restrict__ x, int64_t n) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += gs)
    r[i] += to_f32(x[i]);
}

template <typename I>
__global__ void __launch_bounds__(256)
    take_and_zero_kernel(float* __restrict__ r, const I* __restrict__ idx, int64_t k,
                         float* __restrict__ out_v) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += gs) {
    const int64_t i = static_cast<int64_t>(idx[j]);
    out_v[j] = r[i];
    r[i] = 0.f;
  }
}

}  // namespace

void add_into(float* r, const void* x, DType dt, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks(n, 256);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    add_into_kernel<T><<<grid, 256, 0, stream>>>(r, static_cast<const T*>(x), n);
  });
}

void take_and_zero(float* r, const void* idx, bool index64, int64_t k, float* out_v,
                   cudaStream_t stream) {
  if (k == 0) return;
  const int grid = detail::grid_stride_blocks(k, 256);
  if (index64)
    take_and_zero_kernel<int64_t><<<grid, 256, 0, stream>>>(
        r, static_cast<const int64_t*>(idx), k, out_v);
  else
    take_and_zero_kernel<int32_t><<<grid, 256, 0, stream>>>(
        r, static_cast<const int32_t*>(idx), k, out_v);
}

}  // namespace pgc::cuda::kernels
