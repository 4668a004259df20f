// Error-feedback compression (the op pgc_hvd::error_feedback_compress: memory of what top-kappa
// dropped), fused with top-kappa:
//   a        = x + residual                      (fp32; x may be fp32, fp16 or bf16)
//   (v, I)   = topk(a, kappa, method)             (as in topk.h; v = a[I])
//   residual = a - decompress(v, I)               (a with the entries I set to zero)
// so v and residual together hold exactly x + old residual ("nothing lost"). x is read once:
// the first pass forms a, stores it in residual and feeds it to the selection's first pass.
// Inf or NaN in x + residual raise ValueError after residual already holds x + residual (nothing
// is sent; zero or sanitise the residual before the next step).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "topk.h"

namespace pgc {

// One device's kernel: x and residual already checked; residual is updated in place.
using ErrorFeedbackKernel = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor& x,
                                                                   const at::Tensor& residual,
                                                                   int64_t kappa,
                                                                   const TopkOptions& opt);

// The op on one device: every check, then `kernel`.
std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt,
                                                           ErrorFeedbackKernel kernel);

namespace cpu {
std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt);
}

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt);
}
#endif

}  // namespace pgc
