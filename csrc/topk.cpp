// Checks of top-kappa compression, shared by every device (see topk.h).
#include "topk.h"

#include <limits>

#include "common.h"

namespace pgc {

TopkOptions topk_options(c10::string_view method, bool index64, c10::string_view walk,
                         bool compact) {
  TopkOptions o;
  if (method == "exact") {
    o.method = TopkMethod::kExact;
  } else {
    TORCH_CHECK_VALUE(method == "threshold", "method must be \"exact\" or \"threshold\", got \"",
                      method, "\"");
    o.method = TopkMethod::kThreshold;
  }
  TORCH_CHECK_VALUE(walk == "device" || walk == "host",
                    "walk must be \"device\" (the default) or \"host\", got \"", walk,
                    "\" (pgc_hvd.ops reads it from PGC_HVD_CUDA_TOPK_WALK)");
  o.index64 = index64;
  o.host_walk = walk == "host";
  o.compact = compact;
  return o;
}

void check_kappa(int64_t kappa, int64_t d, bool index64) {
  TORCH_CHECK_VALUE(kappa >= 0 && kappa <= d, "k must lie in [0, d] = [0, ", d, "], got ", kappa,
                    kappa > d ? " (k > d: the buffer has fewer elements than k)" : "");
  TORCH_CHECK_VALUE(index64 || d <= std::numeric_limits<int32_t>::max(), "d = ", d,
                    " does not fit int32 indices; use index_dtype=torch.int64");
}

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt, TopkKernel kernel) {
  check_flat(x, "x");
  TORCH_CHECK_TYPE(is_float_like(x.scalar_type()), "x must be float32, float16 or bfloat16, got ",
                   x.scalar_type());
  check_kappa(kappa, x.numel(), opt.index64);
  return kernel(x, kappa, opt);
}

}  // namespace pgc
