// Validation and device dispatch of top-kappa compression (see topk.h).
#include "topk.h"

#include <limits>

#include "common.h"

namespace pgc {

TopkMethod parse_topk_method(const std::string& method) {
  if (method == "exact") return TopkMethod::kExact;
  if (method == "threshold") return TopkMethod::kThreshold;
  TORCH_CHECK_VALUE(false, "method must be \"exact\" or \"threshold\", got \"", method, "\"");
}

void check_kappa(int64_t kappa, int64_t d, bool index64) {
  TORCH_CHECK_VALUE(kappa >= 0 && kappa <= d, "k must lie in [0, d] = [0, ", d, "], got ", kappa,
                    kappa > d ? " (k > d: the buffer has fewer elements than k)" : "");
  TORCH_CHECK_VALUE(index64 || d <= std::numeric_limits<int32_t>::max(), "d = ", d,
                    " does not fit int32 indices; use index_dtype=torch.int64");
}

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const std::string& method, bool index64) {
  const TopkMethod m = parse_topk_method(method);
  check_flat(x, "x");
  TORCH_CHECK_TYPE(is_float_like(x.scalar_type()), "x must be float32, float16 or bfloat16, got ",
                   x.scalar_type());
  check_kappa(kappa, x.numel(), index64);
  if (x.is_cuda()) {
#ifdef PGC_HVD_WITH_CUDA
    return cuda::topk_compress(x, kappa, m, index64);
#else
    TORCH_CHECK(false, "pgc_hvd._C was built without CUDA; rebuild on a machine with the CUDA "
                       "toolkit (bash launch/setup.sh) or pass CPU tensors");
#endif
  }
  TORCH_CHECK_VALUE(x.device().is_cpu(), "unsupported device ", x.device());
  return cpu::topk_compress(x, kappa, m, index64);
}

}  // namespace pgc
