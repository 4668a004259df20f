// CPU building blocks of top-kappa selection (used by topk_cpu.cpp and error_feedback_cpu.cpp).
//
// Every pass reads the elements through a loader `load(i) -> float`, called exactly once per i
// and per pass, so error feedback can fuse "residual[i] = x[i] + residual[i]" into its first
// pass. Passes split [0, n) into one contiguous chunk per OpenMP thread, in thread order, so
// everything they collect stays in index order without sorting. See radix.h for the keys.
#pragma once
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <c10/util/Exception.h>

#include "nonfinite.h"
#include "radix.h"

namespace pgc::cpu::select {

constexpr int64_t kParallelMin = 1 << 16;  // below this, one thread
constexpr int kBlock = 256;                // elements whose keys are formed together

inline uint32_t key_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u & 0x7fffffffu;
}

inline int threads_for(int64_t n) { return n >= kParallelMin ? omp_get_max_threads() : 1; }

// Chunk of thread t among nt over [0, n).
inline void chunk(int64_t n, int t, int nt, int64_t* lo, int64_t* hi) {
  *lo = n * t / nt;
  *hi = n * (t + 1) / nt;
}

// Digit-0 histogram (bits 30..20 of the key) of all n elements: hist[2048].
template <class Load>
void top_histogram(int64_t n, Load&& load, int64_t* hist) {
  const int nt = threads_for(n);
  std::vector<int64_t> per(static_cast<size_t>(nt) * radix::kBins, 0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t lo, hi;
    chunk(n, t, T, &lo, &hi);
    // Two interleaved sub-histograms halve the store-to-load chains on a hot bin.
    alignas(64) uint32_t h0[radix::kBins] = {}, h1[radix::kBins] = {};
    alignas(64) uint32_t kk[kBlock];
    for (int64_t i0 = lo; i0 < hi; i0 += kBlock) {
      const int m = static_cast<int>(std::min<int64_t>(kBlock, hi - i0));
#pragma omp simd
      for (int j = 0; j < m; ++j) kk[j] = key_of(load(i0 + j)) >> 20;
      int j = 0;
      for (; j + 1 < m; j += 2) {
        ++h0[kk[j]];
        ++h1[kk[j + 1]];
      }
      if (j < m) ++h0[kk[j]];
    }
    int64_t* mine = per.data() + static_cast<size_t>(t) * radix::kBins;
    for (int b = 0; b < radix::kBins; ++b) mine[b] = static_cast<int64_t>(h0[b]) + h1[b];
  }
  std::fill(hist, hist + radix::kBins, 0);
  for (int t = 0; t < nt; ++t)
    for (int b = 0; b < radix::kBins; ++b) hist[b] += per[static_cast<size_t>(t) * radix::kBins + b];
}

// Elements with key >= lo, in index order (keys and indices).
struct Candidates {
  std::vector<uint32_t> key;
  std::vector<int64_t> idx;
  bool nonfinite = false;  // some candidate is Inf or NaN
  int64_t size() const { return static_cast<int64_t>(key.size()); }
};

// One compare-and-compact pass. Keys of a block are formed in a vectorised loop; then SSE2
// compares four keys at a time (keys < 2^31, so the signed compare is exact) and only the set
// bits of the mask are visited (eight at a time with AVX2): cost ~ n/4 compares + one step per candidate.
template <class Load>
Candidates compact_at_least(int64_t n, uint32_t lo, Load&& load) {
  const int nt = threads_for(n);
  std::vector<std::vector<uint32_t>> lk(nt);
  std::vector<std::vector<int64_t>> li(nt);
  std::vector<char> nf(nt, 0);
  const int32_t lo_minus_1 = static_cast<int32_t>(lo) - 1;  // lo <= 2^31 - 1; lo = 0 -> -1
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t a, b;
    chunk(n, t, T, &a, &b);
    auto& vk = lk[t];
    auto& vi = li[t];
    alignas(64) uint32_t kk[kBlock];
    const __m128i thr = _mm_set1_epi32(lo_minus_1);
#ifdef __AVX2__
    const __m256i thr8 = _mm256_set1_epi32(lo_minus_1);
#endif
    uint32_t maxkey = 0;
    // keeps element j of the current block (key kk[j], index i0 + j)
    auto keep = [&](int64_t i0, int j) {
      vk.push_back(kk[j]);
      vi.push_back(i0 + j);
      maxkey = std::max(maxkey, kk[j]);
    };
    // keeps the elements j0 + q of the current block for every set bit q of mask
    auto keep_mask = [&](int64_t i0, int j0, unsigned mask) {
      while (mask != 0) {
        keep(i0, j0 + __builtin_ctz(mask));
        mask &= mask - 1;
      }
    };
    for (int64_t i0 = a; i0 < b; i0 += kBlock) {
      const int m = static_cast<int>(std::min<int64_t>(kBlock, b - i0));
#pragma omp simd
      for (int j = 0; j < m; ++j) kk[j] = key_of(load(i0 + j));
      int j = 0;
#ifdef __AVX2__
      for (; j + 8 <= m; j += 8) {
        const __m256i kv = _mm256_load_si256(reinterpret_cast<const __m256i*>(kk + j));
        keep_mask(i0, j, static_cast<unsigned>(_mm256_movemask_ps(
                             _mm256_castsi256_ps(_mm256_cmpgt_epi32(kv, thr8)))));
      }
#endif
      for (; j + 4 <= m; j += 4) {
        const __m128i kv = _mm_load_si128(reinterpret_cast<const __m128i*>(kk + j));
        keep_mask(i0, j, static_cast<unsigned>(
                             _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(kv, thr)))));
      }
      for (; j < m; ++j)
        if (kk[j] >= lo) keep(i0, j);
    }
    nf[t] = maxkey >= radix::kNonFiniteKey;
  }
  Candidates out;
  std::vector<size_t> off(nt + 1, 0);
  for (int t = 0; t < nt; ++t) {
    off[t + 1] = off[t] + lk[t].size();
    out.nonfinite = out.nonfinite || nf[t];
  }
  out.key.resize(off[nt]);
  out.idx.resize(off[nt]);
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    std::copy(lk[t].begin(), lk[t].end(), out.key.begin() + off[t]);
    std::copy(li[t].begin(), li[t].end(), out.idx.begin() + off[t]);
  }
  return out;
}

// The kappa-th largest key T among keys[0, n) (1 <= kappa <= n) and need_eq, the number of
// elements equal to T among the kappa largest (radix select, three histogram passes).
inline void kth_largest(const uint32_t* keys, int64_t n, int64_t kappa, uint32_t* T,
                        int64_t* need_eq) {
  uint32_t prefix = 0;
  int64_t k_rem = kappa;
  const int nt = threads_for(n);
  std::vector<int64_t> per(static_cast<size_t>(nt) * radix::kBins);
  int64_t hist[radix::kBins];
  for (int p = 0; p < 3; ++p) {
    const int ps = radix::prefix_shift(p), sh = radix::kDigits[p].shift;
    const uint32_t mask = (1u << radix::kDigits[p].bits) - 1u;
    std::fill(per.begin(), per.end(), 0);
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), TT = omp_get_num_threads();
      int64_t a, b;
      chunk(n, t, TT, &a, &b);
      int64_t* h = per.data() + static_cast<size_t>(t) * radix::kBins;
      for (int64_t i = a; i < b; ++i)
        if ((keys[i] >> ps) == prefix) ++h[(keys[i] >> sh) & mask];
    }
    std::fill(hist, hist + radix::kBins, 0);
    for (int t = 0; t < nt; ++t)
      for (int bb = 0; bb < radix::kBins; ++bb) hist[bb] += per[static_cast<size_t>(t) * radix::kBins + bb];
    int64_t above = 0;
    const int bin = radix::walk(hist, static_cast<int>(mask) + 1, k_rem, &above);
    k_rem -= above;
    prefix = (prefix << radix::kDigits[p].bits) | static_cast<uint32_t>(bin);
  }
  *T = prefix;
  *need_eq = k_rem;
}

// Final pick among candidates (index order): every key > T and the first need_eq keys == T;
// writes exactly kappa = #(key > T) + need_eq indices, ascending, through put(j, index).
template <class Put>
void pick(const Candidates& c, uint32_t T, int64_t need_eq, Put&& put) {
  const int64_t n = c.size();
  const int nt = threads_for(n);
  std::vector<int64_t> gt(nt + 1, 0), eq(nt + 1, 0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), TT = omp_get_num_threads();
    int64_t a, b;
    chunk(n, t, TT, &a, &b);
    int64_t g = 0, e = 0;
    for (int64_t i = a; i < b; ++i) {
      g += c.key[i] > T;
      e += c.key[i] == T;
    }
    gt[t + 1] = g;
    eq[t + 1] = e;
#pragma omp barrier
#pragma omp single
    for (int u = 0; u < TT; ++u) {
      gt[u + 1] += gt[u];
      eq[u + 1] += eq[u];
    }
    // implicit barrier after single
    int64_t eq_rank = eq[t];
    int64_t pos = gt[t] + std::min(eq[t], need_eq);
    for (int64_t i = a; i < b; ++i) {
      const uint32_t key = c.key[i];
      bool sel = key > T;
      if (key == T) sel = eq_rank++ < need_eq;
      if (sel) put(pos++, c.idx[i]);
    }
  }
}

// Candidates for the exact method: all elements whose digit 0 is at least that of the kappa-th
// largest key (a histogram pass, then a compaction pass). Raises on Inf/NaN after pass one.
template <class First, class Again>
Candidates candidates_exact(int64_t n, int64_t kappa, const char* what, First&& first,
                            Again&& again) {
  int64_t hist[radix::kBins];
  top_histogram(n, first, hist);
  int64_t nonfinite = 0;
  for (int b = radix::kNonFiniteBin0; b < radix::kBins; ++b) nonfinite += hist[b];
  check_no_nonfinite(nonfinite, what, n);
  int64_t above = 0;
  const int bin = radix::walk(hist, radix::kBins, kappa, &above);
  return compact_at_least(n, static_cast<uint32_t>(bin) << radix::kDigits[0].shift, again);
}

// Candidates for the threshold method: thr = the r-th largest key of a strided sample (see
// radix.h), one compare-and-compact pass with key >= thr; if fewer than kappa survive, the
// threshold is lowered (halved, then divided by 2^8, then 0 = everything) and the pass redone.
template <class Sample, class First, class Again>
Candidates candidates_threshold(int64_t n, int64_t kappa, const char* what, Sample&& sample,
                                First&& first, Again&& again) {
  const int64_t s = radix::sample_size(n);
  const int64_t r = radix::sample_rank(n, kappa, s);
  uint32_t thr = 0;
  if (r <= s) {
    const int64_t stride = n / s;
    std::vector<uint32_t> keys(static_cast<size_t>(s));
#pragma omp parallel for num_threads(threads_for(s * 64)) schedule(static)
    for (int64_t j = 0; j < s; ++j)
      keys[j] = key_of(sample(radix::sample_position(j, stride)));
    std::nth_element(keys.begin(), keys.begin() + (r - 1), keys.end(), std::greater<uint32_t>());
    thr = keys[r - 1];
    TORCH_CHECK_VALUE(thr < radix::kNonFiniteKey, what, " ", kNonFiniteMsg);
  }
  Candidates c = compact_at_least(n, thr, first);
  for (int attempt = 0; c.size() < kappa; ++attempt) {
    thr = radix::lowered_threshold(thr, attempt);
    c = compact_at_least(n, thr, again);
  }
  TORCH_CHECK_VALUE(!c.nonfinite, what, " ", kNonFiniteMsg);
  return c;
}

// Trim candidates to exactly kappa and write the ascending indices through put(j, index).
template <class Put>
void trim(const Candidates& c, int64_t kappa, Put&& put) {
  if (kappa == 0) return;
  uint32_t T = 0;
  int64_t need_eq = 0;
  kth_largest(c.key.data(), c.size(), kappa, &T, &need_eq);
  pick(c, T, need_eq, put);
}

}  // namespace pgc::cpu::select
