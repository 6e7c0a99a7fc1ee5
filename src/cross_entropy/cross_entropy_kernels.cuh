// Cross-entropy kernels: forward (partials -> per-row loss -> reduction) and backward (one pass).
//
// Forward, per row i (z = softcapped logits, computed in the log2 domain: u_j = z_j * log2(e)):
//   1. ce_fwd_partial: grid = rows x segments of kCeSegment elements, 256 threads. Each CTA reads its
//      segment once (16-byte loads, kIters vectors in flight per thread) and writes one float4
//      (max u, sum 2^(u - max), sum z, 0). Splitting rows into segments keeps ~8 CTAs of work per
//      row at V = 128256, so the grid has tens of thousands of CTAs and no tail: the forward reads
//      the logits once at copy speed (4096 x 128256 bf16 = 1.05 GB -> ~330 us at 3.2 TB/s read).
//   2. ce_fwd_finalize: one thread per row combines the row's partials into lse, reads z_target
//      (one scalar load) and writes row_loss and lse; each block writes (sum of its row losses,
//      its valid rows) to the workspace.
//   3. ce_fwd_reduce (mean/sum): one block sums the block partials in a fixed order (deterministic)
//      and writes loss and valid.
// Backward (ce_bwd): grid = rows x tiles of 256 threads x kIters vectors; reads the logits once and
// writes the gradient once (dlogits may be the logits themselves: each element is read and then
// written by the same thread). An ignored row writes zeros without reading the logits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {

constexpr int kCeThreads = 256;  // threads of the partial and backward CTAs
constexpr int kCeIters = 4;      // 16-byte vectors in flight per thread (forward): 64 B x 256
                                 // threads x 4 CTAs = 64 KB per SM, ~3x what hides DRAM latency
constexpr int kCeSegVecs = 8;    // 16-byte vectors per thread per segment (2 chunks of kCeIters)
constexpr int kCeBwdIters = 4;   // vectors per thread (backward: a tile of 256 x 4 x kVec elements)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A segment: kCeThreads * kCeSegVecs 16-byte vectors (16384 bf16/fp16 or 8192 fp32 logits), read in
// chunks of kCeThreads * kCeIters vectors (elements on the scalar path for unaligned rows).
template <typename T>
constexpr int ce_seg_len() {
  return kCeThreads * kCeSegVecs * int(16 / sizeof(T));
}

__device__ __forceinline__ float ex2(float x) {  // 2^x, MUFU.EX2 (2^-inf = 0)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int64_t ce_target(const CeParams& p, int64_t i) {
  return p.target64 ? static_cast<const int64_t*>(p.target)[i * p.target_stride]
                    : int64_t(static_cast<const int32_t*>(p.target)[i * p.target_stride]);
}

// z = softcap * tanh(x / softcap) when kSoftcap.
template <bool kSoftcap>
__device__ __forceinline__ float ce_cap(float x, float softcap, float inv_softcap) {
  if constexpr (kSoftcap) return softcap * tanhf(x * inv_softcap);
  (void)softcap, (void)inv_softcap;
  return x;
}

// Combines (m, s) pairs of sums of 2^(u - m): the larger max wins and the other sum is rescaled.
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * ex2(m - mn) + s2 * ex2(m2 - mn);
  m = mn;
}

// ---- forward: partials ---------------------------------------------------------------------------
// kBody (rows not 16-byte aligned, e.g. an odd vocabulary): the row's first hd < kVec logits, up to
// the next 16-byte boundary, are a scalar head taken by segment 0's first hd threads; the segments
// and their 16-byte vectors start after it.
template <typename T, int kVec, bool kSoftcap, bool kBody = false>
__global__ void __launch_bounds__(kCeThreads, 4) ce_fwd_partial(const CeParams p, const int segs, float4* part) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    const int64_t row = blockIdx.x / segs;
    const int seg = blockIdx.x - int(row * segs);
    const T* x = static_cast<const T*>(p.logits) + row * p.ld;
    int n = int(p.vocab);
    const float inv_cap = kSoftcap ? 1.f / p.softcap : 0.f;
    float m = -INFINITY, s = 0.f, sz = 0.f;
    if constexpr (kBody) {
      const int hd = head_elems(x, n);
      if (seg == 0 && int(threadIdx.x) < hd) {  // (m, s) = (u, 1); a NaN logit makes m NaN
        const float z = ce_cap<kSoftcap>(to_float(x[threadIdx.x]), p.softcap, inv_cap);
        sz = z;
        if (z != -INFINITY) m = z * kLog2e, s = 1.f;
      }
      x += hd, n -= hd;
    }
    const int seg0 = seg * ce_seg_len<T>();
    const int seg1 = min(n, seg0 + ce_seg_len<T>());
    // The segment in chunks of kCeThreads * kCeIters * kVec elements (two on the vector path).
    for (int c0 = seg0; c0 < seg1; c0 += kCeThreads * kCeIters * kVec) {
      Vec<T, kVec> v[kCeIters];
#pragma unroll
      for (int it = 0; it < kCeIters; ++it) {  // all loads first: kCeIters x 16 B in flight
        const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
        if (j + kVec <= seg1) {
          v[it] = load_vec<T, kVec>(x + j);
        } else {
          v[it] = Vec<T, kVec>::zero();
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            if (j + e < seg1) v[it].set(e, to_float(x[j + e]));
        }
      }
      // Two sweeps over the registers (max, then the sum of exponentials); elements past the
      // segment end count as -inf (and 0 in the sum of logits). A chunk wholly inside the segment
      // (every chunk of the vector path but a row's last) skips the bounds checks.
      const bool full = c0 + kCeThreads * kCeIters * kVec <= seg1;
      float cm = -INFINITY;
#pragma unroll
      for (int it = 0; it < kCeIters; ++it) {
        const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const bool in = full || j + e < seg1;
          const float z = in ? ce_cap<kSoftcap>(v[it].get(e), p.softcap, inv_cap) : -INFINITY;
          sz += in ? z : 0.f;
          cm = fmaxf(cm, z);
        }
      }
      cm *= kLog2e;
      float cs = 0.f;
      if (cm != -INFINITY) {
#pragma unroll
        for (int it = 0; it < kCeIters; ++it) {
          const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const bool in = full || j + e < seg1;
            const float z = in ? ce_cap<kSoftcap>(v[it].get(e), p.softcap, inv_cap) : -INFINITY;
            cs += ex2(fmaf(z, kLog2e, -cm));
          }
        }
      }
      ms_combine(m, s, cm, cs);
    }
    // Block reduction of (m, s, sz): warps by shuffles, then warp 0 over the warps' results.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      sz += __shfl_xor_sync(0xffffffffu, sz, o);
      ms_combine(m, s, m2, s2);
    }
    __shared__ float3 warp_part[kCeThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_part[warp] = make_float3(m, s, sz);
    __syncthreads();
    if (warp == 0) {
      float3 w = lane < kCeThreads / 32 ? warp_part[lane] : make_float3(-INFINITY, 0.f, 0.f);
#pragma unroll
      for (int o = kCeThreads / 64; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, w.x, o), s2 = __shfl_xor_sync(0xffffffffu, w.y, o);
        w.z += __shfl_xor_sync(0xffffffffu, w.z, o);
        ms_combine(w.x, w.y, m2, s2);
      }
      if (lane == 0) part[blockIdx.x] = make_float4(w.x, w.y, w.z, 0.f);
    }
  }
}

// ---- forward: per-row loss ---------------------------------------------------------------------
// A NaN logit makes the row's max/sum NaN and so its loss, as in PyTorch.
template <typename T, bool kSoftcap>
__global__ void __launch_bounds__(kCeFinalizeBlock)
    ce_fwd_finalize(const CeParams p, const int segs, const float4* part, float2* block_part) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * kCeFinalizeBlock + threadIdx.x;
    float loss = 0.f, valid = 0.f;
    if (i < p.rows) {
      float m = -INFINITY, s = 0.f, sz = 0.f;
      for (int k = 0; k < segs; ++k) {  // a NaN logit makes s (and so lse and the loss) NaN
        const float4 q = part[i * segs + k];
        sz += q.z;
        ms_combine(m, s, q.x, q.y);
      }
      float lse = (m + __log2f(s)) * kLn2;  // log sum exp(z) = ln2 * (m + log2 s)
      const int64_t t = ce_target(p, i);
      if (t != p.ignore_index) {
        valid = 1.f;
        if (t < 0 || t >= p.vocab) {  // no defined loss: a NaN row (documented device-side check)
          loss = lse = NAN;
        } else {
          const T* x = static_cast<const T*>(p.logits) + i * p.ld;
          const float zt = ce_cap<kSoftcap>(to_float(x[t]), p.softcap, kSoftcap ? 1.f / p.softcap : 0.f);
          loss = lse - (1.f - p.smoothing) * zt;
          if (p.smoothing > 0.f) loss -= p.smoothing / float(p.vocab) * sz;
          if (p.z_loss > 0.f) loss += p.z_loss * lse * lse;
        }
      }
      p.row_loss[i] = loss;
      p.lse_out[i] = lse;
    }
    // Block sums of (loss, valid) in a fixed order: deterministic.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      loss += __shfl_xor_sync(0xffffffffu, loss, o);
      valid += __shfl_xor_sync(0xffffffffu, valid, o);
    }
    __shared__ float2 warp_part[kCeFinalizeBlock / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_part[warp] = make_float2(loss, valid);
    __syncthreads();
    if (threadIdx.x == 0) {
      float2 b = make_float2(0.f, 0.f);
      for (int w = 0; w < kCeFinalizeBlock / 32; ++w) b.x += warp_part[w].x, b.y += warp_part[w].y;
      block_part[blockIdx.x] = b;
    }
  }
}

// ---- forward: the reduction (one block; fixed order) ----------------------------------------------
constexpr int kCeReduceThreads = 512;
template <typename T>  // T: one instantiation per dtype file (the kernel itself does not read logits)
__global__ void __launch_bounds__(kCeReduceThreads)
    ce_fwd_reduce(const CeParams p, const float2* block_part, const int nblocks) {
  pdl_wait();
  float loss = 0.f, valid = 0.f;
  for (int b = threadIdx.x; b < nblocks; b += kCeReduceThreads) loss += block_part[b].x, valid += block_part[b].y;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    loss += __shfl_xor_sync(0xffffffffu, loss, o);
    valid += __shfl_xor_sync(0xffffffffu, valid, o);
  }
  __shared__ float2 warp_part[kCeReduceThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_part[warp] = make_float2(loss, valid);
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = make_float2(0.f, 0.f);
    for (int w = 0; w < kCeReduceThreads / 32; ++w) t.x += warp_part[w].x, t.y += warp_part[w].y;
    *p.valid_out = t.y;
    if (p.reduction == Reduction::kMean)
      *p.loss = t.x / t.y;  // 0 / 0 = NaN when every row is ignored, as PyTorch
    else if (p.reduction == Reduction::kSum)
      *p.loss = t.x;
  }
}

// ---- backward ------------------------------------------------------------------------------------
//   dlogits_j = G (p_j (1 + 2 z lse) - (1 - eps) [j == t] - eps / V) * (softcap ? 1 - (z_j / c)^2 : 1)
// with p_j = 2^(u_j - lse * log2 e). Traffic: read + write of the logits (2 passes).
// kBody: as in ce_fwd_partial, tile 0's first hd threads take the row's scalar head (logits and
// dlogits share their misalignment), the tiles start after it.
template <typename T, int kVec, bool kSoftcap, bool kBody = false>
__global__ void __launch_bounds__(kCeThreads) ce_bwd(const CeParams p, const int tiles) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    const int64_t row = blockIdx.x / tiles;
    const int tile = blockIdx.x - int(row * tiles);
    int n = int(p.vocab);
    constexpr int kTile = kCeThreads * kCeBwdIters * kVec;
    const int j0 = tile * kTile;
    T* dx = static_cast<T*>(p.dlogits) + row * p.dld;
    const T* x = static_cast<const T*>(p.logits) + row * p.ld;
    const int hd = kBody ? head_elems(dx, n) : 0;
    const bool head = kBody && tile == 0 && int(threadIdx.x) < hd;  // this thread's head logit: j = threadIdx.x
    const int64_t t = ce_target(p, row);
    if (t == p.ignore_index) {  // zero gradient; the logits are not read
      if (head) dx[threadIdx.x] = from_float<T>(0.f);
      dx += hd, n -= hd;
#pragma unroll
      for (int it = 0; it < kCeBwdIters; ++it) {
        const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
        if (j + kVec <= n) {
          store_vec<T, kVec>(dx + j, Vec<T, kVec>::zero());
        } else {
          for (int e = 0; e < kVec && j + e < n; ++e) dx[j + e] = from_float<T>(0.f);
        }
      }
      return;
    }
    const float g = p.reduction == Reduction::kNone   ? p.dloss[row * p.dloss_stride]
                    : p.reduction == Reduction::kMean ? p.dloss[0] / p.valid[0]
                                                      : p.dloss[0];
    const float lse = p.lse[row];
    const float lse2 = lse * kLog2e;
    const float gp = p.z_loss > 0.f ? g * (1.f + 2.f * p.z_loss * lse) : g;  // coefficient of p_j
    const float gs = g * p.smoothing / float(p.vocab);                       // subtracted everywhere
    const float gt = g * (1.f - p.smoothing);                                // subtracted at the target
    const int tt = (t >= 0 && t < p.vocab) ? int(t) : -1;
    const float bad = (tt < 0) ? NAN : 0.f;  // out-of-range target: NaN row (documented)
    const float inv_cap = kSoftcap ? 1.f / p.softcap : 0.f;
    // dlogits_j of one logit x_j (the formula above)
    auto grad = [&](float xj, int j) {
      const float z = ce_cap<kSoftcap>(xj, p.softcap, inv_cap);
      float r = gp * ex2(fmaf(z, kLog2e, -lse2)) - gs - (j == tt ? gt : 0.f) + bad;
      if constexpr (kSoftcap) {
        const float q = z * inv_cap;
        r *= 1.f - q * q;
      }
      return r;
    };
    if (head) dx[threadIdx.x] = from_float<T>(grad(to_float(x[threadIdx.x]), int(threadIdx.x)));
    x += hd, dx += hd, n -= hd;  // body indices j below are row indices j + hd
    Vec<T, kVec> v[kCeBwdIters];
#pragma unroll
    for (int it = 0; it < kCeBwdIters; ++it) {
      const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
      if (j + kVec <= n) {
        v[it] = load_vec<T, kVec>(x + j);
      } else {
        v[it] = Vec<T, kVec>::zero();
        for (int e = 0; e < kVec && j + e < n; ++e) v[it].set(e, to_float(x[j + e]));
      }
    }
#pragma unroll
    for (int it = 0; it < kCeBwdIters; ++it) {
      const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
      float d[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) d[e] = grad(v[it].get(e), j + e + hd);
      if (j + kVec <= n) {
        store_vec<T, kVec>(dx + j, Vec<T, kVec>::from(d));
      } else {
        for (int e = 0; e < kVec && j + e < n; ++e) dx[j + e] = from_float<T>(d[e]);
      }
    }
  }
}

// ---- launchers -------------------------------------------------------------------------------------
// Programmatic dependent launch on sm_90 (common/launch.cuh), from the capability in the params.
inline bool ce_pdl(const CeParams& p) {
  DeviceInfo dev;
  dev.capability = p.capability;
  return use_pdl(dev);
}

template <typename T>
bool ce_vector_ok(const void* ptr, int64_t ld) {
  constexpr int kVec = 16 / sizeof(T);
  return (reinterpret_cast<uintptr_t>(ptr) % 16 == 0) && (ld % kVec == 0);
}

// Rows not 16-byte aligned (an odd vocabulary with contiguous logits: session 14, 8192 x 32001 bf16
// took one-element loads) read a scalar head and then 16-byte vectors (kBody) when every row of the
// other tensor (dlogits) shares its misalignment: the distance between the two base pointers and
// the difference of their row strides are multiples of 16 bytes.
template <typename T>
bool ce_body_ok(const void* ptr, const void* other = nullptr, int64_t ld_diff = 0) {
  return reinterpret_cast<uintptr_t>(ptr) % sizeof(T) == 0 &&
         (other == nullptr || shares_misalignment(ptr, other, ld_diff * int64_t(sizeof(T))));
}

template <typename T, int kVec, bool kSoftcap, bool kBody>
Status ce_fwd_kernels(const CeParams& p, void* workspace, cudaStream_t stream) {
  const int segs = int(ceil_div(p.vocab, ce_seg_len<T>()));
  float4* part = static_cast<float4*>(workspace);
  const int64_t nfin = ceil_div(p.rows, kCeFinalizeBlock);
  float2* block_part = reinterpret_cast<float2*>(part + p.rows * segs);
  const bool pdl = ce_pdl(p);
  if (p.rows > 0) {
    Launch a(dim3(unsigned(p.rows * segs)), dim3(kCeThreads), 0, stream, pdl);
    Status s = launched(a(ce_fwd_partial<T, kVec, kSoftcap, kBody>, p, segs, part), "cross_entropy (partials)");
    if (!s.ok()) return s;
    Launch b(dim3(unsigned(nfin)), dim3(kCeFinalizeBlock), 0, stream, pdl);
    s = launched(b(ce_fwd_finalize<T, kSoftcap>, p, segs, static_cast<const float4*>(part), block_part),
                 "cross_entropy (row losses)");
    if (!s.ok()) return s;
  }
  Launch c(dim3(1), dim3(kCeReduceThreads), 0, stream, pdl);
  return launched(c(ce_fwd_reduce<T>, p, static_cast<const float2*>(block_part), int(nfin)),
                  "cross_entropy (reduction)");
}

template <typename T>
Status launch_ce_fwd(const CeParams& p, void* workspace, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool cap = p.softcap > 0.f;
  if (ce_vector_ok<T>(p.logits, p.ld))
    return cap ? ce_fwd_kernels<T, kVec, true, false>(p, workspace, stream)
               : ce_fwd_kernels<T, kVec, false, false>(p, workspace, stream);
  if (ce_body_ok<T>(p.logits) && tune("ce_body", 1) != 0)
    return cap ? ce_fwd_kernels<T, kVec, true, true>(p, workspace, stream)
               : ce_fwd_kernels<T, kVec, false, true>(p, workspace, stream);
  return cap ? ce_fwd_kernels<T, 1, true, false>(p, workspace, stream)
             : ce_fwd_kernels<T, 1, false, false>(p, workspace, stream);
}

template <typename T, int kVec, bool kSoftcap, bool kBody>
Status ce_bwd_kernel(const CeParams& p, cudaStream_t stream) {
  const int tiles = int(ceil_div(p.vocab, int64_t(kCeThreads) * kCeBwdIters * kVec));
  Launch a(dim3(unsigned(p.rows * tiles)), dim3(kCeThreads), 0, stream, ce_pdl(p));
  return launched(a(ce_bwd<T, kVec, kSoftcap, kBody>, p, tiles), "cross_entropy_backward");
}

template <typename T>
Status launch_ce_bwd(const CeParams& p, cudaStream_t stream) {
  if (p.rows == 0) return Status::Ok();
  constexpr int kVec = 16 / sizeof(T);
  const bool cap = p.softcap > 0.f;
  if (ce_vector_ok<T>(p.logits, p.ld) && ce_vector_ok<T>(p.dlogits, p.dld))
    return cap ? ce_bwd_kernel<T, kVec, true, false>(p, stream) : ce_bwd_kernel<T, kVec, false, false>(p, stream);
  if (ce_body_ok<T>(p.logits, p.dlogits, p.dld - p.ld) && tune("ce_body", 1) != 0)
    return cap ? ce_bwd_kernel<T, kVec, true, true>(p, stream) : ce_bwd_kernel<T, kVec, false, true>(p, stream);
  return cap ? ce_bwd_kernel<T, 1, true, false>(p, stream) : ce_bwd_kernel<T, 1, false, false>(p, stream);
}

#define KF_CE_DEFINE(T)                                                   \
  template Status launch_ce_fwd<T>(const CeParams&, void*, cudaStream_t); \
  template Status launch_ce_bwd<T>(const CeParams&, cudaStream_t);

}  // namespace kernelforge
