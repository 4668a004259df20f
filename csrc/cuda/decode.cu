// CUDA kernels of decode-accumulate: content checks (finite values, index range and order) and
// the weighted scatter-add (atomicAdd, so repeated indices accumulate; messages are applied one
// launch after another on one stream, so different messages never race).
#include "device_utils.cuh"
#include "kernels.h"

namespace pgc::cuda::kernels {
namespace {

using detail::to_f32;

template <typename T>
__global__ void __launch_bounds__(256) check_finite_kernel(const T* __restrict__ v, int64_t n, int* flags) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += gs)
    bad = bad || !isfinite(to_f32(v[i]));
  if (bad) atomicOr(flags, 1);
}

template <typename I>
__global__ void __launch_bounds__(256) check_indices_kernel(const I* __restrict__ idx, int64_t n, int64_t d,
                                     int* flags) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool out = false, unordered = false;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += gs) {
    const int64_t i = static_cast<int64_t>(idx[j]);
    out = out || i < 0 || i >= d;
    unordered = unordered || (j > 0 && static_cast<int64_t>(idx[j - 1]) >= i);
  }
  if (out) atomicOr(flags, 1);
  if (unordered) atomicOr(flags + 1, 1);
}

template <typename T, typename I>
__global__ void __launch_bounds__(256) scatter_add_kernel(float* __restrict__ out, const T* __restrict__ v,
                                   const I* __restrict__ idx, int64_t n, float w) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += gs)
    atomicAdd(out + static_cast<int64_t>(idx[j]), w * to_f32(v[j]));
}

}  // namespace

void check_finite(const void* v, DType dt, int64_t n, int* flags, cudaStream_t stream) {
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks(n, 256);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    check_finite_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(v), n, flags);
  });
}

void check_indices(const void* idx, bool index64, int64_t n, int64_t d, int* flags,
                   cudaStream_t stream) {
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks(n, 256);
  if (index64)
    check_indices_kernel<int64_t><<<grid, 256, 0, stream>>>(static_cast<const int64_t*>(idx), n,
                                                            d, flags);
  else
    check_indices_kernel<int32_t><<<grid, 256, 0, stream>>>(static_cast<const int32_t*>(idx), n,
                                                            d, flags);
}

void scatter_add(float* out, const void* v, DType dt, const void* idx, bool index64, int64_t n,
                 float w, cudaStream_t stream) {
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks(n, 256);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if (index64)
      scatter_add_kernel<T, int64_t><<<grid, 256, 0, stream>>>(
          out, static_cast<const T*>(v), static_cast<const int64_t*>(idx), n, w);
    else
      scatter_add_kernel<T, int32_t><<<grid, 256, 0, stream>>>(
          out, static_cast<const T*>(v), static_cast<const int32_t*>(idx), n, w);
  });
}

}  // namespace pgc::cuda::kernels
