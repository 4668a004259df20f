// Tensor glue of CUDA top-kappa compression (kernels in topk.cu), and the radix select that
// error feedback (error_feedback_cuda.cpp) runs on its residual.
//
// Two drivers of the same radix select (radix.h), chosen by the op's walk argument (pgc_hvd.ops
// reads its default once from PGC_HVD_CUDA_TOPK_WALK):
//   device (default): the digit walk runs on the device (radix_walk writes the prefix into a walk
//     state that the next launches read). Exact: one digit-0 histogram pass over x, ONE 64-byte
//     read-back (the candidate count, and the non-finite count for the ValueError), one stable
//     compaction pass of the digit-0 boundary bin and above, then digits 1 and 2 and the
//     order-preserving selection among those few candidates (when they are at most n / 4;
//     otherwise the walk simply goes on over x). Threshold: the sample's walk, one counting
//     pass over x, one read-back, one compaction pass, the same finish (the same n / 4 rule).
//   host: the first version, kept to measure against in one run (benchmarks/kernels/ops_report.py) and as
//     a fallback: each histogram pass ends with a 16 KiB read-back that the host walks; five
//     full passes over x for exact.
// Histogram counters are 64-bit, so one bin may hold 2^32 elements or more. The final
// selection's writes (select_write) are bounded by the outputs' length: counts that disagreed
// with the data (say, x written by another stream without synchronisation) would cut a result
// short there rather than write past it. The compaction (cub) writes what it selects into
// buffers sized by the counts; the counts and the compaction read the same x on one stream.
#include <algorithm>
#include <cstring>

#include "cuda/glue.h"
#include "cuda/select_cuda.h"
#include "nonfinite.h"
#include "radix.h"

namespace pgc::cuda {
namespace {

struct HostWalk {
  at::TensorOptions dev;  // device options (dtype set per allocation)
  cudaStream_t stream;
  at::Tensor hist;        // kRadixBins 64-bit counters on the device

  explicit HostWalk(const at::Tensor& like)
      : dev(like.options()), stream(current_stream()),
        hist(at::empty({kernels::kRadixBins}, like.options().dtype(at::kLong))) {}

  // kappa-th largest key T of src (1 <= kappa <= n) and need_eq (radix.h); with check_finite,
  // raises ValueError when a key is Inf/NaN (seen in the digit-0 histogram).
  void kth_largest(const Source& src, int64_t kappa, bool check_finite, const char* what,
                   uint32_t* T, int64_t* need_eq) {
    uint32_t prefix = 0;
    int64_t k_rem = kappa;
    for (int p = 0; p < 3; ++p) {
      const uint32_t mask = (1u << radix::kDigits[p].bits) - 1u;
      kernels::key_histogram(src.v, src.dt, src.n, prefix, nullptr, radix::prefix_shift(p),
                             radix::kDigits[p].shift, mask,
                             reinterpret_cast<unsigned long long*>(hist.data_ptr<int64_t>()),
                             stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const at::Tensor h = to_host(hist);
      uint64_t counts[kernels::kRadixBins];
      std::memcpy(counts, h.data_ptr<int64_t>(), sizeof counts);
      if (p == 0 && check_finite) {
        int64_t nonfinite = 0;
        for (int b = radix::kNonFiniteBin0; b < kernels::kRadixBins; ++b) nonfinite += counts[b];
        check_no_nonfinite(nonfinite, what, src.n);
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
    kernels::select_count(src.v, src.dt, src.n, thr, nullptr, w, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t off = kernels::select_totals(w, src.n) - w;
    return to_host(ws.narrow(0, off, 1)).item<int64_t>();
  }

  // Writes the selection {key > thr} + first need_eq of {key == thr} in index order into
  // outputs of length cap; the workspace must hold select_count's result for (src, thr).
  void write(const Source& src, long long thr, long long need_eq, const at::Tensor& ws,
             void* out_v, void* out_i, int64_t cap, bool index64) {
    kernels::select_write(src.v, src.dt, src.idx, src.n, thr, need_eq, nullptr,
                          reinterpret_cast<const unsigned long long*>(ws.data_ptr<int64_t>()),
                          out_v, out_i, cap, index64, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Exact top-kappa of src into (out_v, out_i): three histogram passes, count, write.
  void exact(const Source& src, int64_t kappa, const char* what, void* out_v, void* out_i,
             bool index64) {
    uint32_t T = 0;
    int64_t need_eq = 0;
    kth_largest(src, kappa, true, what, &T, &need_eq);
    at::Tensor ws = workspace(src.n);
    kernels::select_count(src.v, src.dt, src.n, static_cast<long long>(T), nullptr,
                          reinterpret_cast<unsigned long long*>(ws.data_ptr<int64_t>()), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    write(src, static_cast<long long>(T), need_eq, ws, out_v, out_i, kappa, index64);
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
      thr = radix::lowered_threshold(thr, attempt);
      nc = count_above(src, static_cast<long long>(thr) - 1, ws);
    }
    at::Tensor cand_v = at::empty({nc}, like.options());
    at::Tensor cand_i = at::empty({nc}, dev.dtype(at::kLong));
    write(src, static_cast<long long>(thr) - 1, 0, ws, cand_v.data_ptr(), cand_i.data_ptr(), nc,
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

// Radix select driven from the device (see the top of this file).
struct DeviceWalk {
  static constexpr int64_t kCompactAtMost = 4;  // compact when candidates are <= n / 4

  at::TensorOptions dev;
  cudaStream_t stream;
  at::Tensor hist;   // kRadixBins 64-bit counters on the device
  at::Tensor state;  // kWalkStateElems int64 on the device (kernels.h)

  explicit DeviceWalk(const at::Tensor& like)
      : dev(like.options()), stream(current_stream()),
        hist(at::empty({kernels::kRadixBins}, like.options().dtype(at::kLong))),
        state(at::empty({kernels::kWalkStateElems}, like.options().dtype(at::kLong))) {}

  long long* st() { return reinterpret_cast<long long*>(state.data_ptr<int64_t>()); }
  unsigned long long* h() {
    return reinterpret_cast<unsigned long long*>(hist.data_ptr<int64_t>());
  }

  // Passes first..last of the walk over src (pass 0 starts from rank kappa; later passes read
  // the prefix and rank that the state holds). Queues launches only.
  void walk(const Source& src, int64_t kappa, int first, int last) {
    for (int p = first; p <= last; ++p) {
      const uint32_t mask = (1u << radix::kDigits[p].bits) - 1u;
      kernels::key_histogram(src.v, src.dt, src.n, 0u, p == 0 ? nullptr : st() + kernels::kStPrefix,
                             radix::prefix_shift(p), radix::kDigits[p].shift, mask, h(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      kernels::radix_walk(h(), p, kappa, st(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  // Completes the walk over src from pass `first` and writes the kappa selected elements in
  // index order: {key > T} and the first need_eq with key == T, both read from the state.
  void finish(const Source& src, int64_t kappa, int first, void* out_v, void* out_i,
              bool index64) {
    walk(src, kappa, first, 2);
    at::Tensor ws = at::empty({kernels::select_workspace_elems(src.n)}, dev.dtype(at::kLong));
    auto* w = reinterpret_cast<unsigned long long*>(ws.data_ptr<int64_t>());
    kernels::select_count(src.v, src.dt, src.n, 0, st(), w, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    kernels::select_write(src.v, src.dt, src.idx, src.n, 0, 0, st(), w, out_v, out_i, kappa,
                          index64, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // The m elements of src with key >= thr (m counted before), values and positions, in index
  // order: one stable compaction pass, then a gather of the m values.
  struct Candidates {
    at::Tensor v, i;
    Source src;
  };
  Candidates compact(const Source& src, const at::Tensor& like, uint32_t thr, int64_t m) {
    TORCH_INTERNAL_ASSERT(src.idx == nullptr, "compaction runs on the input, not on candidates");
    Candidates c;
    c.i = at::empty({m}, dev.dtype(at::kLong));
    c.v = at::empty({m}, like.options());
    // Never empty: a null temp pointer would make cub return its size instead of running.
    const size_t bytes = std::max<size_t>(kernels::compact_temp_bytes(src.dt, src.n), 16);
    at::Tensor temp = at::empty({static_cast<int64_t>(bytes)}, dev.dtype(at::kByte));
    C10_CUDA_CHECK(kernels::compact_at_least(src.v, src.dt, src.n, thr, temp.data_ptr(), bytes,
                                             c.i.data_ptr<int64_t>(),
                                             st() + kernels::kStSelected, stream));
    kernels::gather(src.v, src.dt, c.i.data_ptr<int64_t>(), m, c.v.data_ptr(), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    c.src = Source{c.v.data_ptr(), src.dt, c.i.data_ptr<int64_t>(), m};
    return c;
  }

  // Exact: digit-0 histogram and walk, one read-back (non-finite and candidate counts), the
  // compaction of the boundary bin and above, and the rest of the walk on those candidates.
  // Without use_compaction (the op's compact = False; PGC_HVD_CUDA_TOPK_COMPACT=0 in pgc_hvd.ops)
  // the walk goes on over x: five passes but no read-back until the end (a design alternative,
  // timed alongside by benchmarks/kernels/ops_report.py).
  void exact(const Source& src, const at::Tensor& like, int64_t kappa, bool use_compaction,
             const char* what, void* out_v, void* out_i, bool index64) {
    walk(src, kappa, 0, 0);
    if (!use_compaction) {
      // All three digits and the selection over src, queued without a break; the one read-back
      // comes last (outputs written while x held Inf/NaN are never returned).
      finish(src, kappa, 1, out_v, out_i, index64);
      check_no_nonfinite(to_host(state).data_ptr<int64_t>()[kernels::kStNonFinite], what, src.n);
      return;
    }
    const at::Tensor hs = to_host(state);
    const int64_t* s = hs.data_ptr<int64_t>();
    check_no_nonfinite(s[kernels::kStNonFinite], what, src.n);
    const int64_t m = s[kernels::kStAtOrAbove];
    TORCH_INTERNAL_ASSERT(m >= kappa && m <= src.n, "radix walk: ", m, " candidates for kappa ",
                          kappa, " of ", src.n);
    // Compact only when it drops most of src: past n / kCompactAtMost, four more passes over
    // the candidates cost as much as the remaining passes over src, and the candidates would
    // take memory of the order of src (e.g. kappa = d, a large kappa, one dominant bin).
    if (m > src.n / kCompactAtMost) {
      finish(src, kappa, 1, out_v, out_i, index64);
      return;
    }
    const uint32_t thr = static_cast<uint32_t>(s[kernels::kStPrefix]) << radix::kDigits[0].shift;
    const Candidates c = compact(src, like, thr, m);
    finish(c.src, kappa, 1, out_v, out_i, index64);
  }

  // Threshold: the sample's r-th largest key (walked on the device), one counting pass over the
  // input, one read-back, a top-up when the candidates are fewer than kappa (rare: the count
  // is re-read per attempt), the compaction, then the exact selection among the candidates
  // (or, past n / kCompactAtMost candidates, the exact walk over src itself).
  void threshold(const Source& src, const at::Tensor& like, int64_t kappa, const char* what,
                 void* out_v, void* out_i, bool index64) {
    const int64_t n = src.n;
    const int64_t s = radix::sample_size(n);
    const int64_t r = radix::sample_rank(n, kappa, s);
    at::Tensor sample;
    const long long* thr_dev = nullptr;
    if (r <= s) {
      sample = at::empty({s}, dev.dtype(at::kFloat));
      kernels::gather_sample(src.v, src.dt, nullptr, s, n / s, sample.data_ptr<float>(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      walk(Source{sample.data_ptr<float>(), kernels::DType::kFloat32, nullptr, s}, r, 0, 2);
      thr_dev = st() + kernels::kStPrefix;
    }
    kernels::count_at_least(src.v, src.dt, n, 0u, thr_dev, st(), stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor hs = to_host(state);
    check_no_nonfinite(hs.data_ptr<int64_t>()[kernels::kStCountNonFinite], what, n);
    uint32_t thr = r <= s ? static_cast<uint32_t>(hs.data_ptr<int64_t>()[kernels::kStPrefix]) : 0u;
    int64_t nc = hs.data_ptr<int64_t>()[kernels::kStCountGe];
    for (int attempt = 0; nc < kappa; ++attempt) {
      thr = radix::lowered_threshold(thr, attempt);
      kernels::count_at_least(src.v, src.dt, n, thr, nullptr, st(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      nc = to_host(state).data_ptr<int64_t>()[kernels::kStCountGe];
    }
    if (nc > n / kCompactAtMost) {  // a large kappa: walk over src itself (see exact)
      finish(src, kappa, 0, out_v, out_i, index64);
      return;
    }
    const Candidates c = compact(src, like, thr, nc);
    finish(c.src, kappa, 0, out_v, out_i, index64);
  }
};

}  // namespace

void select_topk(const Source& src, const at::Tensor& like, int64_t kappa,
                 const TopkOptions& opt, const char* what, void* out_v, void* out_i) {
  if (opt.host_walk) {
    HostWalk(like).run(src, like, kappa, opt.method, what, out_v, out_i, opt.index64);
    return;
  }
  DeviceWalk w(like);
  if (opt.method == TopkMethod::kExact)
    w.exact(src, like, kappa, opt.compact, what, out_v, out_i, opt.index64);
  else
    w.threshold(src, like, kappa, what, out_v, out_i, opt.index64);
}

std::tuple<at::Tensor, at::Tensor> topk_compress(const at::Tensor& x, int64_t kappa,
                                                 const TopkOptions& opt) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor values = at::empty({kappa}, x.options());
  at::Tensor indices =
      at::empty({kappa}, x.options().dtype(opt.index64 ? at::kLong : at::kInt));
  if (kappa == 0) return {values, indices};
  select_topk(Source{x.data_ptr(), kernel_dtype(x), nullptr, x.numel()}, x, kappa, opt, "x",
              values.data_ptr(), indices.data_ptr());
  return {values, indices};
}

}  // namespace pgc::cuda
