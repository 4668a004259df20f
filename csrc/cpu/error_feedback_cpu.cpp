// CPU error-feedback compression (see error_feedback.h): the first selection pass is fused with
// residual <- x + residual, later passes read residual; the kappa selected entries are then
// moved out of residual (values = residual[I], residual[I] = 0).
#include <omp.h>

#include "cpu/select_cpu.h"
#include "error_feedback.h"

namespace pgc::cpu {
namespace {

template <typename T>
std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& x, const at::Tensor& residual,
                                       int64_t kappa, TopkMethod method, bool index64) {
  const int64_t n = x.numel();
  const T* __restrict__ xp = x.data_ptr<T>();
  float* __restrict__ r = residual.data_ptr<float>();
  at::Tensor values = at::empty({kappa}, residual.options());
  at::Tensor indices = at::empty({kappa}, residual.options().dtype(index64 ? at::kLong : at::kInt));
  if (kappa == 0) {  // nothing is sent: everything stays in the residual
#pragma omp parallel for simd schedule(static) if (n >= select::kParallelMin)
    for (int64_t i = 0; i < n; ++i) r[i] += static_cast<float>(xp[i]);
    return {values, indices};
  }
  auto fused = [xp, r](int64_t i) {
    const float a = static_cast<float>(xp[i]) + r[i];
    r[i] = a;
    return a;
  };
  auto peek = [xp, r](int64_t i) { return static_cast<float>(xp[i]) + r[i]; };
  auto again = [r](int64_t i) { return r[i]; };
  select::Candidates c =
      method == TopkMethod::kExact
          ? select::candidates_exact(n, kappa, "x + residual", fused, again)
          : select::candidates_threshold(n, kappa, "x + residual", peek, fused, again);
  float* v = values.data_ptr<float>();
  if (index64) {
    int64_t* ix = indices.data_ptr<int64_t>();
    select::trim(c, kappa, [&](int64_t j, int64_t i) {
      ix[j] = i;
      v[j] = r[i];
      r[i] = 0.f;
    });
  } else {
    int32_t* ix = indices.data_ptr<int32_t>();
    select::trim(c, kappa, [&](int64_t j, int64_t i) {
      ix[j] = static_cast<int32_t>(i);
      v[j] = r[i];
      r[i] = 0.f;
    });
  }
  return {values, indices};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt) {
  const TopkMethod method = opt.method;
  const bool index64 = opt.index64;
  switch (x.scalar_type()) {
    case at::kFloat: return run<float>(x, residual, kappa, method, index64);
    case at::kHalf: return run<at::Half>(x, residual, kappa, method, index64);
    case at::kBFloat16: return run<at::BFloat16>(x, residual, kappa, method, index64);
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", x.scalar_type());
  }
}

}  // namespace pgc::cpu
