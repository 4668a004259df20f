// The ValueError top-kappa raises on Inf/NaN input, shared by the CPU and CUDA drivers.
#pragma once
#include <c10/util/Exception.h>

#include <cstdint>

namespace pgc {

constexpr const char* kNonFiniteMsg =
    "has Inf or NaN entries; top-k of a non-finite gradient is undefined: skip this step or "
    "sanitise the buffer (e.g. torch.nan_to_num_)";

// Raises when `count` of the n elements of `what` are Inf or NaN.
inline void check_no_nonfinite(int64_t count, const char* what, int64_t n) {
  TORCH_CHECK_VALUE(count == 0, what, " ", kNonFiniteMsg, " (", count, " of ", n, ")");
}

}  // namespace pgc
