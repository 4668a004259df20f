// Shared input checks for pgc_hvd._C. Every op validates its tensors here and raises a
// Python exception (ValueError/TypeError via TORCH_CHECK_* -> RuntimeError subclasses) that
// names the problem and the fix, instead of crashing or answering silently wrong.
#pragma once
#include <torch/extension.h>

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

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* wa,
                              const char* wb) {
  TORCH_CHECK_VALUE(a.device() == b.device(), wa, " is on ", a.device(), " but ", wb, " is on ",
                    b.device(), "; move them to one device");
}

}  // namespace pgc
