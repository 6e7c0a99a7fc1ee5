// Times every candidate plan of the normalization family (norm_plan.h candidate_plans) over a grid
// of shapes and prints GB/s per plan, the best plan per shape and the default plan's share of it, with
// a device-to-device copy of the same bytes for reference. The output is what the tables of
// src/norm/norm_plan_tables.h are derived from.
//
// Build: dev/CMakeLists.txt builds every dev/*.cu against the library and src/ (not built by default).
// Run:   sweep_norm [ops=rms,add_rms,layer,ada] [dirs=fwd,bwd] [rows=4096,16384] [n=4096,8192]
//                   [dtype=bf16|fp16|fp32] [reps=7]
// Every timed call is preceded by a write of a 256 MB buffer (flushes the 50 MB L2 of an H100), and
// the median of `reps` calls is reported. Bytes are the minimum the op must move: forward x read and
// y written (add_rms_norm also the residual and the sum), backward x and dy read and dx written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernelforge/kernelforge.h"
#include "norm/norm_plan.h"
#include "norm/norm_problem.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

using kfdev::split;
using kfdev::Timer;

struct Options {
  std::vector<std::string> ops = {"rms", "add_rms", "layer", "ada"};
  std::vector<std::string> dirs = {"fwd", "bwd"};
  std::vector<int64_t> rows = {4096, 16384};
  std::vector<int64_t> ns;
  kf::DType dtype = kf::DType::kBFloat16;
  int reps = 7;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int64_t n = 1024; n <= 16384; n += 512) o.ns.push_back(n);
  for (int64_t n : {2880, 3584, 5120, 6144, 7168, 8192, 10240, 11008, 12288, 13824, 14336, 16384})
    if (std::find(o.ns.begin(), o.ns.end(), n) == o.ns.end()) o.ns.push_back(n);
  std::sort(o.ns.begin(), o.ns.end());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "ops") {
      o.ops = split(v);
    } else if (k == "dirs") {
      o.dirs = split(v);
    } else if (k == "rows" || k == "n") {
      std::vector<int64_t>& dst = k == "rows" ? o.rows : o.ns;
      dst.clear();
      for (const std::string& s : split(v)) dst.push_back(std::atoll(s.c_str()));
    } else if (k == "dtype") {
      o.dtype = v == "fp32" ? kf::DType::kFloat32 : v == "fp16" ? kf::DType::kFloat16 : kf::DType::kBFloat16;
    } else if (k == "reps") {
      o.reps = std::max(1, std::atoi(v.c_str()));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Device buffers of one shape: every tensor any op or direction needs.
struct Buffers {
  std::vector<void*> all;
  void* get(size_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    CHECK_CUDA(cudaMemset(p, 0, bytes));
    all.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : all) cudaFree(p);
  }
};

// Fills x and dy with small values (zeros would make every row's variance 0; any values do for timing).
__global__ void fill(void* p, size_t bytes) {
  unsigned char* b = static_cast<unsigned char*>(p);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    b[i] = (i & 1) ? 0x3c : static_cast<unsigned char>(i * 13);
}

void sweep_shape(const Options& o, Timer& timer, const std::string& op, bool bwd, int64_t rows, int64_t n) {
  const size_t e = kf::dtype_size(o.dtype);
  const size_t row_bytes = size_t(rows) * size_t(n) * e, vec_bytes = size_t(n) * e;
  const int64_t batch = 4;  // AdaLN: scale/shift [batch, 1, n], rows / batch rows per scale row
  Buffers buf;
  void* x = buf.get(row_bytes);
  void* dy = buf.get(row_bytes);
  fill<<<1024, 256>>>(x, row_bytes);
  fill<<<1024, 256>>>(dy, row_bytes);
  void* res = buf.get(row_bytes);
  void* y = buf.get(row_bytes);
  void* sum = buf.get(row_bytes);
  void* dsum = buf.get(row_bytes);
  void* dx = buf.get(row_bytes);
  void* w = buf.get(vec_bytes);
  void* b = buf.get(vec_bytes);
  void* dw = buf.get(vec_bytes);
  void* db = buf.get(vec_bytes);
  void* sc = buf.get(vec_bytes * batch);
  void* sh = buf.get(vec_bytes * batch);
  void* dsc = buf.get(vec_bytes * batch);
  void* dsh = buf.get(vec_bytes * batch);
  const kf::DType t = o.dtype;
  const bool ada = op == "ada";
  kf::TensorView xv = ada ? kf::make_view(x, t, {batch, rows / batch, n}) : kf::make_view(x, t, {rows, n});
  kf::TensorView dyv = ada ? kf::make_view(dy, t, {batch, rows / batch, n}) : kf::make_view(dy, t, {rows, n});
  kf::TensorView yv = ada ? kf::make_view(y, t, {batch, rows / batch, n}) : kf::make_view(y, t, {rows, n});
  kf::TensorView dxv = ada ? kf::make_view(dx, t, {batch, rows / batch, n}) : kf::make_view(dx, t, {rows, n});
  kf::TensorView resv = kf::make_view(res, t, {rows, n}), sumv = kf::make_view(sum, t, {rows, n});
  kf::TensorView dsumv = kf::make_view(dsum, t, {rows, n});
  kf::TensorView wv = kf::make_view(w, t, {n}), bv = kf::make_view(b, t, {n});
  kf::TensorView dwv = kf::make_view(dw, t, {n}), dbv = kf::make_view(db, t, {n});
  kf::TensorView scv = kf::make_view(sc, t, {batch, 1, n}), shv = kf::make_view(sh, t, {batch, 1, n});
  kf::TensorView dscv = kf::make_view(dsc, t, {batch, 1, n}), dshv = kf::make_view(dsh, t, {batch, 1, n});

  kf::NormCall c;
  c.cuda = true;
  c.backward = bwd;
  c.x = &xv;
  size_t bytes = 0;
  if (op == "rms" || op == "add_rms") {
    c.op = op == "rms" ? kf::NormOp::kRms : kf::NormOp::kAddRms;
    c.name = op == "rms" ? "rms_norm" : "add_rms_norm";
    c.eps = 1e-6f;
    c.weight = &wv;
  } else if (op == "layer") {
    c.op = kf::NormOp::kLayer;
    c.name = "layer_norm";
    c.eps = 1e-5f;
    c.weight = &wv;
    c.bias = &bv;
  } else if (ada) {  // DiT: LayerNorm kind, no weight and bias, scale/shift per batch element
    c.op = kf::NormOp::kAdaLayer;
    c.kind = kf::NormKind::kLayer;
    c.name = "ada_norm";
    c.eps = 1e-6f;
    c.scale = &scv;
    c.shift = &shv;
  } else {
    std::fprintf(stderr, "unknown op %s\n", op.c_str());
    std::exit(2);
  }
  const bool add = c.op == kf::NormOp::kAddRms;
  if (!bwd) {
    c.y = &yv;
    if (add) c.residual = &resv, c.sum = &sumv;
    bytes = (add ? 4 : 2) * row_bytes;
  } else {
    c.name = "norm_backward";
    c.dy = &dyv;
    c.dx = &dxv;
    if (c.weight) c.dweight = &dwv;
    if (c.bias) c.dbias = &dbv;
    if (add) c.dsum = &dsumv;
    if (ada) c.dscale = &dscv, c.dshift = &dshv;
    bytes = (add ? 4 : 3) * row_bytes;
  }

  std::vector<kf::NormPlan> plans;
  kf::Status st = kf::candidate_plans_for(c, &plans);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return;
  }
  void* ws = nullptr;
  size_t ws_cap = 0;
  auto run = [&](const kf::NormPlan& plan) {
    if (!bwd) return kf::launch_with_plan(plan, c, nullptr, nullptr, 0).ok();
    size_t need = 0;
    if (!kf::launch_with_plan(plan, c, nullptr, &need, 0).ok()) return false;
    if (need > ws_cap) {
      if (ws) CHECK_CUDA(cudaFree(ws));
      CHECK_CUDA(cudaMalloc(&ws, need));
      ws_cap = need;
    }
    return kf::launch_with_plan(plan, c, ws, &ws_cap, 0).ok();
  };
  // a device-to-device copy of the same bytes: half read, half written
  const double copy_us = timer.median_us(o.reps, 0, [&] {
    return cudaMemcpyAsync(dx, x, std::min(bytes / 2, row_bytes), cudaMemcpyDeviceToDevice, 0) == cudaSuccess;
  });
  const double copy_bytes = double(std::min(bytes / 2, row_bytes)) * 2;
  std::printf("\n%s %s %lldx%lld: %.1f MB, copy@size %.1f GB/s\n", op.c_str(), bwd ? "bwd" : "fwd",
              static_cast<long long>(rows), static_cast<long long>(n), bytes / 1e6, copy_bytes / copy_us / 1e3);
  double best = 1e30, def = 0;
  std::string best_plan;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!run(plans[i])) continue;  // warm-up (and the occupancy queries)
    CHECK_CUDA(cudaDeviceSynchronize());
    const double us = timer.median_us(o.reps, 0, [&] { return run(plans[i]); });
    if (us < 0) continue;
    std::printf("  %8.1f us %7.1f GB/s  %s%s\n", us, bytes / us / 1e3, kf::to_string(plans[i]).c_str(),
                i == 0 ? "  (default)" : "");
    if (i == 0) def = us;
    if (us < best) best = us, best_plan = kf::to_string(plans[i]);
  }
  std::printf("  best %s: %.1f GB/s; default at %.1f%% of it\n", best_plan.c_str(), bytes / best / 1e3,
              def > 0 ? 100.0 * best / def : 0.0);
  if (ws) CHECK_CUDA(cudaFree(ws));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  Timer timer;
  for (const std::string& op : o.ops)
    for (const std::string& dir : o.dirs)
      for (int64_t rows : o.rows)
        for (int64_t n : o.ns) sweep_shape(o, timer, op, dir == "bwd", rows, n);
  return 0;
}
