// Probe of the sm_90a attention kernel (attention_fwd_wgmma): runs it on a list of shapes against a
// naive float32 GPU reference (one warp per query row, online softmax) and prints the largest error of
// out and lse, then times the large shapes (TFLOP/s = 4 * B * Hq * Sq * Sk * D / t, halved for causal).
// Calls the kernel's launcher directly (no validation, no planner), so a wrong descriptor, swizzle or
// barrier shows up here first.
//
// Build standalone (from the repository root; no library needed):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc
//        -DKF_PROBE_STANDALONE dev/attention_wgmma_probe.cu -o attention_wgmma_probe
// or inside the lab build (cmake -S dev -B _build/lab -DKF_CUDA_ARCHS=90a-real; target
// attention_wgmma_probe). Run: ./attention_wgmma_probe [quick]   ("quick": correctness shapes only).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention/attention_fwd_wgmma_launch.cuh"

namespace kernelforge {
#ifdef KF_PROBE_STANDALONE
std::string to_string(const AttentionPlan& p) {
  return "attn_fwd_wgmma d=" + std::to_string(p.head_dim_qk) + "/" + std::to_string(p.head_dim_v) +
         " tile=" + std::to_string(p.block_m) + "x" + std::to_string(p.block_n);
}
#endif
}  // namespace kernelforge

using namespace kernelforge;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

template <typename T>
__device__ float ld(const T* p) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    return __bfloat162float(*p);
  else
    return __half2float(*p);
}

// One warp per (b, h, row): lanes own columns lane, lane + 32, ... of q/k (Dqk) and of v/out (Dv).
template <typename T>
__global__ void reference_attention(AttentionParams p, float* out, float* lse) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int rows = p.seqlen_q;
  if (warp >= p.batch * p.heads_q * rows) return;
  const int i = warp % rows, h = (warp / rows) % p.heads_q, b = warp / (rows * p.heads_q);
  const int sq = p.seqlen_q, sk = p.seqlen_k, hk = h / p.group, d = sk - sq;
  const T* q = static_cast<const T*>(p.q) + b * p.q_sb + int64_t(i) * p.q_ss + h * p.q_sh;
  float qr[8], acc[8];
  for (int c = 0; c < 8; ++c) {
    qr[c] = lane + 32 * c < p.head_dim_qk ? ld(q + lane + 32 * c) : 0.0f;
    acc[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < sk; ++j) {
    if (p.window_left >= 0 && j < i + d - p.window_left) continue;
    if (p.window_right >= 0 && j > i + d + p.window_right) continue;
    const T* k = static_cast<const T*>(p.k) + b * p.k_sb + int64_t(j) * p.k_ss + hk * p.k_sh;
    const T* v = static_cast<const T*>(p.v) + b * p.v_sb + int64_t(j) * p.v_ss + hk * p.v_sh;
    float dot = 0.0f;
    for (int c = 0; c < 8; ++c)
      if (lane + 32 * c < p.head_dim_qk) dot += qr[c] * ld(k + lane + 32 * c);
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float s = dot * p.scale;
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    const float mn = fmaxf(m, s), a = expf(m - mn), e = expf(s - mn);
    l = l * a + e;
    for (int c = 0; c < 8; ++c)
      if (lane + 32 * c < p.head_dim_v) acc[c] = acc[c] * a + e * ld(v + lane + 32 * c);
    m = mn;
  }
  if (p.sinks != nullptr) {
    const float sink = static_cast<const float*>(p.sinks)[h];
    const float mn = fmaxf(m, sink), a = m == -INFINITY ? 0.0f : expf(m - mn);
    l = l * a + expf(sink - mn);
    for (int c = 0; c < 8; ++c) acc[c] *= a;
    m = mn;
  }
  const int64_t row = (int64_t(b) * p.heads_q + h) * sq + i;  // reference outputs: [B, Hq, Sq, Dv]
  for (int c = 0; c < 8; ++c)
    if (lane + 32 * c < p.head_dim_v) out[row * p.head_dim_v + lane + 32 * c] = l > 0.0f ? acc[c] / l : 0.0f;
  if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <typename T>
__global__ void compare(AttentionParams p, const float* ref_out, const float* ref_lse, float* err) {
  const int64_t n = int64_t(p.batch) * p.heads_q * p.seqlen_q;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < n; r += int64_t(gridDim.x) * blockDim.x) {
    const int i = r % p.seqlen_q, h = (r / p.seqlen_q) % p.heads_q, b = r / (int64_t(p.seqlen_q) * p.heads_q);
    const T* o = static_cast<const T*>(p.out) + b * p.o_sb + int64_t(i) * p.o_ss + h * p.o_sh;
    float e = 0.0f;
    for (int c = 0; c < p.head_dim_v; ++c) {
      const float x = ld(o + c), y = ref_out[r * p.head_dim_v + c];
      e = fmaxf(e, x == x ? fabsf(x - y) : INFINITY);  // NaN (an unwritten row): infinite error
    }
    atomicMax(reinterpret_cast<int*>(&err[0]), __float_as_int(e));
    if (p.lse != nullptr) {
      const float x = p.lse[b * p.lse_sb + h * p.lse_sh + i], y = ref_lse[r];
      const float le = (x == y) ? 0.0f : (x == x ? fabsf(x - y) : INFINITY);
      atomicMax(reinterpret_cast<int*>(&err[1]), __float_as_int(le));
    }
  }
}

struct Case {
  int b, hq, hkv, sq, sk, dqk, dv;
  bool bhsd, causal;
  int wl, wr;
  float softcap;
  bool sinks, time;
};

template <typename T>
void run(const Case& c) {
  const int64_t nq = int64_t(c.b) * c.hq * c.sq * c.dqk, nk = int64_t(c.b) * c.hkv * c.sk * c.dqk,
                nv = int64_t(c.b) * c.hkv * c.sk * c.dv, no = int64_t(c.b) * c.hq * c.sq * c.dv;
  const int64_t rows = int64_t(c.b) * c.hq * c.sq;
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](int64_t n) {
    std::vector<T> h(n);
    for (auto& x : h) x = T(u(gen));
    T* d;
    CK(cudaMalloc(&d, n * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  };
  T *q = fill(nq), *k = fill(nk), *v = fill(nv), *o;
  float *lse, *ref_o, *ref_lse, *err, *sinks = nullptr;
  CK(cudaMalloc(&o, no * sizeof(T)));
  CK(cudaMemset(o, 0xff, no * sizeof(T)));  // NaN: rows the kernel does not write fail
  CK(cudaMalloc(&lse, rows * sizeof(float)));
  CK(cudaMemset(lse, 0xff, rows * sizeof(float)));
  CK(cudaMalloc(&ref_o, no * sizeof(float)));
  CK(cudaMalloc(&ref_lse, rows * sizeof(float)));
  CK(cudaMalloc(&err, 2 * sizeof(float)));
  CK(cudaMemset(err, 0, 2 * sizeof(float)));
  if (c.sinks) {
    std::vector<float> hs(c.hq);
    for (auto& x : hs) x = 2.0f * u(gen);
    CK(cudaMalloc(&sinks, c.hq * sizeof(float)));
    CK(cudaMemcpy(sinks, hs.data(), c.hq * sizeof(float), cudaMemcpyHostToDevice));
  }
  AttentionParams p;
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse, p.sinks = sinks, p.sinks_float = true;
  auto strides = [&](int h, int s, int d, int64_t& sb, int64_t& ss, int64_t& sh) {
    sb = int64_t(h) * s * d;
    ss = c.bhsd ? d : int64_t(h) * d;
    sh = c.bhsd ? int64_t(s) * d : d;
  };
  strides(c.hq, c.sq, c.dqk, p.q_sb, p.q_ss, p.q_sh);
  strides(c.hkv, c.sk, c.dqk, p.k_sb, p.k_ss, p.k_sh);
  strides(c.hkv, c.sk, c.dv, p.v_sb, p.v_ss, p.v_sh);
  strides(c.hq, c.sq, c.dv, p.o_sb, p.o_ss, p.o_sh);
  p.lse_sb = int64_t(c.hq) * c.sq, p.lse_sh = c.sq;
  p.batch = c.b, p.heads_q = c.hq, p.heads_kv = c.hkv, p.group = c.hq / c.hkv;
  p.seqlen_q = c.sq, p.seqlen_k = c.sk, p.head_dim_qk = c.dqk, p.head_dim_v = c.dv;
  p.scale = 1.0f / std::sqrt(float(c.dqk)), p.softcap = c.softcap;
  p.window_left = c.wl, p.window_right = c.causal ? 0 : c.wr;

  AttentionPlan plan;
  plan.kind = AttentionKernel::kWgmma, plan.head_dim_qk = c.dqk, plan.head_dim_v = c.dv;
  plan.block_m = 128, plan.block_n = c.dqk == 256 ? 80 : 128, plan.warps = 12, plan.stages = 2;
  plan.order = c.causal || c.wl >= 0 || c.wr >= 0 ? AttentionOrder::kLongestFirst : AttentionOrder::kRowMajor;

  Status st = launch_attention_fwd_wgmma<T>(plan, p, 0);
  if (!st.ok()) {
    std::printf("launch failed: %s\n", st.message().c_str());
    std::exit(1);
  }
  CK(cudaDeviceSynchronize());
  reference_attention<T><<<unsigned((rows * 32 + 255) / 256), 256>>>(p, ref_o, ref_lse);
  compare<T><<<1024, 256>>>(p, ref_o, ref_lse, err);
  float herr[2];
  CK(cudaMemcpy(herr, err, sizeof(herr), cudaMemcpyDeviceToHost));
  const bool bf16 = std::is_same<T, __nv_bfloat16>::value;
  const float tol = bf16 ? 2e-2f : 4e-3f;
  std::printf(
      "%s b=%d hq=%d hkv=%d sq=%d sk=%d d=%d/%d %s causal=%d wl=%d wr=%d softcap=%g sinks=%d: "
      "max|out err|=%.3g max|lse err|=%.3g %s",
      bf16 ? "bf16" : "fp16", c.b, c.hq, c.hkv, c.sq, c.sk, c.dqk, c.dv, c.bhsd ? "bhsd" : "bshd", c.causal, c.wl, c.wr,
      c.softcap, c.sinks, herr[0], herr[1], herr[0] <= tol && herr[1] <= 1e-2f ? "ok" : "FAIL");
  if (c.time) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; ++w) launch_attention_fwd_wgmma<T>(plan, p, 0);
    const int iters = 20;
    CK(cudaEventRecord(e0));
    for (int w = 0; w < iters; ++w) launch_attention_fwd_wgmma<T>(plan, p, 0);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= iters;
    const double flops = 2.0 * c.b * c.hq * double(c.sq) * c.sk * (c.dqk + c.dv) * (c.causal ? 0.5 : 1.0);
    std::printf("  %.3f ms  %.1f TFLOP/s", ms, flops / (ms * 1e-3) / 1e12);
  }
  std::printf("\n");
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(ref_o), cudaFree(ref_lse);
  cudaFree(err), cudaFree(sinks);
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  // b, hq, hkv, sq, sk, dqk, dv, bhsd, causal, wl, wr, softcap, sinks, time
  const Case correctness[] = {
      {1, 1, 1, 128, 128, 128, 128, false, false, -1, -1, 0.f, false, false},     // one tile, one key step
      {1, 2, 1, 256, 384, 128, 128, false, false, -1, -1, 0.f, false, false},     // GQA, 3 key steps (ring wrap)
      {2, 4, 2, 300, 517, 128, 128, false, false, -1, -1, 0.f, false, false},     // ragged tails
      {2, 4, 2, 300, 517, 128, 128, true, false, -1, -1, 0.f, false, false},      // bhsd
      {1, 4, 4, 1000, 1000, 128, 128, false, true, -1, -1, 0.f, false, false},    // causal
      {1, 4, 4, 200, 700, 128, 128, false, true, -1, -1, 0.f, false, false},      // causal, Sk > Sq
      {1, 4, 4, 700, 200, 128, 128, false, true, -1, -1, 0.f, false, false},      // causal, rows with no key
      {1, 4, 4, 1000, 1000, 128, 128, false, false, 100, 30, 0.f, false, false},  // window
      {1, 4, 4, 513, 777, 128, 128, false, false, -1, -1, 30.f, true, false},     // softcap + sinks
      {1, 4, 4, 700, 200, 128, 128, false, true, -1, -1, 0.f, true, false},       // sinks on empty rows
      {2, 4, 2, 333, 555, 64, 64, false, true, -1, -1, 0.f, false, false},        // d64
      {2, 4, 2, 333, 555, 192, 128, false, false, -1, -1, 0.f, false, false},     // 192/128
      {2, 4, 2, 333, 555, 256, 256, false, true, -1, -1, 0.f, false, false},      // d256
      {1, 2, 2, 1, 1, 128, 128, false, false, -1, -1, 0.f, false, false},         // one row, one key
      {1, 2, 2, 64, 0, 128, 128, false, false, -1, -1, 0.f, false, false},        // Sk = 0: zeros, lse -inf
  };
  for (const Case& c : correctness) {
    run<__nv_bfloat16>(c);
    run<__half>(c);
  }
  if (quick) return 0;
  // FlashAttention-3's benchmark shapes: 16k tokens per batch, hidden 2048 (d128: 16 heads).
  for (int s : {1024, 2048, 4096, 8192, 16384}) {
    for (bool causal : {false, true}) {
      run<__nv_bfloat16>({16384 / s, 16, 16, s, s, 128, 128, false, causal, -1, -1, 0.f, false, true});
      run<__half>({16384 / s, 16, 16, s, s, 128, 128, false, causal, -1, -1, 0.f, false, true});
    }
    run<__nv_bfloat16>({16384 / s, 32, 32, s, s, 64, 64, false, false, -1, -1, 0.f, false, true});
    run<__nv_bfloat16>({16384 / s, 8, 8, s, s, 256, 256, false, false, -1, -1, 0.f, false, true});
  }
  return 0;
}
