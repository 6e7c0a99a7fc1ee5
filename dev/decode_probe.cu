// Lab probe of decode attention: times the default plan and forced split counts on the acceptance
// shapes (GQA 32/8, d128, bf16, paged), with the L2 flushed before each run and the median of 30,
// next to a device-to-device copy of the same bytes (copy@size). GB/s counts the KV bytes read.
//
//   decode_probe [splits ...]      extra split counts to try besides the planner's
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/device.h"
#include "decode/decode_plan.h"
#include "kernelforge/decode.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

kf::TensorView view(void* p, kf::DType t, std::vector<int64_t> shape) {
  kf::TensorView v;
  v.data = p, v.dtype = t, v.device = {kf::DeviceType::kCUDA, 0}, v.ndim = int(shape.size());
  int64_t s = 1;
  for (int d = v.ndim - 1; d >= 0; --d) v.shape[d] = shape[d], v.strides[d] = s, s *= shape[d];
  return v;
}

using kfdev::median_us;

struct Shape {
  int64_t B, kv, page, Lq;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> extra;
  for (int i = 1; i < argc; ++i) extra.push_back(std::atoi(argv[i]));
  const int64_t Hq = 32, Hkv = 8, D = 128;
  const Shape shapes[] = {{1, 8192, 16, 1},  {16, 4096, 16, 1}, {64, 2048, 16, 1}, {8, 32768, 16, 1}, {16, 4096, 1, 1},
                          {16, 4096, 16, 4}, {1, 8192, 1, 1},   {1, 32768, 16, 1}, {128, 1024, 16, 1}};
  std::printf("%-24s %-52s %9s %9s %9s %7s\n", "shape", "plan", "us", "GB/s", "copy GB/s", "share");
  for (const Shape& s : shapes) {
    const int64_t pages_per = s.kv / s.page, P = s.B * pages_per;
    const size_t cache_bytes = size_t(P) * s.page * Hkv * D * 2;
    void *q, *kc, *vc, *out, *lens, *bt, *ws, *copy_src, *copy_dst;
    cudaMalloc(&q, s.B * s.Lq * Hq * D * 2), cudaMalloc(&out, s.B * s.Lq * Hq * D * 2);
    cudaMalloc(&kc, cache_bytes), cudaMalloc(&vc, cache_bytes), cudaMalloc(&copy_dst, 2 * cache_bytes),
        cudaMalloc(&copy_src, 2 * cache_bytes);
    cudaMemset(kc, 0x3c, cache_bytes), cudaMemset(vc, 0x3c, cache_bytes), cudaMemset(q, 0x3c, s.B * s.Lq * Hq * D * 2);
    cudaMalloc(&lens, s.B * 4), cudaMalloc(&bt, P * 4);
    std::vector<int32_t> hl(s.B, int32_t(s.kv)), hb(P);
    for (int64_t i = 0; i < P; ++i) hb[i] = int32_t((i * 7919) % P);  // scattered pages
    cudaMemcpy(lens, hl.data(), s.B * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(bt, hb.data(), P * 4, cudaMemcpyHostToDevice);
    kf::TensorView tq = view(q, kf::DType::kBFloat16, {s.B, s.Lq, Hq, D}),
                   tk = view(kc, kf::DType::kBFloat16, {P, s.page, Hkv, D}),
                   tv = view(vc, kf::DType::kBFloat16, {P, s.page, Hkv, D}), tl = view(lens, kf::DType::kInt32, {s.B}),
                   tb = view(bt, kf::DType::kInt32, {s.B, pages_per}),
                   to = view(out, kf::DType::kBFloat16, {s.B, s.Lq, Hq, D});
    kf::DecodeTensors t;
    t.q = &tq, t.k_cache = &tk, t.v_cache = &tv, t.seq_lens = &tl, t.block_table = &tb, t.out = &to;
    kf::DecodeOptions o;
    kf::DecodePlan plan;
    size_t bytes = 0;
    kf::Status st = kf::decode_attention_plan(t, o, &plan, &bytes);
    if (!st.ok()) {
      std::printf("plan failed: %s\n", st.message().c_str());
      return 1;
    }
    std::vector<kf::DecodePlan> plans = {plan};
    for (int e : extra) {
      kf::DecodePlan p = plan;
      p.splits = e;
      plans.push_back(p);
    }
    const double kv_bytes = 2.0 * s.B * s.kv * Hkv * D * 2;
    const float copy_us =
        median_us([&] { cudaMemcpyAsync(copy_dst, copy_src, size_t(kv_bytes), cudaMemcpyDeviceToDevice); });
    for (const kf::DecodePlan& p : plans) {
      kf::DecodeCall call;
      call.t = t;
      call.opts = o;
      kf::DecodeParams prm;
      kf::DType dt;
      kf::validate_decode(call, &prm, &dt);
      const size_t need = kf::decode_workspace_bytes(p, prm);
      cudaMalloc(&ws, need + 256);
      cudaMemset(ws, 0, need + 256);  // the split merge's counters start at zero (decode.h)
      const float us = median_us([&] { kf::decode_attention(p, t, o, ws, need, nullptr); });
      cudaFree(ws);
      char name[64];
      std::snprintf(name, sizeof(name), "b%ld kv%ld p%ld q%ld", long(s.B), long(s.kv), long(s.page), long(s.Lq));
      const double gbs = kv_bytes / us * 1e-3, copy_gbs = kv_bytes / copy_us * 1e-3;
      std::printf("%-24s %-52s %9.1f %9.0f %9.0f %6.1f%%\n", name, kf::to_string(p).c_str(), us, gbs, copy_gbs,
                  100.0 * gbs / copy_gbs);
    }
    cudaFree(q), cudaFree(out), cudaFree(kc), cudaFree(vc), cudaFree(lens), cudaFree(bt), cudaFree(copy_dst),
        cudaFree(copy_src);
  }
  cudaError_t e = cudaDeviceSynchronize();
  std::printf("status: %s\n", cudaGetErrorString(e));
  return 0;
}
