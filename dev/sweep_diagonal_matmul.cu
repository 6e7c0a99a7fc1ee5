// Times every candidate plan of the diagonal_matmul family (diagonal_matmul_plan.h candidate_plans:
// the built vectors per thread at each access width, the forward also at 4 rows per thread) against
// copy@size, the numbers the kDmVecs table of diagonal_matmul_plan.cpp is set from.
//
//   sweep_diagonal_matmul [shapes=4096x4096,16384x4096,8x2048x2048,8x2048x2048bc,4097x1023]
//                         [dirs=fwd,bwd] [dtype=bf16|fp16|fp32] [reps=15] [all=1]
//
// A shape is RxN (b [R, N], a [R]) or BxMxN (b [B, M, N], a [B, M]; suffix "bc": a [M] broadcast over
// the B batches); the defaults are the bench shapes of python/kernelforge/specs/diagonal_matmul.py.
// Bytes are the minimum traffic: forward b read, y written, a read (2 R N + |a| elements); backward
// dy and b read, db written, a read, da written (3 R N + 2 |a|). The backward computes da and db.
// Without all=1, plans with narrower accesses than the default's are skipped (they only matter
// where the alignment forces them). Timing: sweep_common.cuh (L2 flushed, median of `reps`).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"
#include "kernelforge/kernelforge.h"
#include "sweep_common.cuh"

namespace kf = kernelforge;

namespace {

struct Shape {
  int64_t b = 1, m = 0, n = 0;  // rows = b * m
  bool batched = false, bcast = false;
};

struct Options : kfdev::SweepArgs {
  Options() { shapes = {"4096x4096", "16384x4096", "8x2048x2048", "8x2048x2048bc", "4097x1023"}; }
};

Options parse(int argc, char** argv) {
  Options o;
  kfdev::parse_args(argc, argv, &o, [&](const std::string& k, const std::string& v) {
    (void)k, (void)v;
    return false;
  });
  return o;
}

Shape parse_shape(const std::string& s) {
  Shape sh;
  std::vector<int64_t> d;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i) break;
    d.push_back(std::atoll(s.substr(i, j - i).c_str()));
    i = j < s.size() && s[j] == 'x' ? j + 1 : j;
  }
  sh.bcast = s.size() > 2 && s.compare(s.size() - 2, 2, "bc") == 0;
  if (d.size() == 2) {
    sh.m = d[0], sh.n = d[1];
  } else if (d.size() == 3) {
    sh.b = d[0], sh.m = d[1], sh.n = d[2], sh.batched = true;
  } else {
    std::fprintf(stderr, "bad shape %s (RxN or BxMxN[bc])\n", s.c_str());
    std::exit(2);
  }
  return sh;
}

void sweep(const Options& o, kfdev::Timer& timer, const std::string& shape_s, bool bwd) {
  const Shape sh = parse_shape(shape_s);
  const kf::DType t = o.dtype;
  const size_t e = kf::dtype_size(t);
  const int64_t rows = sh.b * sh.m, a_numel = sh.bcast ? sh.m : rows;
  const size_t row_bytes = size_t(rows) * size_t(sh.n) * e, a_bytes = size_t(a_numel) * e;
  kfdev::DeviceBuffers buf;
  void* a = buf.get(a_bytes);
  void* b = buf.get(row_bytes);
  void* y = buf.get(row_bytes);  // forward y; backward dy
  void* db = bwd ? buf.get(row_bytes) : nullptr;
  void* da = bwd ? buf.get(a_bytes) : nullptr;
  auto rowv = [&](void* p) {
    return sh.batched ? kf::make_view(p, t, {sh.b, sh.m, sh.n}) : kf::make_view(p, t, {sh.m, sh.n});
  };
  const kf::TensorView av = sh.bcast ? kf::make_view(a, t, {sh.m})
                                     : (sh.batched ? kf::make_view(a, t, {sh.b, sh.m}) : kf::make_view(a, t, {sh.m}));
  const kf::TensorView bv = rowv(b), yv = rowv(y);
  kf::TensorView dbv, dav = av;
  if (bwd) dbv = rowv(db), dav.data = da;
  kf::DmCall c;
  c.name = bwd ? "diagonal_matmul_backward" : "diagonal_matmul";
  c.backward = bwd;
  c.a = &av, c.b = &bv;
  if (bwd) {
    c.dy = &yv, c.da = &dav, c.db = &dbv;
  } else {
    c.y = &yv;
  }
  const double bytes = bwd ? 3.0 * row_bytes + 2.0 * a_bytes : 2.0 * row_bytes + a_bytes;

  std::vector<kf::DmPlan> plans;
  kf::Status st = kf::dm_candidate_plans(c, &plans);
  if (!st.ok()) {
    std::printf("%s: %s\n", shape_s.c_str(), st.message().c_str());
    return;
  }
  void* ws = nullptr;
  size_t ws_bytes = 0;
  if (bwd) {
    st = kf::dm_launch_with_plan(plans[0], c, nullptr, &ws_bytes, 0);  // the workspace size
    if (!st.ok()) {
      std::printf("%s: %s\n", shape_s.c_str(), st.message().c_str());
      return;
    }
    ws = buf.get(std::max<size_t>(ws_bytes, 16));
  }
  const double copy = kfdev::copy_us(timer, size_t(bytes), o.reps);
  const std::string what = std::string("dm ") + (bwd ? "bwd " : "fwd ") + shape_s;
  kfdev::shape_line(what.c_str(), bytes, copy);
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!o.all && plans[i].vec < plans[0].vec) continue;
    auto run = [&] {
      size_t cap = ws_bytes;
      return kf::dm_launch_with_plan(plans[i], c, ws, bwd ? &cap : nullptr, 0);
    };
    const kf::Status s = run();  // warm-up; reports why a plan does not run
    if (!s.ok()) {
      std::printf("  %s: %s\n", kf::to_string(plans[i]).c_str(), s.message().c_str());
      continue;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    const double us = timer.median_us(o.reps, 1, [&] { return run().ok(); });
    kfdev::plan_line(us, bytes, copy, kf::to_string(plans[i]), i == 0);
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
