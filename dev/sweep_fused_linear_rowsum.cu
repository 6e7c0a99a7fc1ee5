// Times every candidate plan of the fused_linear_rowsum family (fused_linear_rowsum_plan.h
// candidate_plans: access width x the column pass's rows in flight x row_dot's rows per warp, and one
// row chunk) against copy@size, the numbers the constants of fused_linear_rowsum_plan.h are set from.
//
//   sweep_fused_linear_rowsum [shapes=16384x4096x4096,65536x2048x2048,4096x4096x14336,1x4096x4096,
//                              4097x1023x513] [dirs=fwd,bwd] [dtype=bf16|fp16|fp32] [reps=15] [all=1]
//
// A shape is TxKxO: x [T, K], weight [O, K], bias [O] (the bench shapes of
// python/kernelforge/specs/fused_linear_rowsum.py, whose LinearShape names them m{T}n{O}k{K}). Bytes
// are the minimum traffic of the spec: forward x, W, bias read and y written (T K + O K + O + T
// elements); backward x and dy read, dx, dW and db written (2 T K + T + O K + O). The backward
// computes dx, dweight and dbias. Without all=1, plans with narrower accesses than the default's and
// one-chunk plans (where the default has several) are skipped. Timing: sweep_common.cuh (L2 flushed,
// median of `reps`).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/fused_linear_rowsum_problem.h"
#include "kernelforge/kernelforge.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

struct Options : kfdev::SweepArgs {
  Options() { shapes = {"16384x4096x4096", "65536x2048x2048", "4096x4096x14336", "1x4096x4096", "4097x1023x513"}; }
};

Options parse(int argc, char** argv) {
  Options o;
  kfdev::parse_args(argc, argv, &o, [&](const std::string& k, const std::string& v) {
    (void)k, (void)v;
    return false;
  });
  return o;
}

void sweep(const Options& o, kfdev::Timer& timer, const std::string& shape_s, bool bwd) {
  int64_t tk[3] = {0, 0, 0};
  if (std::sscanf(shape_s.c_str(), "%ldx%ldx%ld", &tk[0], &tk[1], &tk[2]) != 3) {
    std::fprintf(stderr, "bad shape %s (TxKxO)\n", shape_s.c_str());
    std::exit(2);
  }
  const int64_t T = tk[0], K = tk[1], O = tk[2];
  const kf::DType t = o.dtype;
  const size_t e = kf::dtype_size(t);
  kfdev::DeviceBuffers buf;
  void* x = buf.get(size_t(T * K) * e);
  void* w = buf.get(size_t(O * K) * e);
  void* bias = buf.get(size_t(O) * e);
  void* y = buf.get(size_t(T) * e);
  void* dy = buf.get(size_t(T) * e);
  void* w_sum = buf.get(size_t(K) * sizeof(float));
  void* dx = bwd ? buf.get(size_t(T * K) * e) : nullptr;
  void* dw = bwd ? buf.get(size_t(O * K) * e) : nullptr;
  void* db = bwd ? buf.get(size_t(O) * e) : nullptr;
  const size_t ws_bytes = kf::fused_linear_rowsum_workspace_size(T, K, O);
  void* ws = buf.get(ws_bytes);
  const kf::TensorView xv = kf::make_view(x, t, {T, K}), wv = kf::make_view(w, t, {O, K});
  const kf::TensorView bv = kf::make_view(bias, t, {O}), yv = kf::make_view(y, t, {T});
  const kf::TensorView dyv = kf::make_view(dy, t, {T}), wsv = kf::make_view(w_sum, kf::DType::kFloat32, {K});
  const kf::TensorView dxv = kf::make_view(dx, t, {T, K}), dwv = kf::make_view(dw, t, {O, K});
  const kf::TensorView dbv = kf::make_view(db, t, {O});
  kf::FlrsCall c;
  if (!bwd) {
    c.name = "fused_linear_rowsum";
    c.x = &xv, c.weight = &wv, c.bias = &bv, c.y = &yv, c.w_sum = &wsv;
  } else {
    c.name = "fused_linear_rowsum_backward";
    c.backward = true;
    c.dy = &dyv, c.x = &xv, c.w_sum = &wsv, c.dx = &dxv, c.dweight = &dwv, c.dbias = &dbv;
  }
  const double elems = bwd ? double(2 * T * K + T + O * K + O) : double(T * K + O * K + O + T);
  const double bytes = elems * double(e);

  std::vector<kf::FlrsPlan> plans;
  const kf::Status st = kf::flrs_candidate_plans(c, &plans);
  if (!st.ok()) {
    std::printf("%s: %s\n", shape_s.c_str(), st.message().c_str());
    return;
  }
  const double copy = kfdev::copy_us(timer, size_t(bytes), o.reps);
  const std::string what = std::string("flrs ") + (bwd ? "bwd " : "fwd ") + shape_s;
  kfdev::shape_line(what.c_str(), bytes, copy);
  for (size_t i = 0; i < plans.size(); ++i) {
    const kf::FlrsPlan& p = plans[i];
    if (!o.all && (p.vec < plans[0].vec || (p.chunks == 1 && plans[0].chunks > 1))) continue;
    auto run = [&] { return kf::launch_with_plan(p, c, ws, ws_bytes, 0); };
    const kf::Status s = run();  // warm-up; reports why a plan does not run
    if (!s.ok()) {
      std::printf("  %s: %s\n", kf::to_string(p).c_str(), s.message().c_str());
      continue;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    const double us = timer.median_us(o.reps, 1, [&] { return run().ok(); });
    kfdev::plan_line(us, bytes, copy, kf::to_string(p), i == 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  kfdev::Timer timer;
  for (const std::string& s : o.shapes)
    for (const std::string& d : o.dirs) sweep(o, timer, s, d == "bwd");
  return 0;
}
