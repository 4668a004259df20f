// Top-kappa compression by magnitude (see pgc_hvd/ops/compress.py for the maths):
//   exact:     the kappa entries of largest |x_i|, ties broken lowest index first, found by radix
//              select (a digit-0 histogram pass, a compaction pass, then radix select among the
//              few candidates), never a sort of x;
//   threshold: a threshold estimated from a strided sample of |x|, one compare-and-compact pass,
//              then trimmed to exactly kappa by the same radix select among the candidates (or
//              topped up by lowering the threshold when the candidates are fewer than kappa).
// Both return (values, indices) with indices ascending; values = x[indices] in x's dtype.
// Inf or NaN in x raise ValueError (kappa = 0 returns at once and inspects nothing).
#pragma once
#include <torch/extension.h>

#include <string>
#include <tuple>

namespace pgc {

enum class TopkMethod { kExact, kThreshold };

TopkMethod parse_topk_method(const std::string& method);

// Checks kappa against d, the dtypes and the index width; shared with error feedback.
void check_kappa(int64_t kappa, int64_t d, bool index64);

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const std::string& method, bool index64);

namespace cpu {
std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 TopkMethod method, bool index64);
}

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 TopkMethod method, bool index64);
}
#endif

}  // namespace pgc
