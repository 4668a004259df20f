// The four ops of the torch library pgc_hvd (schemas in library.cpp) as kernels of one device.
//
// Each op's checks live in its own .cpp (coded_accumulate.cpp, topk.cpp, error_feedback.cpp,
// decode.cpp) and run on every device; a device only supplies the raw kernels that run after
// them (DeviceKernels). impl_ops<K> registers the four ops for one dispatch key with K's
// kernels: CPU in library.cpp, CUDA in cuda/library_cuda.cpp (or, in a build without CUDA, a
// CUDA entry whose kernels raise the error that says how to rebuild, also in library.cpp).
#pragma once
#include <torch/library.h>

#include "coded_accumulate.h"
#include "decode.h"
#include "error_feedback.h"
#include "topk.h"

namespace pgc {

struct DeviceKernels {
  CodedKernel coded_accumulate;
  TopkKernel topk_compress;
  ErrorFeedbackKernel error_feedback_compress;
  DecodeKernels decode;
};

// Registers pgc_hvd::{coded_accumulate, topk_compress, error_feedback_compress,
// decode_accumulate} with the kernels K (a DeviceKernels of static storage) for the dispatch
// key of the TORCH_LIBRARY_IMPL block that calls it. The C++ signatures follow the schemas:
// Tensor(a!) -> const at::Tensor& (written through), Tensor[] -> at::TensorList, float[] ->
// at::ArrayRef<double>, str -> c10::string_view, int -> int64_t, float -> double.
template <const DeviceKernels& K>
void impl_ops(torch::Library& m) {
  m.impl("coded_accumulate", [](const at::Tensor& out, at::TensorList slots,
                                at::ArrayRef<double> coeffs, bool accumulate) {
    coded_accumulate(out, slots, coeffs, accumulate, K.coded_accumulate);
  });
  m.impl("topk_compress", [](const at::Tensor& x, int64_t k, c10::string_view method,
                             bool index64, c10::string_view walk, bool compact) {
    return topk_compress(x, k, topk_options(method, index64, walk, compact), K.topk_compress);
  });
  m.impl("error_feedback_compress",
         [](const at::Tensor& x, const at::Tensor& residual, int64_t k, c10::string_view method,
            bool index64, c10::string_view walk, bool compact) {
           return error_feedback_compress(x, residual, k,
                                          topk_options(method, index64, walk, compact),
                                          K.error_feedback_compress);
         });
  m.impl("decode_accumulate",
         [](const at::Tensor& out, at::TensorList dense, at::ArrayRef<double> dense_weights,
            at::TensorList sparse_values, at::TensorList sparse_indices,
            at::ArrayRef<double> sparse_weights, bool accumulate, bool check_finite) {
           decode_accumulate(out, dense, dense_weights, sparse_values, sparse_indices,
                             sparse_weights, accumulate, check_finite, K.decode);
         });
}

}  // namespace pgc
