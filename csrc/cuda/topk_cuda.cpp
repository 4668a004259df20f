// Tensor glue of CUDA top-kappa compression and error feedback (kernels in topk.cu). The host
// drives radix select: each histogram pass is one launch and one 8 KiB read-back; the selection
// itself (count, scan, write) stays on the device and keeps index order.
#include <cstring>

#include "cuda/glue.h"
#include "error_feedback.h"
#include "radix.h"
#include "topk.h"

namespace pgc::cuda {
namespace {

constexpr const char* kNonFiniteMsg =
    "has Inf or NaN entries; top-k of a non-finite gradient is undefined: skip this step or "
    "sanitise the buffer (e.g. torch.nan_to_num_)";

// n elements of dtype dt at v; idx (optional, int64) maps them to positions in the original
// buffer (candidates), else position = element number.
struct Source {
  const void* v;
  kernels::DType dt;
  const int64_t* idx;
  int64_t n;
};

struct Selector {
  at::TensorOptions dev;  // device options (dtype set per allocation)
  cudaStream_t stream;
  at::Tensor hist;        // kRadixBins int32 on the device

  explicit Selector(const at::Tensor& like)
      : dev(like.options()), stream(current_stream()),
        hist(at::empty({kernels::kRadixBins}, like.options().dtype(at::kInt))) {}

  // kappa-th largest key T of src (1 <= kappa <= n) and need_eq (radix.h); with check_finite,
  // raises ValueError when a key is Inf/NaN (seen in the digit-0 histogram).
  void kth_largest(const Source& src, int64_t kappa, bool check_finite, const char* what,
                   uint32_t* T, int64_t* need_eq) {
    uint32_t prefix = 0;
    int64_t k_rem = kappa;
    for (int p = 0; p < 3; ++p) {
      const uint32_t mask = (1u << radix::kDigits[p].bits) - 1u;
      kernels::key_histogram(src.v, src.dt, src.n, prefix, radix::prefix_shift(p),
                             radix::kDigits[p].shift, mask,
                             reinterpret_cast<unsigned int*>(hist.data_ptr<int>()), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const at::Tensor h = to_host(hist);
      uint32_t counts[kernels::kRadixBins];
      std::memcpy(counts, h.data_ptr<int>(), sizeof counts);
      if (p == 0 && check_finite) {
        int64_t nonfinite = 0;
        for (int b = radix::kNonFiniteBin0; b < kernels::kRadixBins; ++b) nonfinite += counts[b];
        TORCH_CHECK_VALUE(nonfinite == 0, what, " ", kNonFiniteMsg, " (", nonfinite, " of ",
                          src.n, ")");
      }
      int64_t above = 0;
      const int bin = radix::walk(counts, static_cast<int>(mask) + 1, k_rem, &above);
      k_rem -= above;
      prefix = (prefix << radix::kDigits[p].bits) | static_cast<uint32_t>(bin);
    }
    *T = prefix;
    *need_eq = k_rem;
  }

  at::Tensor workspace(int64_t n) {
    return at::empty({kernels::select_workspace_elems(n)}, dev.dtype(at::kLong));
  }

  // Number of elements of src with key > thr (count + scan launches; blocks for the total).
  int64_t count_above(const Source& src, long long thr, at::Tensor& ws) {
    auto* w = reinterpret_cast<unsigned long long*>(ws.data_ptr<int64_t>());
    kernels::select_count(src.v, src.dt, src.n, thr, w, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t off = kernels::select_totals(w, src.n) - w;
    return to_host(ws.narrow(0, off, 1)).item<int64_t>();
  }

  // Writes the selection {key > thr} + first need_eq of {key == thr} in index order; the
  // workspace must hold select_count's result for the same (src, thr).
  void write(const Source& src, long long thr, long long need_eq, const at::Tensor& ws,
             void* out_v, void* out_i, bool index64) {
    kernels::select_write(src.v, src.dt, src.idx, src.n, thr, need_eq,
                          reinterpret_cast<const unsigned long long*>(ws.data_ptr<int64_t>()),
                          out_v, out_i, index64, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Exact top-kappa of src into (out_v, out_i): three histogram passes, count, write.
  void exact(const Source& src, int64_t kappa, const char* what, void* out_v, void* out_i,
             bool index64) {
    uint32_t T = 0;
    int64_t need_eq = 0;
    kth_largest(src, kappa, true, what, &T, &need_eq);
    at::Tensor ws = workspace(src.n);
    kernels::select_count(src.v, src.dt, src.n, static_cast<long long>(T),
                          reinterpret_cast<unsigned long long*>(ws.data_ptr<int64_t>()), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    write(src, static_cast<long long>(T), need_eq, ws, out_v, out_i, index64);
  }

  // Threshold top-kappa (radix.h): sample threshold, one compare-and-compact pass into
  // candidates (lowering the threshold while they are fewer than kappa), then the exact
  // selection among the candidates.
  void threshold(const Source& src, const at::Tensor& like, int64_t kappa, const char* what,
                 void* out_v, void* out_i, bool index64) {
    const int64_t n = src.n;
    const int64_t s = radix::sample_size(n);
    const int64_t r = radix::sample_rank(n, kappa, s);
    uint32_t thr = 0;
    if (r <= s) {
      at::Tensor sample = at::empty({s}, dev.dtype(at::kFloat));
      kernels::gather_sample(src.v, src.dt, nullptr, s, n / s, sample.data_ptr<float>(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      int64_t unused = 0;
      kth_largest(Source{sample.data_ptr<float>(), kernels::DType::kFloat32, nullptr, s}, r,
                  false, what, &thr, &unused);
      TORCH_CHECK_VALUE(thr < radix::kNonFiniteKey, what, " ", kNonFiniteMsg);
    }
    at::Tensor ws = workspace(n);
    int64_t nc = count_above(src, static_cast<long long>(thr) - 1, ws);
    for (int attempt = 0; nc < kappa; ++attempt) {
      thr = attempt == 0 ? radix::halve_key(thr)
            : attempt == 1 ? (thr > (8u << 23) ? thr - (8u << 23) : 0u)
                           : 0u;
      nc = count_above(src, static_cast<long long>(thr) - 1, ws);
    }
    at::Tensor cand_v = at::empty({nc}, like.options());
    at::Tensor cand_i = at::empty({nc}, dev.dtype(at::kLong));
    write(src, static_cast<long long>(thr) - 1, 0, ws, cand_v.data_ptr(), cand_i.data_ptr(),
          true);
    exact(Source{cand_v.data_ptr(), src.dt, cand_i.data_ptr<int64_t>(), nc}, kappa, what, out_v,
          out_i, index64);
  }

  void run(const Source& src, const at::Tensor& like, int64_t kappa, TopkMethod method,
           const char* what, void* out_v, void* out_i, bool index64) {
    if (method == TopkMethod::kExact)
      exact(src, kappa, what, out_v, out_i, index64);
    else
      threshold(src, like, kappa, what, out_v, out_i, index64);
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 TopkMethod method, bool index64) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor values = at::empty({kappa}, x.options());
  at::Tensor indices = at::empty({kappa}, x.options().dtype(index64 ? at::kLong : at::kInt));
  if (kappa == 0) return {values, indices};
  Selector sel(x);
  sel.run(Source{x.data_ptr(), kernel_dtype(x), nullptr, x.numel()}, x, kappa, method, "x",
          values.data_ptr(), indices.data_ptr(), index64);
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> error_feedback_compress(const at::Tensor& x,
                                                           at::Tensor& residual, int64_t kappa,
                                                           TopkMethod method, bool index64) {
  const c10::cuda::CUDAGuard guard(x.device());
  const auto stream = current_stream();
  const int64_t n = x.numel();
  float* r = residual.data_ptr<float>();
  kernels::add_into(r, x.data_ptr(), kernel_dtype(x), n, stream);  // the one read of x
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor values = at::empty({kappa}, residual.options());
  at::Tensor indices = at::empty({kappa}, residual.options().dtype(index64 ? at::kLong : at::kInt));
  if (kappa == 0) return {values, indices};
  Selector sel(residual);
  sel.run(Source{r, kernels::DType::kFloat32, nullptr, n}, residual, kappa, method,
          "x + residual", values.data_ptr(), indices.data_ptr(), index64);
  kernels::take_and_zero(r, indices.data_ptr(), index64, kappa, values.data_ptr<float>(), stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {values, indices};
}

}  // namespace pgc::cuda
