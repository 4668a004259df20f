// Shared input checks of the ops of pgc_hvd._C. Every op validates its tensors here, on every
// device, and raises a Python exception (TORCH_CHECK_VALUE -> ValueError, TORCH_CHECK_TYPE ->
// TypeError, through the dispatcher) that names the problem and the fix, instead of crashing or
// answering silently wrong.
#pragma once
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <cmath>
#include <limits>
#include <string>

namespace pgc {

inline bool is_float_like(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline void check_flat(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), what, " is undefined (None)");
  TORCH_CHECK_VALUE(t.is_contiguous(), what,
                    " must be contiguous; call .contiguous() (ring slots are flat buffers)");
  TORCH_CHECK_VALUE(t.dim() == 1, what, " must be a flat 1-D buffer, got shape ", t.sizes(),
                    "; pass t.view(-1)");
}

// A coefficient or weight the kernels can use: finite, and finite once rounded to float32 (the
// kernels accumulate in fp32; 1e300 would become Inf there).
inline bool finite_in_float32(double v) {
  return std::isfinite(v) && std::fabs(v) <= static_cast<double>(std::numeric_limits<float>::max());
}

// Whether a and b share memory (the whole buffer or a part of it, e.g. a view of the other).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto st = at::get_overlap_status(a, b);
  return st == at::MemOverlapStatus::Full || st == at::MemOverlapStatus::Partial;
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* wa,
                              const char* wb) {
  TORCH_CHECK_VALUE(a.device() == b.device(), wa, " is on ", a.device(), " but ", wb, " is on ",
                    b.device(), "; move them to one device");
}

// The error of a CUDA tensor in a build without the CUDA kernels: library.cpp then registers,
// for the CUDA dispatch key, kernels that raise it once the op's checks have passed.
[[noreturn]] inline void no_cuda_kernels() {
  TORCH_CHECK(false, "pgc_hvd._C was built without CUDA; rebuild on a machine with the CUDA "
                     "toolkit (bash launch/setup.sh) or pass CPU tensors");
  __builtin_unreachable();
}

}  // namespace pgc
