// Coded accumulation over the pipeline ring buffer (the op pgc_hvd::coded_accumulate):
//   out = sum_l coef_l * slot_l          (accumulate = false)
//   out += sum_l coef_l * slot_l         (accumulate = true; with one slot this is the
//                                          add-one-slot-in-place form used during backward)
// slots: c flat buffers of d elements (fp32, fp16 or bf16, all the same dtype);
// out: fp32 of d elements; the sum is formed in fp32 in one pass over memory.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace pgc {

// One device's kernel: inputs already checked, at least one slot, coefficients as float32.
using CodedKernel = void (*)(const at::Tensor& out, at::TensorList slots,
                             const std::vector<float>& coeffs, bool accumulate);

// The op on one device: every check (shapes, dtypes, devices, aliasing, finite coefficients),
// then `kernel` (no slots: out is zeroed unless accumulate).
void coded_accumulate(const at::Tensor& out, at::TensorList slots, at::ArrayRef<double> coeffs,
                      bool accumulate, CodedKernel kernel);

namespace cpu {
void coded_accumulate(const at::Tensor& out, at::TensorList slots,
                      const std::vector<float>& coeffs, bool accumulate);
}

#ifdef PGC_HVD_WITH_CUDA
namespace cuda {
void coded_accumulate(const at::Tensor& out, at::TensorList slots,
                      const std::vector<float>& coeffs, bool accumulate);
}
#endif

}  // namespace pgc
