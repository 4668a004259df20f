// Coded accumulation over the pipeline ring buffer:
//   out = sum_l coef_l * slot_l          (accumulate = false)
//   out += sum_l coef_l * slot_l         (accumulate = true; with one slot this is the
//                                          add-one-slot-in-place form used during backward)
// slots: c flat buffers of d elements (fp32, fp16 or bf16, all the same dtype);
// out: fp32 of d elements; the sum is formed in fp32 in one pass over memory.
#pragma once
#include <torch/extension.h>

#include <vector>

namespace pgc {

void coded_accumulate(at::Tensor out, const std::vector<at::Tensor>& slots,
                      const std::vector<double>& coeffs, bool accumulate);

namespace cpu {
void coded_accumulate(at::Tensor& out, const std::vector<at::Tensor>& slots,
                      const std::vector<float>& coeffs, bool accumulate);
}

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
void coded_accumulate(at::Tensor& out, const std::vector<at::Tensor>& slots,
                      const std::vector<float>& coeffs, bool accumulate);
}
#endif

}  // namespace pgc
