// Lab probe of the skinny linear kernels: times compiled tile variants (block_n x block_k, warps,
// stages) of the cp.async kernel at every K split from 1 to 16 on the bench's shapes, L2 flushed by a
// zero fill before each run, median of 30, and prints the best split per variant. `./linear_probe gemv`
// times the GEMV kernel's variants (rows per CTA, warps, chunks per round) on a Llama-1B step's
// projections and 4096 x 4096 instead, next to a device copy of the weight's bytes timed the same way.
// Self-contained: fills LinearParams directly.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/linear_probe.cu -o linear_probe && ./linear_probe [gemv]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "linear/kernels/linear_gemv.cuh"
#include "linear/kernels/linear_reduce.cuh"
#include "linear/kernels/linear_skinny.cuh"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

using kfdev::median_us;

template <int kBlockN, int kBlockK, int kWarps, int kStages>
void variant(const kf::LinearParams& p, float* ws) {
  using T = __nv_bfloat16;
  constexpr int smem = kStages * (16 + kBlockN) * (kBlockK + kf::kLinearPad) * 2;
  auto kernel = kf::skinny::linear_skinny_kernel<T, kBlockN, kBlockK, kWarps, kStages>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * kWarps, smem);
  float best = 1e30f;
  int best_s = 0;
  for (int s = 1; s <= 16; ++s) {
    const float us = median_us([&] {
      kernel<<<dim3(unsigned((p.N + kBlockN - 1) / kBlockN), s), 32 * kWarps, smem>>>(p, s, ws);
      if (s > 1) kf::skinny::linear_reduce_kernel<T><<<unsigned((p.M * p.N + 255) / 256), 256>>>(p, s, ws);
    });
    if (us < best) best = us, best_s = s;
  }
  const double gbs = double(p.N) * p.K * 2 / best * 1e-3;
  std::printf("  %3dx%-3d warps=%d stages=%d (%d/SM, %3d KB): best splits=%2d  %7.1f us  %6.0f GB/s\n", kBlockN,
              kBlockK, kWarps, kStages, per_sm, smem / 1024, best_s, best, gbs);
}

template <int kM, int kRows, int kWarps, int kUnroll>
void gemv_variant(const kf::LinearParams& p, float copy_us) {
  auto kernel = kf::skinny::linear_gemv_kernel<__nv_bfloat16, kM, kRows, kWarps, kUnroll>;
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * kWarps, 0);
  const float us = median_us([&] { kernel<<<unsigned((p.N + kRows - 1) / kRows), 32 * kWarps>>>(p); });
  std::printf("  gemv rows=%d warps=%d unroll=%d (%2d/SM): %7.1f us  %6.0f GB/s  %5.1f %% of copy\n", kRows, kWarps,
              kUnroll, per_sm, us, double(p.N) * p.K * 2 / us * 1e-3, copy_us / us * 100);
}

template <int kM>
void gemv_variants(const kf::LinearParams& p, float copy_us) {
  gemv_variant<kM, 4, 4, 2>(p, copy_us);  // the library's tile
  gemv_variant<kM, 2, 4, 2>(p, copy_us);
  gemv_variant<kM, 8, 4, 2>(p, copy_us);
  gemv_variant<kM, 4, 4, 1>(p, copy_us);
  gemv_variant<kM, 4, 4, 4>(p, copy_us);
  gemv_variant<kM, 4, 8, 1>(p, copy_us);
  gemv_variant<kM, 4, 8, 2>(p, copy_us);
  gemv_variant<kM, 2, 8, 2>(p, copy_us);
  gemv_variant<kM, 8, 2, 2>(p, copy_us);
  gemv_variant<kM, 1, 8, 2>(p, copy_us);
}

int gemv_main() {
  struct Shape {
    int M;
    long N, K;
  };
  // 4096 x 4096, then a Llama-1B step's W_qkv, W_o, W_gate_up, W_down and LM head; then M = 4.
  const Shape shapes[] = {{1, 4096, 4096}, {1, 3072, 2048},   {1, 2048, 2048}, {1, 16384, 2048},
                          {1, 2048, 8192}, {1, 128256, 2048}, {4, 4096, 4096}};
  for (const Shape& s : shapes) {
    void *x, *w, *y, *copy;
    const size_t wb = size_t(s.N) * s.K * 2;
    cudaMalloc(&x, size_t(s.M) * s.K * 2), cudaMalloc(&w, wb), cudaMalloc(&y, size_t(s.M) * s.N * 2);
    cudaMalloc(&copy, wb);
    cudaMemset(w, 0x3c, wb), cudaMemset(x, 0x3c, size_t(s.M) * s.K * 2);
    kf::LinearParams p;
    p.x = x, p.w = w, p.y = y, p.ldx = s.K, p.ldw = s.K, p.ldy = s.N, p.M = s.M, p.N = s.N, p.K = s.K, p.vec16 = true;
    p.gemv = true;
    const float copy_us = median_us([&] { cudaMemcpyAsync(copy, w, wb, cudaMemcpyDeviceToDevice); });
    std::printf("M=%d N=%ld K=%ld: copy of %.1f MB %.1f us (%.0f GB/s)\n", s.M, s.N, s.K, wb / 1e6, copy_us,
                wb / copy_us * 1e-3);
    if (s.M == 1)
      gemv_variants<1>(p, copy_us);
    else
      gemv_variants<4>(p, copy_us);
    cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(copy);
  }
  std::printf("status: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "gemv") return gemv_main();
  struct Shape {
    int M;
    long N, K;
  };
  const Shape shapes[] = {{1, 4096, 4096}, {16, 14336, 4096}, {1, 14336, 4096}, {16, 4096, 14336}, {8, 6144, 4096}};
  for (const Shape& s : shapes) {
    void *x, *w, *y;
    float* ws;
    cudaMalloc(&x, size_t(s.M) * s.K * 2), cudaMalloc(&w, size_t(s.N) * s.K * 2), cudaMalloc(&y, size_t(s.M) * s.N * 2);
    cudaMalloc(&ws, size_t(16) * s.M * s.N * 4);
    cudaMemset(w, 0x3c, size_t(s.N) * s.K * 2), cudaMemset(x, 0x3c, size_t(s.M) * s.K * 2);
    kf::LinearParams p;
    p.x = x, p.w = w, p.y = y, p.ldx = s.K, p.ldw = s.K, p.ldy = s.N, p.M = s.M, p.N = s.N, p.K = s.K, p.vec16 = true;
    std::printf("M=%d N=%ld K=%ld\n", s.M, s.N, s.K);
    variant<128, 64, 4, 4>(p, ws);
    variant<128, 64, 4, 3>(p, ws);
    variant<128, 64, 4, 6>(p, ws);
    variant<64, 64, 2, 4>(p, ws);
    variant<64, 64, 2, 6>(p, ws);
    variant<256, 64, 8, 4>(p, ws);
    variant<128, 128, 4, 3>(p, ws);
    variant<64, 128, 2, 4>(p, ws);
    cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(ws);
  }
  std::printf("status: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
