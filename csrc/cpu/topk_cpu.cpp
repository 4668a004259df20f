// CPU top-kappa compression (see topk.h and select_cpu.h): OpenMP passes over contiguous
// chunks, keys formed a block at a time in vectorisable loops.
#include <omp.h>

#include "cpu/select_cpu.h"
#include "topk.h"

namespace pgc::cpu {
namespace {

template <typename T>
std::tuple<at::Tensor, at::Tensor> run(const at::Tensor& x, int64_t kappa, TopkMethod method,
                                       bool index64) {
  const int64_t n = x.numel();
  const T* __restrict__ p = x.data_ptr<T>();
  auto load = [p](int64_t i) { return static_cast<float>(p[i]); };
  select::Candidates c =
      method == TopkMethod::kExact
          ? select::candidates_exact(n, kappa, "x", load, load)
          : select::candidates_threshold(n, kappa, "x", load, load, load);
  at::Tensor values = at::empty({kappa}, x.options());
  at::Tensor indices = at::empty({kappa}, x.options().dtype(index64 ? at::kLong : at::kInt));
  T* v = values.data_ptr<T>();
  if (index64) {
    int64_t* ix = indices.data_ptr<int64_t>();
    select::trim(c, kappa, [&](int64_t j, int64_t i) {
      ix[j] = i;
      v[j] = p[i];
    });
  } else {
    int32_t* ix = indices.data_ptr<int32_t>();
    select::trim(c, kappa, [&](int64_t j, int64_t i) {
      ix[j] = static_cast<int32_t>(i);
      v[j] = p[i];
    });
  }
  return {values, indices};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt) {
  const TopkMethod method = opt.method;
  const bool index64 = opt.index64;
  if (kappa == 0) {
    return {at::empty({0}, x.options()),
            at::empty({0}, x.options().dtype(index64 ? at::kLong : at::kInt))};
  }
  switch (x.scalar_type()) {
    case at::kFloat: return run<float>(x, kappa, method, index64);
    case at::kHalf: return run<at::Half>(x, kappa, method, index64);
    case at::kBFloat16: return run<at::BFloat16>(x, kappa, method, index64);
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", x.scalar_type());
  }
}

}  // namespace pgc::cpu
