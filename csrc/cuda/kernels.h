// Raw CUDA launchers (no torch headers, so nvcc compiles fast). Tensor glue and checks live in
// the *_cuda.cpp files next to this header.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace pgc::cuda::kernels {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Ring buffers deeper than this are formed in several launches.
constexpr int kMaxSlotsPerLaunch = 16;

// out[i] (=|+=) sum_l coeffs[l] * slots[l][i], fp32 accumulation, c <= kMaxSlotsPerLaunch.
void coded_accumulate(float* out, const void* const* slots, const float* coeffs, int c,
                      int64_t d, DType dtype, bool accumulate, cudaStream_t stream);

}  // namespace pgc::cuda::kernels
