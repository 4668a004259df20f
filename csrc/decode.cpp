// Checks and order of decode-accumulate, shared by every device (see decode.h).
#include "decode.h"

#include <cmath>

#include "common.h"

namespace pgc {
namespace {

void check_weight(double w, const char* kind, size_t i) {
  TORCH_CHECK_VALUE(finite_in_float32(w), "the weight of ", kind, " message ", i, " is ", w,
                    "; decode weights must be finite in float32 (|a_I| <= 3.4e38)");
}

}  // namespace

void decode_accumulate(const at::Tensor& out, at::TensorList dense,
                       at::ArrayRef<double> dense_weights, at::TensorList sparse_values,
                       at::TensorList sparse_indices, at::ArrayRef<double> sparse_weights,
                       bool accumulate, bool check_finite, const DecodeKernels& kernels) {
  check_flat(out, "out");
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32 (the accumulator), got ",
                   out.scalar_type());
  TORCH_CHECK_VALUE(dense.size() == dense_weights.size() &&
                        sparse_values.size() == sparse_indices.size() &&
                        sparse_values.size() == sparse_weights.size(),
                    "pass one weight per message");
  const int64_t d = out.numel();
  for (size_t i = 0; i < dense.size(); ++i) {
    const auto& m = dense[i];
    check_flat(m, "every dense message");
    check_same_device(m, out, "a dense message", "out");
    TORCH_CHECK_TYPE(is_float_like(m.scalar_type()),
                     "dense messages must be float32, float16 or bfloat16, got ", m.scalar_type());
    TORCH_CHECK_VALUE(m.numel() == d, "dense message ", i, " has ", m.numel(),
                      " elements but out has ", d);
    TORCH_CHECK_VALUE(!overlaps(m, out), "dense message ", i,
                      " shares memory with out; decode into a separate buffer");
    check_weight(dense_weights[i], "dense", i);
  }
  for (size_t i = 0; i < sparse_values.size(); ++i) {
    const auto& v = sparse_values[i];
    const auto& ix = sparse_indices[i];
    check_flat(v, "sparse message values");
    check_flat(ix, "sparse message indices");
    check_same_device(v, out, "sparse message values", "out");
    check_same_device(ix, out, "sparse message indices", "out");
    TORCH_CHECK_TYPE(is_float_like(v.scalar_type()),
                     "sparse message values must be float32, float16 or bfloat16, got ",
                     v.scalar_type());
    TORCH_CHECK_TYPE(ix.scalar_type() == at::kLong || ix.scalar_type() == at::kInt,
                     "sparse message indices must be int64 or int32, got ", ix.scalar_type());
    TORCH_CHECK_VALUE(v.numel() == ix.numel(), "sparse message ", i, " has ", v.numel(),
                      " values but ", ix.numel(), " indices");
    check_weight(sparse_weights[i], "sparse", i);
  }
  // Content checks: all of them before out is touched.
  const ContentReport report =
      kernels.inspect_contents(dense, sparse_values, sparse_indices, d, check_finite);
  for (size_t i = 0; i < sparse_values.size(); ++i) {
    TORCH_CHECK_VALUE(report.sparse_indices[i].in_range, "sparse message ", i,
                      " has indices outside [0, d) = [0, ", d, ")");
    TORCH_CHECK_VALUE(report.sparse_finite[i], "sparse message ", i,
                      " has Inf or NaN values; drop it (treat the sender as a straggler) or "
                      "pass check_finite=False to let them propagate");
  }
  for (size_t i = 0; i < dense.size(); ++i)
    TORCH_CHECK_VALUE(report.dense_finite[i], "dense message ", i,
                      " has Inf or NaN values; drop it (treat the sender as a straggler) or "
                      "pass check_finite=False to let them propagate");

  // Dense messages: one coded-accumulation pass per dtype present (usually one).
  bool acc = accumulate;
  for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16}) {
    std::vector<at::Tensor> group;
    std::vector<double> w;
    for (size_t i = 0; i < dense.size(); ++i)
      if (dense[i].scalar_type() == dt) {
        group.push_back(dense[i]);
        w.push_back(dense_weights[i]);
      }
    if (group.empty()) continue;
    coded_accumulate(out, group, w, acc, kernels.coded_accumulate);
    acc = true;
  }
  if (!acc) out.zero_();
  for (size_t i = 0; i < sparse_values.size(); ++i) {
    if (sparse_values[i].numel() == 0) continue;
    kernels.scatter_add(out, sparse_values[i], sparse_indices[i],
                        static_cast<float>(sparse_weights[i]), report.sparse_indices[i].increasing);
  }
}

}  // namespace pgc
