// Lab probe of the skinny linear kernel: times compiled tile variants (block_n x block_k, warps,
// stages) at every K split from 1 to 16 on the bench's shapes, L2 flushed by a zero fill before each
// run, median of 30. Prints the best split per variant. Self-contained: fills LinearParams directly.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/linear_probe.cu -o linear_probe && ./linear_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

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

}  // namespace

int main() {
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
