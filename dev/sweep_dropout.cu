// Times every candidate plan of the dropout family (dropout_plan.h candidate_plans: each kernel the
// alignment allows x the built unrolls (Philox chains in flight per thread) x a covering grid, one
// resident wave or one block per SM) against copy@size, the numbers kDropUnroll of dropout_plan.cpp
// is set from.
//
//   sweep_dropout [shapes=16384x4096,4096x14336,4097x1023,1x4096,64x4096] [ops=dropout,add]
//                 [dirs=fwd,bwd] [dtype=bf16|fp16|fp32] [p=0.1] [reps=15] [all=1]
//
// The defaults are the bench shapes and p of python/kernelforge/specs/dropout.py, op dropout (add:
// dropout_add, forward only: its backward is dropout's). The forward writes rng_state (as the torch
// op does), no mask; the backward regenerates the mask from it. Bytes are the minimum traffic:
// dropout 2 numel elements per direction (read, write), dropout_add 3. Without all=1, the scalar
// kernel (where vectors fit) and the one-block-per-SM grids are skipped. Timing: sweep_common.cuh
// (L2 flushed, median of `reps`).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dropout/dropout_plan.h"
#include "dropout/dropout_problem.h"
#include "kernelforge/kernelforge.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

struct Options : kfdev::SweepArgs {
  Options() { shapes = {"16384x4096", "4096x14336", "4097x1023", "1x4096", "64x4096"}; }
  std::vector<std::string> ops = {"dropout"};
  double p = 0.1;
};

Options parse(int argc, char** argv) {
  Options o;
  kfdev::parse_args(argc, argv, &o, [&](const std::string& k, const std::string& v) {
    if (k == "ops") {
      o.ops = kfdev::split(v);
    } else if (k == "p") {
      o.p = std::atof(v.c_str());
    } else {
      return false;
    }
    return true;
  });
  return o;
}

void sweep(const Options& o, kfdev::Timer& timer, int sm_count, const std::string& shape_s, bool add, bool bwd) {
  int64_t rc[2] = {0, 0};
  if (std::sscanf(shape_s.c_str(), "%ldx%ld", &rc[0], &rc[1]) != 2) {
    std::fprintf(stderr, "bad shape %s (RxN)\n", shape_s.c_str());
    std::exit(2);
  }
  const kf::DType t = o.dtype;
  const size_t bytes_one = size_t(rc[0] * rc[1]) * kf::dtype_size(t);
  kfdev::DeviceBuffers buf;
  void* x = buf.get(bytes_one);
  void* res = buf.get(bytes_one);
  void* y = buf.get(bytes_one);
  void* rng = buf.get(2 * sizeof(int64_t));
  const kf::TensorView xv = kf::make_view(x, t, {rc[0], rc[1]}), resv = kf::make_view(res, t, {rc[0], rc[1]});
  const kf::TensorView yv = kf::make_view(y, t, {rc[0], rc[1]}), rngv = kf::make_view(rng, kf::DType::kInt64, {2});
  kf::DropCall fwd;
  fwd.name = add ? "dropout_add" : "dropout";
  fwd.op = add ? kf::DropOp::kDropoutAdd : kf::DropOp::kDropout;
  fwd.p = o.p;
  fwd.rng.seed = 1234;
  fwd.x = &xv, fwd.y = &yv, fwd.rng_state = &rngv;
  if (add) fwd.residual = &resv;
  // the forward's rng_state, which the backward reads
  const kf::Status first = kf::dropout(xv, o.p, fwd.rng, yv, &rngv, nullptr, 0);
  if (!first.ok()) {
    std::printf("%s: %s\n", shape_s.c_str(), first.message().c_str());
    return;
  }
  kf::DropCall back;
  back.name = "dropout_backward";
  back.op = kf::DropOp::kBackward;
  back.p = o.p;
  back.dy = &yv, back.dx = &resv, back.rng_state = &rngv;
  const kf::DropCall& c = bwd ? back : fwd;
  const double bytes = double(bytes_one) * (add && !bwd ? 3 : 2);

  std::vector<kf::DropPlan> plans;
  const kf::Status st = kf::drop_candidate_plans(c, &plans);
  if (!st.ok()) {
    std::printf("%s: %s\n", shape_s.c_str(), st.message().c_str());
    return;
  }
  const double copy = kfdev::copy_us(timer, size_t(bytes), o.reps);
  const std::string what = std::string(add ? "dropout_add " : "dropout ") + (bwd ? "bwd " : "fwd ") + shape_s;
  kfdev::shape_line(what.c_str(), bytes, copy);
  for (size_t i = 0; i < plans.size(); ++i) {
    const kf::DropPlan& p = plans[i];
    const bool narrow = p.kind != plans[0].kind, per_sm = p.grid == sm_count && p.grid < plans[0].grid;
    if (!o.all && i > 0 && (narrow || per_sm)) continue;
    auto run = [&] { return kf::launch_with_plan(p, c, 0); };
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
  int dev = 0, sm_count = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
  for (const std::string& s : o.shapes)
    for (const std::string& op : o.ops)
      for (const std::string& d : o.dirs) {
        if (op == "add" && d == "bwd") continue;  // dropout_add's backward is dropout's
        sweep(o, timer, sm_count, s, op == "add", d == "bwd");
      }
  return 0;
}
