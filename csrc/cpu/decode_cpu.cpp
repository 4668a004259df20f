// CPU content checks and scatter-add for decode-accumulate (see decode.h). A message whose
// indices strictly increase has no repeated index, so its scatter runs in parallel; otherwise
// it runs serially, in order (repeated indices accumulate one after another).
#include <omp.h>

#include <cmath>

#include "decode.h"

namespace pgc::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 20;  // smaller scatters: one thread (cheaper than waking a team)

template <typename T>
bool finite_of(const T* p, int64_t n) {
  int bad = 0;
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(p[i]);
    bad |= static_cast<int>(!(v - v == 0.f));  // Inf - Inf and NaN - NaN are NaN
  }
  return bad == 0;
}

template <typename I>
IndexReport inspect(const I* ix, int64_t n, int64_t d) {
  int out_of_range = 0, unordered = 0;
#pragma omp parallel for reduction(| : out_of_range, unordered) schedule(static) if (n >= kParallelMin)
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = static_cast<int64_t>(ix[j]);
    out_of_range |= static_cast<int>(i < 0 || i >= d);
    if (j > 0) unordered |= static_cast<int>(static_cast<int64_t>(ix[j - 1]) >= i);
  }
  return {out_of_range == 0, unordered == 0};
}

template <typename T, typename I>
void scatter(float* __restrict__ out, const T* __restrict__ v, const I* __restrict__ ix,
             int64_t n, float w, bool increasing) {
  if (increasing) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t j = 0; j < n; ++j) out[ix[j]] += w * static_cast<float>(v[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) out[ix[j]] += w * static_cast<float>(v[j]);
  }
}

template <typename T>
void scatter_t(float* out, const T* v, const at::Tensor& indices, int64_t n, float w,
               bool increasing) {
  if (indices.scalar_type() == at::kLong)
    scatter(out, v, indices.data_ptr<int64_t>(), n, w, increasing);
  else
    scatter(out, v, indices.data_ptr<int32_t>(), n, w, increasing);
}

bool all_finite(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return finite_of(t.data_ptr<float>(), t.numel());
    case at::kHalf: return finite_of(t.data_ptr<at::Half>(), t.numel());
    case at::kBFloat16: return finite_of(t.data_ptr<at::BFloat16>(), t.numel());
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", t.scalar_type());
  }
}

IndexReport inspect_indices(const at::Tensor& indices, int64_t d) {
  if (indices.scalar_type() == at::kLong)
    return inspect(indices.data_ptr<int64_t>(), indices.numel(), d);
  return inspect(indices.data_ptr<int32_t>(), indices.numel(), d);
}

}  // namespace

ContentReport inspect_contents(at::TensorList dense, at::TensorList sparse_values,
                               at::TensorList sparse_indices, int64_t d, bool check_finite) {
  ContentReport r(sparse_values.size(), dense.size());
  for (size_t i = 0; i < sparse_values.size(); ++i) {
    if (sparse_indices[i].numel() == 0) continue;
    r.sparse_indices[i] = inspect_indices(sparse_indices[i], d);
    if (check_finite) r.sparse_finite[i] = all_finite(sparse_values[i]);
  }
  if (check_finite)
    for (size_t i = 0; i < dense.size(); ++i) r.dense_finite[i] = all_finite(dense[i]);
  return r;
}

void scatter_add(const at::Tensor& out, const at::Tensor& values, const at::Tensor& indices,
                 float w, bool increasing) {
  float* o = out.data_ptr<float>();
  const int64_t n = values.numel();
  switch (values.scalar_type()) {
    case at::kFloat: scatter_t(o, values.data_ptr<float>(), indices, n, w, increasing); break;
    case at::kHalf: scatter_t(o, values.data_ptr<at::Half>(), indices, n, w, increasing); break;
    case at::kBFloat16:
      scatter_t(o, values.data_ptr<at::BFloat16>(), indices, n, w, increasing);
      break;
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", values.scalar_type());
  }
}

}  // namespace pgc::cpu
