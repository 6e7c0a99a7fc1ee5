// Device helpers shared by the mma.sync attention kernels (attention_fwd_mma.cuh, attention_bwd_mma.cuh):
// cp.async copies, ldmatrix, mma.sync m16n8k16 and the shared-memory tile loader (packing, exp2 and
// tanh: elementwise.cuh). sm_80 instructions: callers guard their bodies with __CUDA_ARCH__ >= 800.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4; pairs of T packed in a 32-bit
// register, the lower column in the low half):
//   A 16x16 (row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (col): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C 16x8       : c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// ldmatrix .x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, register i receives it
// (non-trans: thread holds row g, columns 2t..2t+1; .trans: rows 2t..2t+1 of column g).
// The three lane-address patterns the kernels use, for a matrix stored row-major in shared memory:
//   A of a 16x16 block at (r0, c0), stored [row][k]:  row r0 + lane % 16, column c0 + 8 (lane / 16)
//   B pair (n8 tiles n0, n0 + 8) of a matrix stored [n][k] (B[k][n] = M[n][k]), non-trans:
//     row n0 + lane % 8 + 8 (lane / 16), column k0 + 8 ((lane / 8) % 2) -> b0, b1 of n0; b0, b1 of n0 + 8
//   B pair of a matrix stored [k][n] (B[k][n] = M[k][n]), .trans:
//     row k0 + lane % 16, column n0 + 8 (lane / 16) -> b0, b1 of n0; b0, b1 of n0 + 8
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_fwd_mma_config.h"
#include "attention/kernels/elementwise.cuh"

namespace kernelforge {
namespace attn_mma {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4-byte global -> shared copy (a float); valid = false fills zeros and reads nothing.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b, m16n8k16, fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Copies rows [0, kRows) x columns [0, kDim) of a global tile (row stride src_stride elements) into
// shared memory (row stride kDim + kAttnMmaPad); rows >= valid_rows are zero-filled. vec16: 16-byte
// cp.async (every source row 16-byte aligned); otherwise element loads and 16-byte shared stores.
template <int kRows, int kDim, int kThreads>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t src_stride, int valid_rows,
                                          bool vec16) {
  constexpr int kChunks = kDim / 8;  // 16-byte chunks per row
  constexpr int kStride = kDim + kAttnMmaPad;
  static_assert((kRows * kChunks) % kThreads == 0, "a tile must split evenly over the threads");
  if (vec16) {
    if constexpr (kThreads % kChunks == 0) {
      // A thread copies the same 16-byte column of rows r0, r0 + kRowStep, ...: one source pointer
      // stepped by kRowStep rows (few live registers across the key loop).
      constexpr int kRowStep = kThreads / kChunks;
      const int r0 = int(threadIdx.x) / kChunks, cc = int(threadIdx.x) % kChunks;
      const uint16_t* s = src + r0 * src_stride + cc * 8;
      const uint32_t d = smem_addr(dst + r0 * kStride + cc * 8);
#pragma unroll
      for (int i = 0; i < kRows / kRowStep; ++i) {
        const bool ok = r0 + i * kRowStep < valid_rows;
        cp_async16(d + i * kRowStep * kStride * 2, ok ? s : src, ok);
        s += kRowStep * src_stride;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
        const int c = int(threadIdx.x) + i * kThreads;
        const int r = c / kChunks, cc = c % kChunks;
        const bool ok = r < valid_rows;
        const uint16_t* s = src + (ok ? r * src_stride + cc * 8 : 0);
        cp_async16(smem_addr(dst + r * kStride + cc * 8), s, ok);
      }
    }
  } else {
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
      const int c = int(threadIdx.x) + i * kThreads;
      const int r = c / kChunks, cc = c % kChunks;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (r < valid_rows) {
        const uint16_t* s = src + r * src_stride + cc * 8;
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(s[2 * e]) | (uint32_t(s[2 * e + 1]) << 16);
      }
      *reinterpret_cast<uint4*>(dst + r * kStride + cc * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

}  // namespace attn_mma

}  // namespace kernelforge
