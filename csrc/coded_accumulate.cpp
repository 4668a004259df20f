// Checks of coded accumulation, shared by every device (see coded_accumulate.h).
#include "coded_accumulate.h"

#include <cmath>

#include "common.h"

namespace pgc {

void coded_accumulate(const at::Tensor& out, at::TensorList slots, at::ArrayRef<double> coeffs,
                      bool accumulate, CodedKernel kernel) {
  check_flat(out, "out");
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, "out must be float32 (the accumulator), got ",
                   out.scalar_type());
  TORCH_CHECK_VALUE(slots.size() == coeffs.size(), "got ", slots.size(), " slots but ",
                    coeffs.size(), " coefficients; pass one coefficient per slot");
  std::vector<float> c32;
  c32.reserve(coeffs.size());
  for (size_t l = 0; l < slots.size(); ++l) {
    const auto& s = slots[l];
    check_flat(s, "every slot");
    check_same_device(s, out, "a slot", "out");
    TORCH_CHECK_TYPE(is_float_like(s.scalar_type()),
                     "slots must be float32, float16 or bfloat16, got ", s.scalar_type());
    TORCH_CHECK_TYPE(s.scalar_type() == slots[0].scalar_type(),
                     "all slots must share one dtype, got ", slots[0].scalar_type(), " and ",
                     s.scalar_type());
    TORCH_CHECK_VALUE(s.numel() == out.numel(), "slot ", l, " has ", s.numel(),
                      " elements but out has ", out.numel());
    TORCH_CHECK_VALUE(finite_in_float32(coeffs[l]), "coefficient ", l, " is ", coeffs[l],
                      "; coefficients must be finite in float32 (|c| <= 3.4e38)");
    TORCH_CHECK_VALUE(!overlaps(s, out), "slot ", l,
                      " shares memory with out; accumulate into a separate buffer");
    c32.push_back(static_cast<float>(coeffs[l]));
  }
  if (slots.empty()) {
    if (!accumulate) out.zero_();
    return;
  }
  kernel(out, slots, c32, accumulate);
}

}  // namespace pgc
