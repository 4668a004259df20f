// The CUDA radix select behind top-kappa (topk_cuda.cpp), shared with error feedback
// (error_feedback_cuda.cpp), which selects from its residual.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "cuda/kernels.h"
#include "topk.h"

namespace pgc::cuda {

// n elements of dtype dt at v; idx (optional, int64) maps them to positions in the original
// buffer (candidates), else position = element number.
struct Source {
  const void* v;
  kernels::DType dt;
  const int64_t* idx;
  int64_t n;
};

// Top-kappa (1 <= kappa <= src.n) of src into (out_v, out_i), indices ascending, by the driver
// opt names (opt.host_walk, opt.compact; see topk_cuda.cpp); like gives the values' dtype and
// device. Inf/NaN in src raise ValueError naming `what`.
void select_topk(const Source& src, const at::Tensor& like, int64_t kappa,
                 const TopkOptions& opt, const char* what, void* out_v, void* out_i);

}  // namespace pgc::cuda
