// Checks of error-feedback compression, shared by every device (see error_feedback.h).
#include "error_feedback.h"

#include "common.h"

namespace pgc {

std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt,
                                                           ErrorFeedbackKernel kernel) {
  check_flat(x, "x");
  check_flat(residual, "residual");
  check_same_device(x, residual, "x", "residual");
  TORCH_CHECK_TYPE(is_float_like(x.scalar_type()), "x must be float32, float16 or bfloat16, got ",
                   x.scalar_type());
  TORCH_CHECK_TYPE(residual.scalar_type() == at::kFloat,
                   "residual must be float32 (the error accumulator), got ",
                   residual.scalar_type());
  TORCH_CHECK_VALUE(x.numel() == residual.numel(), "x has ", x.numel(),
                    " elements but residual has ", residual.numel());
  TORCH_CHECK_VALUE(!overlaps(residual, x),
                    "residual shares memory with x; keep the residual in its own buffer");
  check_kappa(kappa, x.numel(), opt.index64);
  return kernel(x, residual, kappa, opt);
}

}  // namespace pgc
