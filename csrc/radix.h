// Radix select on magnitude keys, shared by the CPU and CUDA top-kappa kernels (host side).
//
// Key of an element x: the IEEE-754 bits of |float(x)| read as an unsigned integer,
//   key(x) = bits(float(x)) & 0x7fffffff,
// which orders finite magnitudes exactly like |x| (IEEE floats of one sign are ordered like
// their bit patterns), puts +-Inf above every finite value (0x7f800000) and NaN above Inf.
// A key is 31 bits; radix select reads it as three digits, most significant first:
//   digit 0 = bits 30..20 (11 bits: exponent and 3 mantissa bits),
//   digit 1 = bits 19..9  (11 bits),  digit 2 = bits 8..0 (9 bits).
// After pass p the prefix of the kappa-th largest key is known; after pass 2 the key T itself,
// and need_eq = how many elements equal to T belong to the kappa largest (ties: lowest index
// first, so the selection is {key > T} plus the first need_eq elements with key == T).
#pragma once
#include <cmath>
#include <cstdint>

namespace pgc::radix {

constexpr int kBins = 2048;                   // 2^11, the widest digit
constexpr uint32_t kNonFiniteKey = 0x7f800000u;  // keys >= this are Inf or NaN
constexpr int kNonFiniteBin0 = static_cast<int>(kNonFiniteKey >> 20);  // first such digit-0 bin

struct Digit {
  int shift;  // key >> shift & (2^bits - 1) is the digit
  int bits;
};
constexpr Digit kDigits[3] = {{20, 11}, {9, 11}, {0, 9}};

inline uint32_t digit_of(uint32_t key, int pass) {
  return (key >> kDigits[pass].shift) & ((1u << kDigits[pass].bits) - 1u);
}
// Elements taking part in pass p are those whose higher digits equal the prefix found so far:
// (key >> prefix_shift(p)) == prefix. For pass 0 the shift is 31 and every key (< 2^31) matches 0.
inline int prefix_shift(int pass) { return kDigits[pass].shift + kDigits[pass].bits; }

// One step of the walk from the largest bin down: given the histogram of the current digit
// among the elements that still match the prefix, and k_rem >= 1 of them still to select,
// find the bin b holding the k_rem-th largest. Returns b and sets `above` to the number of
// elements in bins > b (all selected), so that k_rem - above of bin b remain to be selected.
template <typename Count>
inline int walk(const Count* hist, int nbins, int64_t k_rem, int64_t* above) {
  int64_t cum = 0;
  for (int b = nbins - 1; b >= 0; --b) {
    const int64_t h = static_cast<int64_t>(hist[b]);
    if (cum + h >= k_rem) {
      *above = cum;
      return b;
    }
    cum += h;
  }
  *above = cum;  // unreachable when k_rem <= number of matching elements
  return 0;
}

// Deterministic strided sample used by the threshold method: sample j (0 <= j < s) is element
//   j * stride + offset(j),   offset(j) = ((mix(j) >> 32) * stride) >> 32 in [0, stride),
//   stride = floor(n / s) (< 2^32),
// one pseudo-random element of every stride-long window, so a periodic structure in the
// gradient (layers, channels) cannot alias with the stride.
inline uint64_t mix(uint64_t j) {
  j += 0x9e3779b97f4a7c15ull;
  j = (j ^ (j >> 30)) * 0xbf58476d1ce4e5b9ull;
  j = (j ^ (j >> 27)) * 0x94d049bb133111ebull;
  return j ^ (j >> 31);
}

inline int64_t sample_position(int64_t j, int64_t stride) {
  const uint64_t off = ((mix(static_cast<uint64_t>(j)) >> 32) * static_cast<uint64_t>(stride)) >> 32;
  return j * stride + static_cast<int64_t>(off);
}

// Sample size and rank for the threshold method. With p = kappa / n and mu = s * p the expected
// number of sample elements above the true threshold, the threshold is the r-th largest sample
// key with r = ceil(1.05 mu + 3 sqrt(mu)) + 1: it lands below the true kappa-th magnitude with
// probability about 1 - 1e-3 (so the candidates cover the exact top-kappa and are then trimmed),
// and the candidate set is about (1.05 + 3 / sqrt(mu)) kappa, small. r > s means "take all".
constexpr int64_t kSampleSize = 65536;

inline int64_t sample_size(int64_t n) { return n < kSampleSize ? n : kSampleSize; }

inline int64_t sample_rank(int64_t n, int64_t k, int64_t s) {
  const double mu = static_cast<double>(s) * static_cast<double>(k) / static_cast<double>(n);
  const double r = 1.05 * mu + 3.0 * std::sqrt(mu) + 1.0;
  return r >= static_cast<double>(s) ? s + 1 : static_cast<int64_t>(r) + 1;
}

// The threshold method's top-up: when the key threshold thr kept fewer than kappa candidates,
// attempt 0, 1, 2, ... lowers it to thr / 2 (exponent - 1), then thr / 2^8 (exponent - 8), then
// 0 (everything); a threshold already below the step goes to 0.
inline uint32_t lowered_threshold(uint32_t thr, int attempt) {
  if (attempt >= 2) return 0u;
  const uint32_t step = (attempt == 0 ? 1u : 8u) << 23;
  return thr > step ? thr - step : 0u;
}

}  // namespace pgc::radix
