// Times every candidate plan of the softmax family (src/softmax/softmax_plan.h) over a grid of shapes
// and prints GB/s per plan, the best plan per shape and copy@size (a device-to-device copy moving the
// same bytes under the same timer): the measurements the planner's tables in softmax_plan.cpp come
// from. Not built by default (dev/CMakeLists.txt builds every dev/*.cu against the library with src/
// on the include path).
//
//   sweep_softmax [--dtype bf16|fp16|fp32] [--ops fwd,bwd,logfwd,logbwd] [--shapes 16384x4096,...]
//                 [--reps 15] [--default-only]
//
// Timing: before each timed call a 256 MB write flushes L2 (50 MB on the H100), then CUDA events
// around the one call; the median of --reps calls. Bytes are the minimum the op moves: forward
// 2·M·N·sizeof(T) (read x, write y), backward 3·M·N·sizeof(T) (read g and y, write dx).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernelforge/kernelforge.h"
#include "softmax/softmax_plan.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

using kfdev::split;
using kfdev::Timer;

struct Shape {
  int64_t rows, n;
};
// Row shapes of transformer workloads: attention-score rows (1024..16384), vocabulary rows (32000
// Llama-2 / Mistral, 32001 odd, 50257 GPT-2, 128256 Llama-3), long rows (65536..262144), decode.
const Shape kDefaultShapes[] = {{16384, 1024},  {16384, 2048},  {16384, 4096}, {16384, 8192}, {16384, 12288},
                                {16384, 16384}, {8192, 32000},  {8192, 32001}, {4096, 50257}, {4096, 65536},
                                {4096, 131072}, {2048, 262144}, {1, 4096},     {64, 4096},    {8, 128256}};

// Fills n elements of `dtype` with values in [-8, 8) (a hash of the index).
__global__ void fill(void* p, int64_t n, kf::DType dtype, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = (uint32_t(i) * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const float v = (float(h & 0xffff) / 65536.0f) * 16.0f - 8.0f;
    if (dtype == kf::DType::kFloat32) {
      static_cast<float*>(p)[i] = v;
    } else if (dtype == kf::DType::kFloat16) {
      static_cast<__half*>(p)[i] = __float2half(v);
    } else {
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dtype_s = "bf16", ops_s = "fwd,bwd", shapes_s;
  int reps = 15;
  bool default_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dtype") {
      dtype_s = next();
    } else if (a == "--ops") {
      ops_s = next();
    } else if (a == "--shapes") {
      shapes_s = next();
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--default-only") {
      default_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: sweep_softmax [--dtype bf16|fp16|fp32] [--ops fwd,bwd,logfwd,logbwd] "
                   "[--shapes RxN,...] [--reps N] [--default-only]\n");
      return 2;
    }
  }
  const kf::DType dtype = dtype_s == "fp32"   ? kf::DType::kFloat32
                          : dtype_s == "fp16" ? kf::DType::kFloat16
                                              : kf::DType::kBFloat16;
  const int esize = int(kf::dtype_size(dtype));
  std::vector<Shape> shapes;
  if (shapes_s.empty()) {
    shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  } else {
    for (const std::string& s : split(shapes_s)) {
      Shape sh{};
      if (std::sscanf(s.c_str(), "%ldx%ld", &sh.rows, &sh.n) != 2 || sh.rows < 1 || sh.n < 1) {
        std::fprintf(stderr, "bad shape %s (expected ROWSxN)\n", s.c_str());
        return 2;
      }
      shapes.push_back(sh);
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  std::printf("# %s, %d SMs, sm_%d%d, %s, median of %d, L2 flushed by a 256 MB write before each call\n", prop.name,
              prop.multiProcessorCount, prop.major, prop.minor, dtype_s.c_str(), reps);
  Timer timer;

  for (const Shape& sh : shapes) {
    const int64_t elems = sh.rows * sh.n;
    const size_t bytes = size_t(elems) * esize;
    void *x = nullptr, *y = nullptr, *g = nullptr, *dx = nullptr;
    CHECK_CUDA(cudaMalloc(&x, bytes));
    CHECK_CUDA(cudaMalloc(&y, bytes));
    CHECK_CUDA(cudaMalloc(&g, bytes));
    CHECK_CUDA(cudaMalloc(&dx, bytes));
    fill<<<1024, 256>>>(x, elems, dtype, 1u);
    fill<<<1024, 256>>>(g, elems, dtype, 3u);
    CHECK_CUDA(cudaGetLastError());
    const kf::TensorView vx = kf::make_view(x, dtype, {sh.rows, sh.n}), vy = kf::make_view(y, dtype, {sh.rows, sh.n});
    const kf::TensorView vg = kf::make_view(g, dtype, {sh.rows, sh.n}), vdx = kf::make_view(dx, dtype, {sh.rows, sh.n});
    // y for the backward: the forward's output
    CHECK_CUDA(cudaDeviceSynchronize());
    if (!kf::softmax(vx, vy, nullptr).ok()) return 1;

    for (const std::string& op : split(ops_s)) {
      const bool log = op.rfind("log", 0) == 0, backward = op.find("bwd") != std::string::npos;
      kf::SoftmaxCall c;
      c.name = log ? (backward ? "log_softmax_backward" : "log_softmax") : (backward ? "softmax_backward" : "softmax");
      c.log = log;
      c.backward = backward;
      if (backward) {
        c.g = &vg, c.y = &vy, c.dx = &vdx;
      } else {
        c.x = &vx, c.y = &vdx;  // y stays the forward's output for the backward
      }
      const double op_bytes = double(bytes) * (backward ? 3 : 2);
      // copy@size: a device-to-device copy reading and writing op_bytes in all
      const size_t copy_bytes = size_t(op_bytes / 2);
      void *ca = nullptr, *cb = nullptr;
      CHECK_CUDA(cudaMalloc(&ca, copy_bytes));
      CHECK_CUDA(cudaMalloc(&cb, copy_bytes));
      const double copy_us = timer.median_us(
          reps, 1, [&] { return cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice) == cudaSuccess; });
      cudaFree(ca);
      cudaFree(cb);
      const double copy_gbs = op_bytes / copy_us / 1e3;

      std::vector<kf::SoftmaxPlan> plans;
      const kf::Status st = kf::softmax_candidate_plans(c, &plans);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
      }
      if (default_only) plans.resize(1);
      std::printf("\n%ldx%ld %s %s: %zu plans, copy@size %.1f us %.0f GB/s\n", long(sh.rows), long(sh.n),
                  dtype_s.c_str(), c.name, plans.size(), copy_us, copy_gbs);
      double best_us = 1e30;
      std::string best;
      for (size_t i = 0; i < plans.size(); ++i) {
        const kf::SoftmaxPlan& plan = plans[i];
        // the first call warms up (module load, occupancy caches)
        const double us = timer.median_us(reps, 1, [&] {
          const kf::Status st = kf::launch_with_plan(plan, c, nullptr);
          if (!st.ok()) std::fprintf(stderr, "  failed: %s\n", st.message().c_str());
          return st.ok();
        });
        const std::string ran = kf::last_plan();
        if (us < 0) continue;
        const double gbs = op_bytes / us / 1e3;
        std::printf("  %-9.1f us %6.0f GB/s %5.1f%% of copy  %s%s%s\n", us, gbs, 100.0 * gbs / copy_gbs,
                    kf::to_string(plan).c_str(), i == 0 ? "  (default)" : "",
                    ran == kf::to_string(plan) ? "" : ("  [ran " + ran + "]").c_str());
        if (us < best_us) best_us = us, best = kf::to_string(plan) + (i == 0 ? "  (default)" : "");
      }
      std::printf("  best: %.1f us %.0f GB/s  %s\n", best_us, op_bytes / best_us / 1e3, best.c_str());
    }
    cudaFree(x);
    cudaFree(y);
    cudaFree(g);
    cudaFree(dx);
  }
  return 0;
}
