// Small device helpers shared by the .cu files of the top-kappa, error-feedback and decode
// kernels (no torch headers here).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.h"

namespace pgc::cuda::kernels::detail {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// The radix key of radix.h: bits of |float(x)| as an unsigned integer (31 bits).
template <typename T>
__device__ __forceinline__ unsigned key_of(T x) {
  return __float_as_uint(to_f32(x)) & 0x7fffffffu;
}

// splitmix64 finaliser, identical to pgc::radix::mix on the host.
__device__ __forceinline__ unsigned long long mix(unsigned long long j) {
  j += 0x9e3779b97f4a7c15ull;
  j = (j ^ (j >> 30)) * 0xbf58476d1ce4e5b9ull;
  j = (j ^ (j >> 27)) * 0x94d049bb133111ebull;
  return j ^ (j >> 31);
}

// Calls f(T{}) with the element type named by dt.
template <class F>
void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kFloat32: f(float{}); break;
    case DType::kFloat16: f(__half{}); break;
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
  }
}

// A grid of at most 4 resident blocks per SM for grid-stride loops over `work` items.
inline int grid_stride_blocks(int64_t work, int threads) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms > 0 ? sms : 80) * 4;
  return static_cast<int>(want < 1 ? 1 : (want < cap ? want : cap));
}

}  // namespace pgc::cuda::kernels::detail
