// CUDA kernels of top-kappa selection (launchers declared in kernels.h).
//
// Radix select: key_histogram builds a 2048-bin histogram of one digit of the keys in shared
// memory (each lane loads kHistItems keys before counting any, so that enough loads are in
// flight to approach HBM bandwidth; warp-aggregated atomics: the lanes of a warp that hit one
// bin add once), merged into global memory per block. radix_walk picks the digit in one block
// and leaves the prefix in a device-side walk state that the next launches read, so a whole
// selection queues without host round trips. compact_at_least is one stable compaction pass
// (cub's decoupled look-back select). Order-preserving selection: select_count reduces per-tile
// counts, tile_scan turns them into exclusive prefix sums (one block, in order), and
// select_write re-reads each tile, ranks its elements with two block-wide exclusive scans (ties,
// then selected) and writes them at their final positions: the output is in index order and
// deterministic (no atomics decide any position).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "device_utils.cuh"
#include "kernels.h"
#include "radix.h"

namespace pgc::cuda::kernels {
namespace {

using detail::key_of;
using detail::to_f32;
using ull = unsigned long long;

constexpr int kHistThreads = 256;
constexpr int kScanThreads = 256;  // one block walks the tile counts in chunks

constexpr int kHistItems = 8;  // keys each lane loads before counting them
constexpr unsigned int kNoBin = 0xffffffffu;  // never a key (keys are below 2^31)

template <typename T>
__global__ void __launch_bounds__(kHistThreads)
    key_hist_kernel(const T* __restrict__ v, int64_t n, uint32_t prefix,
                    const long long* __restrict__ prefix_dev, int prefix_shift, int shift,
                    uint32_t mask, unsigned long long* __restrict__ hist) {
  __shared__ unsigned int sh[kRadixBins];
  for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) sh[b] = 0;
  const uint32_t pre = prefix_dev != nullptr ? static_cast<uint32_t>(*prefix_dev) : prefix;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  constexpr int64_t kSpan = 32 * kHistItems;  // elements a warp covers per iteration
  // base is the same for all lanes of a warp, so every lane takes part in __match_any_sync.
  for (int64_t base = warp * kSpan; base < n; base += nwarps * kSpan) {
    unsigned int key[kHistItems];
#pragma unroll
    for (int j = 0; j < kHistItems; ++j) {  // coalesced: lane-consecutive elements
      const int64_t i = base + j * 32 + lane;
      key[j] = i < n ? key_of(v[i]) : kNoBin;
    }
#pragma unroll
    for (int j = 0; j < kHistItems; ++j) {
      const unsigned int bin =
          key[j] != kNoBin && (key[j] >> prefix_shift) == pre ? (key[j] >> shift) & mask : kNoBin;
      const unsigned int peers = __match_any_sync(0xffffffffu, bin);
      if (bin != kNoBin && lane == __ffs(peers) - 1) atomicAdd(&sh[bin], __popc(peers));
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x)
    if (sh[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(sh[b]));
}

// One walk step (radix::walk) in one block. Thread t owns the kWalkPerThread bins
// nbins-1-t*kWalkPerThread, ... (largest first); a block-wide exclusive sum of the owners'
// totals gives each thread the count above its bins, and the one thread whose bins hold the
// k_rem-th largest writes the state.
constexpr int kWalkThreads = 256;
constexpr int kWalkPerThread = kRadixBins / kWalkThreads;
static_assert(kWalkPerThread * kWalkThreads == kRadixBins, "the walk's threads own every bin");

__global__ void __launch_bounds__(kWalkThreads)
    radix_walk_kernel(const unsigned long long* __restrict__ hist, int bits, bool first,
                      long long kappa, long long* __restrict__ st) {
  using Scan = cub::BlockScan<long long, kWalkThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int nbins = 1 << bits;
  const long long k_rem = first ? kappa : st[kStRank];
  const long long prefix = first ? 0 : st[kStPrefix];
  long long h[kWalkPerThread];
  long long mine = 0;
#pragma unroll
  for (int j = 0; j < kWalkPerThread; ++j) {
    const int r = threadIdx.x * kWalkPerThread + j;  // rank of the bin from the top
    h[j] = r < nbins ? static_cast<long long>(hist[nbins - 1 - r]) : 0;
    mine += h[j];
  }
  long long above = 0;  // elements in the bins of lower-numbered threads (larger bins)
  Scan(tmp).ExclusiveSum(mine, above);
  __syncthreads();  // every thread has read st before it is written below
#pragma unroll
  for (int j = 0; j < kWalkPerThread; ++j) {
    const int r = threadIdx.x * kWalkPerThread + j;
    // The owner of the k_rem-th largest; if the histogram holds fewer than k_rem (a broken
    // precondition), bin 0's owner settles on bin 0 (as radix::walk does) so the state is
    // written either way.
    const bool last = r == nbins - 1;
    if (r < nbins && above < k_rem && (above + h[j] >= k_rem || last)) {
      st[kStPrefix] = (prefix << bits) | (nbins - 1 - r);
      st[kStRank] = k_rem - above;
      if (first) st[kStAtOrAbove] = above + h[j];
    }
    above += h[j];
  }
  if (first && threadIdx.x == 0) {
    long long nonfinite = 0;
    for (int b = radix::kNonFiniteBin0; b < nbins; ++b) nonfinite += hist[b];
    st[kStNonFinite] = nonfinite;
  }
}

constexpr int kCountThreads = 256;
constexpr int kCountItems = 8;

template <typename T>
__global__ void __launch_bounds__(kCountThreads)
    count_at_least_kernel(const T* __restrict__ v, int64_t n, uint32_t thr,
                          const long long* __restrict__ thr_dev, long long* __restrict__ st) {
  using Reduce = cub::BlockReduce<ull, kCountThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const uint32_t t = thr_dev != nullptr ? static_cast<uint32_t>(*thr_dev) : thr;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  ull packed = 0;  // (#(key >= t) << 32) | #non-finite, per thread (< 2^32 each)
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n;
       base += stride * kCountItems) {
    unsigned int key[kCountItems];
#pragma unroll
    for (int j = 0; j < kCountItems; ++j) {
      const int64_t i = base + j * stride;
      key[j] = i < n ? key_of(v[i]) : kNoBin;
    }
#pragma unroll
    for (int j = 0; j < kCountItems; ++j)
      if (key[j] != kNoBin)
        packed += (static_cast<ull>(key[j] >= t) << 32) |
                  static_cast<ull>(key[j] >= radix::kNonFiniteKey);
  }
  // Block sums stay below 2^32 per field while n / gridDim.x < 2^32.
  const ull sum = Reduce(tmp).Sum(packed);
  if (threadIdx.x == 0 && sum != 0) {
    atomicAdd(reinterpret_cast<ull*>(st + kStCountGe), sum >> 32);
    atomicAdd(reinterpret_cast<ull*>(st + kStCountNonFinite), sum & 0xffffffffull);
  }
}

// Selection predicate of compact_at_least, applied by cub to each element of x.
template <typename T>
struct KeyAtLeast {
  uint32_t thr;
  __device__ __forceinline__ bool operator()(const T& x) const { return key_of(x) >= thr; }
};

template <typename T>
__global__ void __launch_bounds__(256)
    gather_kernel(const T* __restrict__ v, const int64_t* __restrict__ idx, int64_t m,
                  T* __restrict__ out) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += gs)
    out[j] = v[idx[j]];
}

template <typename T>
__global__ void __launch_bounds__(kSelectThreads)
    select_count_kernel(const T* __restrict__ v, int64_t n, long long thr_host,
                        const long long* __restrict__ st, ull* __restrict__ ws, int64_t ntiles) {
  const long long thr = st != nullptr ? st[kStPrefix] : thr_host;
  using Reduce = cub::BlockReduce<ull, kSelectThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t tile = blockIdx.x;
  const int64_t base = tile * kSelectTile + static_cast<int64_t>(threadIdx.x) * kSelectItems;
  ull packed = 0;  // (#greater << 32) | #equal; both <= kSelectTile
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j) {
    const int64_t i = base + j;
    if (i < n) {
      const long long key = static_cast<long long>(key_of(v[i]));
      packed += (static_cast<ull>(key > thr) << 32) | static_cast<ull>(key == thr);
    }
  }
  const ull sum = Reduce(tmp).Sum(packed);
  if (threadIdx.x == 0) {
    ws[tile] = sum >> 32;
    ws[ntiles + tile] = sum & 0xffffffffull;
  }
}

// Exclusive prefix sums of ws[0, ntiles) and ws[ntiles, 2 ntiles) in place; totals at
// ws[2 ntiles] and ws[2 ntiles + 1]. One block walks the tiles in chunks of kScanThreads.
__global__ void __launch_bounds__(kScanThreads) tile_scan_kernel(ull* __restrict__ ws, int64_t ntiles) {
  using Scan = cub::BlockScan<ull, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  for (int arr = 0; arr < 2; ++arr) {
    ull* a = ws + arr * ntiles;
    ull carry = 0;
    for (int64_t lo = 0; lo < ntiles; lo += kScanThreads) {
      const int64_t i = lo + threadIdx.x;
      const ull x = i < ntiles ? a[i] : 0ull;
      ull ex = 0, agg = 0;
      Scan(tmp).ExclusiveSum(x, ex, agg);
      if (i < ntiles) a[i] = carry + ex;
      carry += agg;
      __syncthreads();  // tmp is reused by the next chunk
    }
    if (threadIdx.x == 0) ws[2 * ntiles + arr] = carry;
    __syncthreads();
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kSelectThreads)
    select_write_kernel(const T* __restrict__ v, const int64_t* __restrict__ idx_in, int64_t n,
                        long long thr_host, long long need_eq_host,
                        const long long* __restrict__ st, const ull* __restrict__ ws,
                        int64_t ntiles, T* __restrict__ out_v, I* __restrict__ out_i,
                        int64_t cap) {
  const long long thr = st != nullptr ? st[kStPrefix] : thr_host;
  const long long need_eq = st != nullptr ? st[kStRank] : need_eq_host;
  using Scan = cub::BlockScan<unsigned int, kSelectThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t tile = blockIdx.x;
  const int64_t base = tile * kSelectTile + static_cast<int64_t>(threadIdx.x) * kSelectItems;
  T val[kSelectItems];
  unsigned int gt[kSelectItems], eq[kSelectItems];
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j) {
    const int64_t i = base + j;
    gt[j] = eq[j] = 0;
    if (i < n) {
      val[j] = v[i];
      const long long key = static_cast<long long>(key_of(val[j]));
      gt[j] = key > thr;
      eq[j] = key == thr;
    }
  }
  // Rank of each tie among the ties of this tile (blocked arrangement = index order).
  unsigned int eq_ex[kSelectItems];
  Scan(tmp).ExclusiveSum(eq, eq_ex);
  __syncthreads();
  const ull gt_before = ws[tile];
  const ull eq_before = ws[ntiles + tile];
  unsigned int sel[kSelectItems], pos_ex[kSelectItems];
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j)
    sel[j] = gt[j] | (eq[j] && static_cast<long long>(eq_before + eq_ex[j]) < need_eq);
  Scan(tmp).ExclusiveSum(sel, pos_ex);
  const ull eq_taken = eq_before < static_cast<ull>(need_eq) ? eq_before : static_cast<ull>(need_eq);
  const ull start = gt_before + eq_taken;
#pragma unroll
  for (int j = 0; j < kSelectItems; ++j) {
    const ull p = start + pos_ex[j];
    if (sel[j] && p < static_cast<ull>(cap)) {
      const int64_t i = base + j;
      out_v[p] = val[j];
      out_i[p] = static_cast<I>(idx_in != nullptr ? idx_in[i] : i);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(256) gather_sample_kernel(const T* __restrict__ x, const float* __restrict__ add,
                                     int64_t s, int64_t stride, float* __restrict__ out) {
  const int64_t gs = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < s; j += gs) {
    const ull off = ((detail::mix(static_cast<ull>(j)) >> 32) * static_cast<ull>(stride)) >> 32;
    const int64_t p = j * stride + static_cast<int64_t>(off);  // = radix::sample_position
    out[j] = to_f32(x[p]) + (add != nullptr ? add[p] : 0.f);
  }
}

int64_t tiles_of(int64_t n) { return (n + kSelectTile - 1) / kSelectTile; }

}  // namespace

void key_histogram(const void* v, DType dt, int64_t n, uint32_t prefix,
                   const long long* prefix_dev, int prefix_shift, int shift, uint32_t mask,
                   unsigned long long* hist, cudaStream_t stream) {
  cudaMemsetAsync(hist, 0, sizeof(unsigned long long) * kRadixBins, stream);
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks((n + kHistItems - 1) / kHistItems, kHistThreads);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    key_hist_kernel<T><<<grid, kHistThreads, 0, stream>>>(
        static_cast<const T*>(v), n, prefix, prefix_dev, prefix_shift, shift, mask, hist);
  });
}

void radix_walk(const unsigned long long* hist, int pass, long long kappa, long long* st,
                cudaStream_t stream) {
  radix_walk_kernel<<<1, kWalkThreads, 0, stream>>>(hist, radix::kDigits[pass].bits, pass == 0,
                                                    kappa, st);
}

void count_at_least(const void* v, DType dt, int64_t n, uint32_t thr, const long long* thr_dev,
                    long long* st, cudaStream_t stream) {
  cudaMemsetAsync(st + kStCountGe, 0, 2 * sizeof(long long), stream);
  if (n == 0) return;
  const int grid = detail::grid_stride_blocks((n + kCountItems - 1) / kCountItems, kCountThreads);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    count_at_least_kernel<T><<<grid, kCountThreads, 0, stream>>>(static_cast<const T*>(v), n,
                                                                 thr, thr_dev, st);
  });
}

size_t compact_temp_bytes(DType dt, int64_t n) {
  size_t bytes = 0;
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    cub::DeviceSelect::FlaggedIf(nullptr, bytes, thrust::counting_iterator<int64_t>(0),
                                 static_cast<const T*>(nullptr), static_cast<int64_t*>(nullptr),
                                 static_cast<long long*>(nullptr), n, KeyAtLeast<T>{0u});
  });
  return bytes;
}

cudaError_t compact_at_least(const void* v, DType dt, int64_t n, uint32_t thr, void* temp,
                             size_t temp_bytes, int64_t* out_idx, long long* num_selected,
                             cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    err = cub::DeviceSelect::FlaggedIf(temp, temp_bytes, thrust::counting_iterator<int64_t>(0),
                                       static_cast<const T*>(v), out_idx, num_selected, n,
                                       KeyAtLeast<T>{thr}, stream);
  });
  return err;
}

void gather(const void* v, DType dt, const int64_t* idx, int64_t m, void* out_v,
            cudaStream_t stream) {
  if (m == 0) return;
  const int grid = detail::grid_stride_blocks(m, 256);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    gather_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(v), idx, m,
                                               static_cast<T*>(out_v));
  });
}

int64_t select_workspace_elems(int64_t n) { return 2 * tiles_of(n) + 2; }

unsigned long long* select_totals(unsigned long long* workspace, int64_t n) {
  return workspace + 2 * tiles_of(n);
}

void select_count(const void* v, DType dt, int64_t n, long long thr, const long long* st,
                  unsigned long long* workspace, cudaStream_t stream) {
  const int64_t ntiles = tiles_of(n);
  if (ntiles > 0) {
    detail::by_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      select_count_kernel<T><<<static_cast<unsigned int>(ntiles), kSelectThreads, 0, stream>>>(
          static_cast<const T*>(v), n, thr, st, workspace, ntiles);
    });
  }
  tile_scan_kernel<<<1, kScanThreads, 0, stream>>>(workspace, ntiles);
}

void select_write(const void* v, DType dt, const int64_t* idx_in, int64_t n, long long thr,
                  long long need_eq, const long long* st, const unsigned long long* workspace,
                  void* out_v, void* out_i, int64_t cap, bool index64, cudaStream_t stream) {
  const int64_t ntiles = tiles_of(n);
  if (ntiles == 0) return;
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const auto grid = static_cast<unsigned int>(ntiles);
    if (index64) {
      select_write_kernel<T, int64_t><<<grid, kSelectThreads, 0, stream>>>(
          static_cast<const T*>(v), idx_in, n, thr, need_eq, st, workspace, ntiles,
          static_cast<T*>(out_v), static_cast<int64_t*>(out_i), cap);
    } else {
      select_write_kernel<T, int32_t><<<grid, kSelectThreads, 0, stream>>>(
          static_cast<const T*>(v), idx_in, n, thr, need_eq, st, workspace, ntiles,
          static_cast<T*>(out_v), static_cast<int32_t*>(out_i), cap);
    }
  });
}

void gather_sample(const void* x, DType dt, const float* add, int64_t s, int64_t stride,
                   float* out, cudaStream_t stream) {
  if (s == 0) return;
  const int grid = detail::grid_stride_blocks(s, 256);
  detail::by_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    gather_sample_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(x), add, s, stride,
                                                      out);
  });
}

}  // namespace pgc::cuda::kernels
