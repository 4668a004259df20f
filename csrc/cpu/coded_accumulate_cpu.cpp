// CPU coded accumulation: OpenMP over cache-sized blocks; inside a block, each slot is streamed
// once with a loop the compiler vectorises (fp16/bf16 are widened to fp32 on load).
// Memory traffic: c slot reads + 1 write of out (+1 read when accumulate), the bandwidth floor.
#include <omp.h>

#include "coded_accumulate.h"

namespace pgc::cpu {
namespace {

constexpr int64_t kBlock = 4096;  // 16 KiB of fp32 output: stays in L1 across the c slots

template <typename T>
void accumulate_blocks(float* __restrict__ out, const std::vector<const T*>& slots,
                       const std::vector<float>& coeffs, int64_t d, bool accumulate) {
  const int64_t nblocks = (d + kBlock - 1) / kBlock;
  const int c = static_cast<int>(slots.size());
#pragma omp parallel for schedule(static) if (d > 65536)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t lo = b * kBlock;
    const int64_t n = std::min(kBlock, d - lo);
    float* __restrict__ o = out + lo;
    {
      const T* __restrict__ s = slots[0] + lo;
      const float a = coeffs[0];
      if (accumulate) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] += a * static_cast<float>(s[i]);
      } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] = a * static_cast<float>(s[i]);
      }
    }
    for (int l = 1; l < c; ++l) {
      const T* __restrict__ s = slots[l] + lo;
      const float a = coeffs[l];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] += a * static_cast<float>(s[i]);
    }
  }
}

template <typename T>
void run(const at::Tensor& out, at::TensorList slots, const std::vector<float>& coeffs,
         bool accumulate) {
  std::vector<const T*> ptrs;
  ptrs.reserve(slots.size());
  for (const auto& s : slots) ptrs.push_back(s.data_ptr<T>());
  accumulate_blocks<T>(out.data_ptr<float>(), ptrs, coeffs, out.numel(), accumulate);
}

}  // namespace

void coded_accumulate(const at::Tensor& out, at::TensorList slots,
                      const std::vector<float>& coeffs, bool accumulate) {
  switch (slots[0].scalar_type()) {
    case at::kFloat: run<float>(out, slots, coeffs, accumulate); break;
    case at::kHalf: run<at::Half>(out, slots, coeffs, accumulate); break;
    case at::kBFloat16: run<at::BFloat16>(out, slots, coeffs, accumulate); break;
    default: TORCH_CHECK_TYPE(false, "unsupported slot dtype ", slots[0].scalar_type());
  }
}

}  // namespace pgc::cpu
