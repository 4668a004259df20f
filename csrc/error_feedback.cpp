// Validation and device dispatch of error-feedback compression (see error_feedback.h).
#include "error_feedback.h"

#include "common.h"

namespace pgc {

std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           at::Tensor residual, int64_t kappa,
                                                           const std::string& method,
                                                           bool index64) {
  const TopkMethod m = parse_topk_method(method);
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
  check_kappa(kappa, x.numel(), index64);
  if (x.is_cuda()) {
#ifdef PGC_HVD_WITH_CUDA
    return cuda::error_feedback_compress(x, residual, kappa, m, index64);
#else
    TORCH_CHECK(false, "pgc_hvd._C was built without CUDA; rebuild on a machine with the CUDA "
                       "toolkit (bash launch/setup.sh) or pass CPU tensors");
#endif
  }
  TORCH_CHECK_VALUE(x.device().is_cpu(), "unsupported device ", x.device());
  return cpu::error_feedback_compress(x, residual, kappa, m, index64);
}

}  // namespace pgc
