// Tensor glue of CUDA error-feedback compression (kernels in error_feedback.cu; the selection is
// top-kappa's radix select, select_cuda.h). x is read once: add_into forms x + residual in the
// residual, the selection runs on the residual, and take_and_zero moves the selected entries out.
#include "cuda/glue.h"
#include "cuda/select_cuda.h"
#include "error_feedback.h"

namespace pgc::cuda {

std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           const at::Tensor& residual,
                                                           int64_t kappa, const TopkOptions& opt) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = current_stream();
  const int64_t n = x.numel();
  float* r = residual.data_ptr<float>();
  kernels::add_into(r, x.data_ptr(), kernel_dtype(x), n, stream);  // the one read of x
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor values = at::empty({kappa}, residual.options());
  at::Tensor indices =
      at::empty({kappa}, residual.options().dtype(opt.index64 ? at::kLong : at::kInt));
  if (kappa == 0) return {values, indices};
  select_topk(Source{r, kernels::DType::kFloat32, nullptr, n}, residual, kappa, opt,
              "x + residual", values.data_ptr(), indices.data_ptr());
  kernels::take_and_zero(r, indices.data_ptr(), opt.index64, kappa, values.data_ptr<float>(),
                         stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {values, indices};
}

}  // namespace pgc::cuda
