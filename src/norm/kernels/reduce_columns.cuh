// Column sums of the backward's float32 partial rows (after every backward kind).
// Why it exists: a deterministic reduction of the per-block column sums (no atomics): the parameter
// gradients are bit-identical run to run.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Column sums of the backward's float32 partial rows, for up to two slabs (A and D) in one launch:
//   out_s[o, c] = Σ_{r < R} f_r[c] · part_s[(o·R + r)·ld + c]
// with f_r[c] = 1 + scale[r·scale_stride + c] when `scale` is given (AdaLN's Σ_g (1 + scale_g)·A_g),
// else 1. Block (8, 32): thread x owns 4 adjacent columns (one float4 per row), thread y sums the rows
// r ≡ y (mod 32) in order, keeping kColUnroll float4 loads in flight; then y = 0 adds the 32 slices
// in order. The order is fixed, so the result is bit-identical on every run. Bytes: the slabs are
// read once (R·ld·4 B each); at R ~ 1000 partial rows and N = 2048 that is 8 MB per slab, so the
// load parallelism matters (the previous 4-byte, 8-slice version ran at a fraction of the bandwidth).
constexpr int kColTileX = 8, kColTileY = 32, kColUnroll = 8;
template <typename OutT, typename T>
struct ColSums {
  const float* part[2];
  OutT* out[2];
  int64_t n, ld, R, out_rows;
  int64_t out_ld;  // row stride of the outputs: ld (float partial-layout rows) or n (parameter gradients)
  const T* scale;
  int64_t scale_stride;
};

template <typename OutT, typename T>
__global__ void __launch_bounds__(kColTileX* kColTileY) reduce_columns(const ColSums<OutT, T> a) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    __shared__ float4 sm[kColTileY][kColTileX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (int64_t(blockIdx.x) * kColTileX + tx) * 4;  // first of this thread's 4 columns
    const float* __restrict__ part = a.part[blockIdx.z];
    OutT* __restrict__ out = a.out[blockIdx.z];
    for (int64_t o = blockIdx.y; o < a.out_rows; o += gridDim.y) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c0 < a.ld) {
        const float* src = part + o * a.R * a.ld + c0;
        for (int64_t r0 = ty; r0 < a.R; r0 += int64_t(kColTileY) * kColUnroll) {
          float4 v[kColUnroll];
#pragma unroll
          for (int u = 0; u < kColUnroll; ++u) {  // all loads first: kColUnroll x 16 B in flight
            const int64_t r = r0 + int64_t(u) * kColTileY;
            v[u] = r < a.R ? *reinterpret_cast<const float4*>(src + r * a.ld) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < kColUnroll; ++u) {
            const int64_t r = r0 + int64_t(u) * kColTileY;
            float f[4] = {1.f, 1.f, 1.f, 1.f};
            if (a.scale && r < a.R) {
#pragma unroll
              for (int q = 0; q < 4; ++q)
                if (c0 + q < a.n) f[q] = 1.f + to_float(a.scale[r * a.scale_stride + c0 + q]);
            }
            s.x += f[0] * v[u].x;
            s.y += f[1] * v[u].y;
            s.z += f[2] * v[u].z;
            s.w += f[3] * v[u].w;
          }
        }
      }
      sm[ty][tx] = s;
      __syncthreads();
      if (ty == 0 && c0 < a.n) {
        float4 tot = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < kColTileY; ++k) {
          tot.x += sm[k][tx].x;
          tot.y += sm[k][tx].y;
          tot.z += sm[k][tx].z;
          tot.w += sm[k][tx].w;
        }
        const float t4[4] = {tot.x, tot.y, tot.z, tot.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (c0 + q >= a.n) break;
          out[o * a.out_ld + c0 + q] = from_float<OutT>(t4[q]);
        }
      }
      __syncthreads();
    }
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
