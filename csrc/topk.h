// Top-kappa compression by magnitude (the op pgc_hvd::topk_compress; see pgc_hvd/ops/compress.py
// for the maths):
//   exact:     the kappa entries of largest |x_i|, ties broken lowest index first, found by radix
//              select (a digit-0 histogram pass, a compaction pass, then radix select among the
//              few candidates), never a sort of x;
//   threshold: a threshold estimated from a strided sample of |x|, one compare-and-compact pass,
//              then trimmed to exactly kappa by the same radix select among the candidates (or
//              topped up by lowering the threshold when the candidates are fewer than kappa).
// Both return (values, indices) with indices ascending; values = x[indices] in x's dtype.
// Inf or NaN in x raise ValueError (kappa = 0 returns at once and inspects nothing).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

namespace pgc {

enum class TopkMethod { kExact, kThreshold };

// The op's selection arguments, checked. walk and compact choose how the CUDA kernels run the
// radix select (cuda/topk_cuda.cpp; every choice gives the same result); the CPU kernels have
// one way and only check them. pgc_hvd.ops reads their defaults from the environment once
// (PGC_HVD_CUDA_TOPK_WALK, PGC_HVD_CUDA_TOPK_COMPACT).
struct TopkOptions {
  TopkMethod method = TopkMethod::kExact;
  bool index64 = true;     // int64 indices (else int32)
  bool host_walk = false;  // walk = "host": the host-driven radix walk (else "device")
  bool compact = true;     // the device walk's exact path compacts the candidates
};

// Parses method ("exact" | "threshold") and walk ("device" | "host"); ValueError otherwise.
TopkOptions topk_options(c10::string_view method, bool index64, c10::string_view walk,
                         bool compact);

// Checks kappa against d and the index width; shared with error feedback.
void check_kappa(int64_t kappa, int64_t d, bool index64);

// One device's kernel: x already checked.
using TopkKernel = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor& x, int64_t kappa,
                                                          const TopkOptions& opt);

// The op on one device: every check, then `kernel`.
std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt, TopkKernel kernel);

namespace cpu {
std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt);
}

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt);
}
#endif

}  // namespace pgc
