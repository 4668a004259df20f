// Helpers shared by the CUDA tensor glue (.cpp files): dtype mapping, the current stream, and
// a blocking device-to-host read of a few counters. c10/cuda headers only (see
// coded_accumulate_cuda.cpp).
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"

namespace pgc::cuda {

inline kernels::DType kernel_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::DType::kFloat32;
    case at::kHalf: return kernels::DType::kFloat16;
    case at::kBFloat16: return kernels::DType::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", t.scalar_type());
  }
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Copies t (a small device tensor) to the host; blocks until the current stream reaches it.
inline at::Tensor to_host(const at::Tensor& t) { return t.to(at::kCPU); }

}  // namespace pgc::cuda
