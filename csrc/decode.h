// Decode-accumulate (the op pgc_hvd::decode_accumulate): add the weighted coded messages of one
// step into one buffer, in place,
//   out (+)= sum_I a_I m_I,
// where a dense message m_I is a flat buffer of d elements and a sparse one is (values, indices)
// standing for the d-vector with m[indices[j]] += values[j] (scatter-add: repeated indices, in one
// message or across messages, all accumulate). fp32 accumulation; message values may be fp32,
// fp16 or bf16, indices int32 or int64. Dense messages are summed first in one pass (coded
// accumulation), then the sparse ones message by message in the order given.
// Every check (shapes, dtypes, devices, indices in [0, d), finite weights and, unless
// check_finite is false, finite message values) happens before out is written.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "coded_accumulate.h"

namespace pgc {

struct IndexReport {
  bool in_range = true;     // every index in [0, d)
  bool increasing = true;   // strictly increasing (then a scatter may run in parallel)
};

// What the content checks found, per message (empty sparse messages are not inspected and
// report in range, increasing and finite). finite flags are all true when not checked.
struct ContentReport {
  std::vector<IndexReport> sparse_indices;
  std::vector<bool> sparse_finite;
  std::vector<bool> dense_finite;

  // Every message clean until a check says otherwise.
  ContentReport(size_t sparse, size_t dense)
      : sparse_indices(sparse), sparse_finite(sparse, true), dense_finite(dense, true) {}
};

// One device's kernels: the content checks (what they found, per message), the dense messages'
// coded accumulation, and the scatter-add of one sparse message.
struct DecodeKernels {
  ContentReport (*inspect_contents)(at::TensorList dense, at::TensorList sparse_values,
                                    at::TensorList sparse_indices, int64_t d, bool check_finite);
  CodedKernel coded_accumulate;
  void (*scatter_add)(const at::Tensor& out, const at::Tensor& values, const at::Tensor& indices,
                      float w, bool increasing);
};

// The op on one device: every check (shapes, dtypes, devices, indices in [0, d), finite
// weights and values), then the dense messages in one pass per dtype, then the sparse ones.
void decode_accumulate(const at::Tensor& out, at::TensorList dense,
                       at::ArrayRef<double> dense_weights, at::TensorList sparse_values,
                       at::TensorList sparse_indices, at::ArrayRef<double> sparse_weights,
                       bool accumulate, bool check_finite, const DecodeKernels& kernels);

namespace cpu {
ContentReport inspect_contents(at::TensorList dense, at::TensorList sparse_values,
                               at::TensorList sparse_indices, int64_t d, bool check_finite);
void scatter_add(const at::Tensor& out, const at::Tensor& values, const at::Tensor& indices,
                 float w, bool increasing);
}  // namespace cpu

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
// Queues every check of every message, then reads all the flags back at once (one blocking
// read per decode, not one per check).
ContentReport inspect_contents(at::TensorList dense, at::TensorList sparse_values,
                               at::TensorList sparse_indices, int64_t d, bool check_finite);
void scatter_add(const at::Tensor& out, const at::Tensor& values, const at::Tensor& indices,
                 float w, bool increasing);
}  // namespace cuda
#endif

}  // namespace pgc
