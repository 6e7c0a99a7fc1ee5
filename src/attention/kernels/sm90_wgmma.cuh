// Hopper (sm_90a) warpgroup tensor-core helpers for the attention kernels: shared-memory matrix
// descriptors, wgmma.mma_async m64nNk16 with float32 accumulators (A from shared memory or from
// registers), and the fences / commit / wait around them. Compiled to nothing outside sm_90a.
//
// Shared-memory operand layout used everywhere: the 128-byte swizzle that TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B. A tile of R rows x 64 16-bit columns is R rows of 128 bytes; within every
// 1024-byte atom of 8 rows, 16-byte chunk c of row r sits at chunk c ^ (r % 8). Tiles start 1024-byte
// aligned (the swizzle is a function of the absolute address bits 4-6 ^ 7-9).
//
// Descriptor (64 bits): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride
// byte offset >> 4 in 32-45, base offset 0 in 49-51, layout 1 (128-byte swizzle) in 62-63.
//   K-major operand (rows of 64 contiguous k): the stride byte offset is the step between 8-row atoms
//     (1024 bytes); the leading offset is unused for swizzled K-major layouts (1). The k-th 16-wide
//     slice of a 64-column tile starts 32 * k bytes further (the swizzle is applied after the add).
//   MN-major operand (V for P.V: rows are k, 64 contiguous n per row): the leading byte offset is the
//     step between 64-column tiles (R * 128 bytes), the stride byte offset the step between groups of
//     8 k-rows (1024 bytes); instruction flag "transpose B" = 1. An N = 32 operand may start 64 bytes
//     into the rows (columns 32..63 of a 64-column tile), as a K-major k-slice starts inside them.
// Accumulator fragment of m64nN (per thread of the warpgroup, warp w, lane l): d[4j + 2i + c] is row
// 16w + l/4 + 8i, column 8j + 2(l%4) + c. The register A fragment of m64nNk16 (4 x b32, two 16-bit
// values each): a[r] holds row 16w + l/4 + 8(r%2), columns 2(l%4) + 8(r/2) + {0, 1} - the
// accumulator layout of two 8-column blocks, so a P tile converts to A operands in place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/kernels/elementwise.cuh"
#include "common/sm90a.h"

namespace kernelforge {

__device__ __forceinline__ uint64_t gmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}
// K-major tile at `smem_addr` (R rows x 64 columns, 128-byte swizzle).
__device__ __forceinline__ uint64_t gmma_desc_k(uint32_t smem_addr) { return gmma_desc(smem_addr, 16, 1024); }
// MN-major tile: 64-column tiles `tile_bytes` apart.
__device__ __forceinline__ uint64_t gmma_desc_mn(uint32_t smem_addr, uint32_t tile_bytes) {
  return gmma_desc(smem_addr, tile_bytes, 1024);
}

// wgmma.fence: orders this warpgroup's register accesses before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() {
#if KF_SM90A
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if KF_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if KF_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}
// Keeps the compiler from moving accesses of registers that an asynchronous wgmma reads or writes
// across the fence (a volatile asm that "writes" them).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The instructions, one macro per shape; TY is the PTX input type (bf16 or f16).
#define KF_WGMMA_SS_N32(TY, TA, TB)                                                                                 \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"                                    \
      " %16, %17, p, 1, 1, " TA ", " TB ";\n}\n"                                                                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                    \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define KF_WGMMA_SS_N64(TY, TA, TB)                                                                                    \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                          \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31},"                                                                       \
      " %32, %33, p, 1, 1, " TA ", " TB ";\n}\n"                                                                       \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                      \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define KF_WGMMA_SS_N80(TY)                                                                                            \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY                                                          \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39},"                               \
      " %40, %41, p, 1, 1, 0, 0;\n}\n"                                                                                 \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),        \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])                      \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define KF_WGMMA_SS_N128(TY, TA, TB)                                                                                   \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                                         \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"                     \
      " %64, %65, p, 1, 1, " TA ", " TB ";\n}\n"                                                                       \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),        \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),        \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                      \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define KF_WGMMA_RS_N64(TY)                                                                                            \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                          \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31},"                                                                       \
      " {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

#define KF_WGMMA_RS_N128(TY)                                                                                           \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                                         \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"                     \
      " {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),        \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),        \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))

// One SS instruction of shape N with the operands' majors (TA, TB: "0" K-major, "1" MN-major).
#define KF_WGMMA_SS_MAJORS(N_MACRO, TY)            \
  if constexpr (kTransA == 0 && kTransB == 0)      \
    N_MACRO(TY, "0", "0");                         \
  else if constexpr (kTransA == 1 && kTransB == 1) \
    N_MACRO(TY, "1", "1");                         \
  else                                             \
    N_MACRO(TY, "0", "1");

// D[64 x N] (+)= A[64 x 16] * B[16 x N], A and B from shared memory, K-major (kTransA / kTransB 0) or
// MN-major (1: A's 64 rows, B's N columns contiguous); N = 32, 64 and 128 take both majors for
// either operand but A MN-major with B K-major, N = 80 K-major only.
// scale_d 0: D = A * B (the first k-slice); 1: accumulate.
template <typename T, int N, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if KF_SM90A
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  static_assert(N != 80 || (kTransA == 0 && kTransB == 0), "wgmma_ss: N = 80 with K-major operands only");
  static_assert(!(kTransA == 1 && kTransB == 0), "wgmma_ss: A MN-major with B K-major is not instantiated");
  if constexpr (N == 32) {
    if constexpr (kBf16) {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N32, "bf16")
    } else {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N32, "f16")
    }
  } else if constexpr (N == 64) {
    if constexpr (kBf16) {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N64, "bf16")
    } else {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N64, "f16")
    }
  } else if constexpr (N == 80) {
    if constexpr (kBf16)
      KF_WGMMA_SS_N80("bf16");
    else
      KF_WGMMA_SS_N80("f16");
  } else if constexpr (N == 128) {
    if constexpr (kBf16) {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N128, "bf16")
    } else {
      KF_WGMMA_SS_MAJORS(KF_WGMMA_SS_N128, "f16")
    }
  } else {
    static_assert(N == 32 || N == 64 || N == 80 || N == 128, "wgmma_ss: N must be 32, 64, 80 or 128");
  }
#else
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N], A from registers (the fragment above), B from shared memory,
// MN-major (transposed).
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if KF_SM90A
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64) {
    if constexpr (kBf16)
      KF_WGMMA_RS_N64("bf16");
    else
      KF_WGMMA_RS_N64("f16");
  } else if constexpr (N == 128) {
    if constexpr (kBf16)
      KF_WGMMA_RS_N128("bf16");
    else
      KF_WGMMA_RS_N128("f16");
  } else {
    static_assert(N == 64 || N == 128, "wgmma_rs: N must be 64 or 128");
  }
#else
  (void)d, (void)a, (void)desc_b, (void)scale_d;
#endif
}

#undef KF_WGMMA_SS_MAJORS
#undef KF_WGMMA_SS_N32
#undef KF_WGMMA_SS_N64
#undef KF_WGMMA_SS_N80
#undef KF_WGMMA_SS_N128
#undef KF_WGMMA_RS_N64
#undef KF_WGMMA_RS_N128

}  // namespace kernelforge
