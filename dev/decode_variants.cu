// Lab probe of decode attention tile variants (warps = keys per stage / 16, stages; and the head-group
// kernel's heads per CTA and stages) at split counts 1..64 (the split merge in the kernel's last CTA
// or warp) on the bench's shapes (GQA 32/8, d128, bf16, pages scattered), L2 flushed by a zero fill,
// median of 30; prints the best split per variant.
// Self-contained: fills DecodeParams directly.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        dev/decode_variants.cu -o decode_variants && ./decode_variants
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "decode/decode_config.h"
#include "decode/kernels/decode_attention.cuh"
#include "decode/kernels/decode_attention_heads.cuh"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

using kfdev::median_us;

template <int kWarps, int kStages>
void variant(const kf::DecodeParams& p, float* ws_o, float* ws_lse, int* counters, double bytes) {
  using T = __nv_bfloat16;
  constexpr int smem = int(kf::decode_smem_bytes(128, 16, kWarps, kStages));
  auto kernel = kf::decode::decode_attention_kernel<T, 128, 1, kWarps, kStages>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * kWarps, smem);
  float best = 1e30f;
  int best_s = 0;
  for (int s : {1, 2, 3, 4, 8, 16, 32, 64}) {
    const float us =
        median_us([&] { kernel<<<dim3(s, p.heads_kv, p.batch), 32 * kWarps, smem>>>(p, s, ws_o, ws_lse, counters); });
    if (us < best) best = us, best_s = s;
  }
  std::printf("  warps=%d (keys/stage %3d) stages=%d (%d/SM, %3d KB): best splits=%2d  %7.1f us  %6.0f GB/s\n", kWarps,
              16 * kWarps, kStages, per_sm, smem / 1024, best_s, best, bytes / best * 1e-3);
}

// The head-group kernel (kernels/decode_attention_heads.cuh): kHeads kv heads per CTA, 16 keys a stage.
template <int kHeads, int kStages>
void heads_variant(const kf::DecodeParams& p, float* ws_o, float* ws_lse, int* counters, double bytes) {
  using T = __nv_bfloat16;
  constexpr int smem = int(kf::decode_heads_smem_bytes(128, kHeads, kStages));
  auto kernel = kf::decode::decode_attention_heads_kernel<T, 128, kHeads, kStages>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  float best = 1e30f;
  int best_s = 0;
  const unsigned groups = unsigned((p.heads_kv + kHeads - 1) / kHeads);
  for (int s : {1, 2, 4, 8, 16, 32, 64}) {
    const float us =
        median_us([&] { kernel<<<dim3(s, groups, p.batch), 32 * kHeads, smem>>>(p, s, ws_o, ws_lse, counters); });
    if (us < best) best = us, best_s = s;
  }
  std::printf("  heads=%d stages=%d (%3d KB): best splits=%2d  %7.1f us  %6.0f GB/s\n", kHeads, kStages, smem / 1024,
              best_s, best, bytes / best * 1e-3);
}

}  // namespace

int main() {
  struct Shape {
    int B, kv, page;
  };
  const Shape shapes[] = {{1, 8192, 16}, {16, 4096, 16}, {64, 2048, 16}, {16, 4096, 1}};
  const int Hq = 32, Hkv = 8, D = 128;
  for (const Shape& s : shapes) {
    const long pages_per = s.kv / s.page, P = long(s.B) * pages_per;
    const size_t cache = size_t(P) * s.page * Hkv * D * 2;
    void *q, *kc, *vc, *out, *lens, *bt;
    float *wo, *wl;
    int* counters;
    cudaMalloc(&q, size_t(s.B) * Hq * D * 2), cudaMalloc(&out, size_t(s.B) * Hq * D * 2);
    cudaMalloc(&kc, cache), cudaMalloc(&vc, cache), cudaMalloc(&lens, s.B * 4), cudaMalloc(&bt, P * 4);
    cudaMalloc(&wo, size_t(64) * s.B * Hq * D * 4), cudaMalloc(&wl, size_t(64) * s.B * Hq * 4);
    cudaMalloc(&counters, size_t(s.B) * Hkv * 4), cudaMemset(counters, 0, size_t(s.B) * Hkv * 4);
    cudaMemset(kc, 0x3c, cache), cudaMemset(vc, 0x3c, cache), cudaMemset(q, 0x3c, size_t(s.B) * Hq * D * 2);
    std::vector<int> hl(s.B, s.kv), hb(P);
    for (long i = 0; i < P; ++i) hb[i] = int((i * 7919) % P);
    cudaMemcpy(lens, hl.data(), s.B * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(bt, hb.data(), P * 4, cudaMemcpyHostToDevice);
    kf::DecodeParams p;
    p.q = q, p.k_cache = kc, p.v_cache = vc, p.out = out, p.seq_lens = static_cast<int*>(lens);
    p.block_table = static_cast<int*>(bt);
    p.q_sb = Hq * D, p.q_st = Hq * D, p.q_sh = D, p.o_sb = Hq * D, p.o_st = Hq * D, p.o_sh = D;
    p.k_sp = long(s.page) * Hkv * D, p.k_st = Hkv * D, p.k_sh = D, p.v_sp = p.k_sp, p.v_st = p.k_st, p.v_sh = D;
    p.bt_sb = pages_per, p.batch = s.B, p.q_len = 1, p.heads_q = Hq, p.heads_kv = Hkv, p.group = Hq / Hkv;
    p.rows = p.group, p.head_dim = D, p.pages = int(P), p.page_size = s.page;
    p.page_shift = 0;
    while ((1 << p.page_shift) < s.page) ++p.page_shift;
    p.max_pages = int(pages_per), p.capacity = s.kv, p.scale = 0.088f, p.max_seq_len = s.kv;
    const double bytes = 2.0 * s.B * s.kv * Hkv * D * 2;
    std::printf("b%d kv%d page%d\n", s.B, s.kv, s.page);
    variant<4, 3>(p, wo, wl, counters, bytes);
    variant<4, 2>(p, wo, wl, counters, bytes);
    variant<4, 4>(p, wo, wl, counters, bytes);
    variant<2, 4>(p, wo, wl, counters, bytes);
    variant<2, 6>(p, wo, wl, counters, bytes);
    variant<8, 2>(p, wo, wl, counters, bytes);
    heads_variant<8, 2>(p, wo, wl, counters, bytes);
    heads_variant<4, 3>(p, wo, wl, counters, bytes);
    heads_variant<4, 2>(p, wo, wl, counters, bytes);  // 85 KB: two CTAs per SM
    heads_variant<2, 4>(p, wo, wl, counters, bytes);
    cudaFree(q), cudaFree(out), cudaFree(kc), cudaFree(vc), cudaFree(lens), cudaFree(bt), cudaFree(wo), cudaFree(wl),
        cudaFree(counters);
  }
  std::printf("status: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
