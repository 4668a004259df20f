// Raw CUDA launchers (no torch headers, so nvcc compiles fast). Tensor glue and checks live in
// the *_cuda.cpp files next to this header.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace pgc::cuda::kernels {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Ring buffers deeper than this are formed in several launches.
constexpr int kMaxSlotsPerLaunch = 16;

// out[i] (=|+=) sum_l coeffs[l] * slots[l][i], fp32 accumulation, c <= kMaxSlotsPerLaunch.
void coded_accumulate(float* out, const void* const* slots, const float* coeffs, int c,
                      int64_t d, DType dtype, bool accumulate, cudaStream_t stream);

// ---- top-kappa selection (topk.cu); keys as in radix.h: key = bits(|float(x)|) & 0x7fffffff.
//
// Radix select can be driven from the device: a walk state of kWalkStateElems int64 values in
// device memory carries the prefix found so far and the rank still to select, so that histogram,
// walk and selection launches queue back to back with no read-back in between. Slots:
constexpr int kWalkStateElems = 8;
constexpr int kStPrefix = 0;     // prefix of the kappa-th largest key; after pass 2 the key T
constexpr int kStRank = 1;       // k_rem, still to select below the prefix; after pass 2 need_eq
constexpr int kStAtOrAbove = 2;  // after pass 0: #(digit 0 >= the chosen bin), the candidates
constexpr int kStNonFinite = 3;  // after pass 0: #(key >= 0x7f800000), Inf and NaN
constexpr int kStCountGe = 4;    // count_at_least: #(key >= thr)
constexpr int kStCountNonFinite = 5;  // count_at_least: #(key >= 0x7f800000)
constexpr int kStSelected = 6;   // compact_at_least: number written

// hist[b] += #{i < n : (key_i >> prefix_shift) == prefix and (key_i >> shift) & mask == b};
// hist (kRadixBins 64-bit counters: one bin may hold 2^32 elements or more) is zeroed here first. With prefix_dev, the prefix is read from
// device memory (*prefix_dev, a walk state's kStPrefix slot) instead.
constexpr int kRadixBins = 2048;
void key_histogram(const void* v, DType dt, int64_t n, uint32_t prefix,
                   const long long* prefix_dev, int prefix_shift, int shift, uint32_t mask,
                   unsigned long long* hist, cudaStream_t stream);

// One step of the walk (radix::walk) in one block: among the elements counted by hist (a
// histogram of digit `pass`), find the bin b holding the k_rem-th largest, where k_rem is kappa
// at pass 0 and st[kStRank] after. Then st[kStPrefix] = (prefix << bits) | b and
// st[kStRank] = k_rem - #(elements in bins > b); at pass 0 also st[kStAtOrAbove] and
// st[kStNonFinite]. Requires 1 <= k_rem <= the histogram's total (otherwise it settles on bin 0,
// as radix::walk does, rather than leave the state unwritten).
void radix_walk(const unsigned long long* hist, int pass, long long kappa, long long* st,
                cudaStream_t stream);

// st[kStCountGe] = #(key >= thr), st[kStCountNonFinite] = #(key >= 0x7f800000), thr =
// thr_dev ? *thr_dev : thr (both slots zeroed here first).
void count_at_least(const void* v, DType dt, int64_t n, uint32_t thr, const long long* thr_dev,
                    long long* st, cudaStream_t stream);

// Stable compaction (one pass, cub::DeviceSelect::FlaggedIf): out_idx receives, in index order,
// every i < n with key_i >= thr, and *num_selected their number. temp is compact_temp_bytes(dt,
// n) bytes of device memory.
size_t compact_temp_bytes(DType dt, int64_t n);
cudaError_t compact_at_least(const void* v, DType dt, int64_t n, uint32_t thr, void* temp,
                             size_t temp_bytes, int64_t* out_idx, long long* num_selected,
                             cudaStream_t stream);

// out_v[j] = v[idx[j]] for j < m (same dtype).
void gather(const void* v, DType dt, const int64_t* idx, int64_t m, void* out_v,
            cudaStream_t stream);

// Order-preserving selection in tiles of kSelectTile elements, in three launches:
//   select_count: per tile, #(key > thr) and #(key == thr);  then an exclusive scan over tiles
//   (both written to the workspace, plus the totals);
//   select_write: element i is selected when key_i > thr, or key_i == thr and fewer than
//   need_eq elements with key == thr precede it; selected elements are written in index order
//   (out_v[p] = v[i], out_i[p] = idx_in ? idx_in[i] : i) for p < cap (the outputs' length: a
//   selection larger than the outputs is cut, never written past them). thr = -1 selects
//   everything.
// With st (a walk state after pass 2), thr and need_eq are read from st[kStPrefix] and
// st[kStRank] instead of the host values.
// The workspace holds select_workspace_elems(n) uint64 values; totals[0] = #(key > thr),
// totals[1] = #(key == thr) after select_count (totals points into the workspace).
constexpr int kSelectThreads = 256;
constexpr int kSelectItems = 4;
constexpr int kSelectTile = kSelectThreads * kSelectItems;
int64_t select_workspace_elems(int64_t n);
unsigned long long* select_totals(unsigned long long* workspace, int64_t n);
void select_count(const void* v, DType dt, int64_t n, long long thr, const long long* st,
                  unsigned long long* workspace, cudaStream_t stream);
void select_write(const void* v, DType dt, const int64_t* idx_in, int64_t n, long long thr,
                  long long need_eq, const long long* st, const unsigned long long* workspace,
                  void* out_v, void* out_i, int64_t cap, bool index64, cudaStream_t stream);

// Strided sample of the threshold method (radix.h): out[j] = float(x[p_j]) (+ add[p_j] when add
// is not null), p_j = radix::sample_position(j, stride), j < s.
void gather_sample(const void* x, DType dt, const float* add, int64_t s, int64_t stride,
                   float* out, cudaStream_t stream);

// ---- error feedback (error_feedback.cu)
// r[i] += float(x[i]) for i < n.
void add_into(float* r, const void* x, DType dt, int64_t n, cudaStream_t stream);
// out_v[j] = r[idx[j]], r[idx[j]] = 0 for j < k (idx distinct).
void take_and_zero(float* r, const void* idx, bool index64, int64_t k, float* out_v,
                   cudaStream_t stream);

// ---- decode-accumulate (decode.cu)
// flags[0] |= 1 when some value is Inf or NaN (flags zeroed by the caller).
void check_finite(const void* v, DType dt, int64_t n, int* flags, cudaStream_t stream);
// flags[0] |= 1 when some index is outside [0, d); flags[1] |= 1 when idx[j-1] >= idx[j].
void check_indices(const void* idx, bool index64, int64_t n, int64_t d, int* flags,
                   cudaStream_t stream);
// out[idx[j]] += w * float(v[j]) with atomicAdd (repeated indices accumulate).
void scatter_add(float* out, const void* v, DType dt, const void* idx, bool index64, int64_t n,
                 float w, cudaStream_t stream);

}  // namespace pgc::cuda::kernels
