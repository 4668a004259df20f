// CUDA coded accumulation: one grid-stride pass; every thread reads its elements of each of the
// c slots once and writes out once (128-bit loads/stores on the fp32 path when aligned).
#include "device_utils.cuh"

namespace pgc::cuda::kernels {
namespace {

struct SlotTable {
  const void* ptr[kMaxSlotsPerLaunch];
  float coef[kMaxSlotsPerLaunch];
};

using detail::grid_stride_blocks;
using detail::to_f32;

template <typename T>
__global__ void __launch_bounds__(256) coded_accumulate_scalar(float* __restrict__ out, SlotTable t, int c, int64_t d,
                                        bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < d;
       i += stride) {
    float acc = accumulate ? out[i] : 0.f;
#pragma unroll 4
    for (int l = 0; l < c; ++l) acc += t.coef[l] * to_f32(static_cast<const T*>(t.ptr[l])[i]);
    out[i] = acc;
  }
}

__global__ void __launch_bounds__(256) coded_accumulate_f32x4(float4* __restrict__ out, SlotTable t, int c, int64_t d4,
                                       bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < d4;
       i += stride) {
    float4 acc = accumulate ? out[i] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int l = 0; l < c; ++l) {
      const float4 v = __ldg(static_cast<const float4*>(t.ptr[l]) + i);
      const float a = t.coef[l];
      acc.x += a * v.x;
      acc.y += a * v.y;
      acc.z += a * v.z;
      acc.w += a * v.w;
    }
    out[i] = acc;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void coded_accumulate(float* out, const void* const* slots, const float* coeffs, int c,
                      int64_t d, DType dtype, bool accumulate, cudaStream_t stream) {
  SlotTable t{};
  bool all_aligned = aligned16(out);
  for (int l = 0; l < c; ++l) {
    t.ptr[l] = slots[l];
    t.coef[l] = coeffs[l];
    all_aligned = all_aligned && aligned16(slots[l]);
  }
  constexpr int kThreads = 256;
  if (dtype == DType::kFloat32 && all_aligned && d % 4 == 0) {
    const int64_t d4 = d / 4;
    coded_accumulate_f32x4<<<grid_stride_blocks(d4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(out), t, c, d4, accumulate);
    return;
  }
  const int grid = grid_stride_blocks(d, kThreads);
  switch (dtype) {
    case DType::kFloat32:
      coded_accumulate_scalar<float><<<grid, kThreads, 0, stream>>>(out, t, c, d, accumulate);
      break;
    case DType::kFloat16:
      coded_accumulate_scalar<__half><<<grid, kThreads, 0, stream>>>(out, t, c, d, accumulate);
      break;
    case DType::kBFloat16:
      coded_accumulate_scalar<__nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(out, t, c, d, accumulate);
      break;
  }
}

}  // namespace pgc::cuda::kernels
