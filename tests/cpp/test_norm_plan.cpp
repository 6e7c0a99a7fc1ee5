// The normalization planner without a GPU: problem -> plan on H100, A100 and T4 device facts, the
// candidate lists, and check_plan's rejections. The expected plans are those the launch code chose
// before the planner existed (the same kernel instantiation, block, rows per block, cluster, stages and
// chunk rows), so a change here is a change of what runs by default.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "norm/norm_plan.h"

namespace {

namespace kf = kernelforge;
using kf::NormKernel;
using kf::NormOp;
using kf::NormPlan;
using kf::NormProblem;

const kf::DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const kf::DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const kf::DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

enum class Align {
  kAligned,    // every tensor 16-byte aligned, rows contiguous
  kShared,     // every row tensor one element past a 16-byte boundary (a scalar head aligns them)
  kUnaligned,  // x and the outputs off by different amounts (one-element vectors)
};

struct Shape {
  NormOp op;
  bool backward;
  kf::DType dtype;
  int64_t rows, n;
  Align align = Align::kAligned;
  int64_t ada_rpg = 1;  // AdaLN rows per scale/shift row
  bool affine = true;   // weight (and bias for LayerNorm / AdaLN)
  bool dsum = false;    // add_rms_norm backward with a gradient of the sum
};

// Params as validate_norm fills them, with fake device addresses (the planner reads only their alignment).
kf::NormParams params(const Shape& s) {
  const int64_t e = int64_t(kf::dtype_size(s.dtype));
  auto addr = [&](uintptr_t base, bool row_tensor, int skew) {
    const uintptr_t off = row_tensor && s.align != Align::kAligned ? uintptr_t(e * skew) : 0;
    return reinterpret_cast<void*>(base + off);
  };
  const int out_skew = s.align == Align::kUnaligned ? 2 : 1;  // kUnaligned: outputs skewed unlike x
  kf::NormParams p;
  p.rows = s.rows;
  p.n = s.n;
  p.x_stride = p.res_stride = p.y_stride = p.sum_stride = p.dy_stride = p.dsum_stride = p.dx_stride = s.n;
  p.x = addr(0x100000, true, 1);
  const bool ada = kf::norm_is_ada(s.op);
  if (s.affine) p.weight = addr(0x200000, false, 0);
  if (s.affine && (kf::norm_is_layer(s.op) || ada)) p.bias = addr(0x300000, false, 0);
  if (ada) {
    p.scale = addr(0x400000, false, 0);
    p.shift = addr(0x500000, false, 0);
    p.ada_rpg = s.ada_rpg;
    p.ada_groups = s.rows / s.ada_rpg;
    p.scale_stride = p.shift_stride = s.n;
  }
  if (!s.backward) {
    p.y = addr(0x600000, true, out_skew);
    if (s.op == NormOp::kAddRms) {
      p.residual = addr(0x700000, true, 1);
      p.sum = addr(0x800000, true, out_skew);
    }
  } else {
    p.dy = addr(0x900000, true, 1);
    p.dx = addr(0xa00000, true, out_skew);
    if (s.dsum) p.dsum = addr(0xb00000, true, 1);
    if (s.affine) p.dweight = addr(0xc00000, false, 0);
    if (s.affine && (kf::norm_is_layer(s.op) || ada)) p.dbias = addr(0xd00000, false, 0);
    if (ada) {
      p.dscale = addr(0xe00000, false, 0);
      p.dshift = addr(0xf00000, false, 0);
    }
  }
  return p;
}

NormProblem problem(const Shape& s) { return kf::make_norm_problem(s.op, s.backward, params(s), s.dtype); }
std::string plan_of(const Shape& s, const kf::DeviceInfo& dev) { return to_string(plan_norm(problem(s), dev)); }

constexpr kf::DType kBf16 = kf::DType::kBFloat16, kFp16 = kf::DType::kFloat16, kFp32 = kf::DType::kFloat32;
constexpr NormOp kRms = NormOp::kRms, kAdd = NormOp::kAddRms, kLayer = NormOp::kLayer;
constexpr NormOp kAdaRms = NormOp::kAdaRms, kAdaLayer = NormOp::kAdaLayer;

TEST(NormPlan, ProblemFacts) {
  NormProblem a = problem({kRms, false, kBf16, 16384, 4096});
  EXPECT_TRUE(a.can_vectorize);
  EXPECT_EQ(a.elem_bytes, 2);
  NormProblem b = problem({kRms, false, kBf16, 16384, 4095});
  EXPECT_FALSE(b.can_vectorize);  // odd N
  EXPECT_TRUE(b.can_align_body);
  EXPECT_EQ(b.row_period, 8);  // 4095 x 2 bytes = 14 mod 16: the misalignment repeats every 8 rows
  NormProblem c = problem({kRms, false, kBf16, 16384, 4096, Align::kUnaligned});
  EXPECT_FALSE(c.can_vectorize);
  EXPECT_FALSE(c.can_align_body);
  NormProblem d = problem({kAdaLayer, true, kBf16, 16384, 4096, Align::kAligned, 4096, false});
  EXPECT_EQ(d.ada_groups, 4);
  EXPECT_FALSE(d.has_weight);
  EXPECT_TRUE(d.has_dscale);
}

// ---- forward, H100 -------------------------------------------------------------------------------
TEST(NormPlan, ForwardH100) {
  // decode: one block, parameters loaded with x
  EXPECT_EQ(plan_of({kRms, false, kBf16, 1, 4096}, kH100), "fwd_row vec=8 iters=2 threads=256 early_params");
  // RMSNorm 2048: the early-parameter kernel on every grid
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 2048}, kH100), "fwd_row vec=8 iters=2 threads=128 early_params");
  EXPECT_EQ(plan_of({kLayer, false, kBf16, 16384, 2048}, kH100), "fwd_row vec=8 iters=2 threads=128");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 4096}, kH100), "fwd_row vec=8 iters=2 threads=256");
  // 512 threads x 2 vectors at 8192 for RMSNorm and LayerNorm, 256 x 4 for add_rms_norm
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 8192}, kH100), "fwd_row vec=8 iters=2 threads=512");
  EXPECT_EQ(plan_of({kLayer, false, kBf16, 16384, 8192}, kH100), "fwd_row vec=8 iters=2 threads=512");
  EXPECT_EQ(plan_of({kAdd, false, kBf16, 16384, 8192}, kH100), "fwd_row vec=8 iters=4 threads=256");
  // small rows: four rows of 32 threads per block
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 512}, kH100), "fwd_row vec=8 iters=2 threads=128 rows_per_block=4");
  // odd N: a scalar head per row
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 4095}, kH100), "fwd_row vec=8 iters=2 threads=256 scalar_head");
  EXPECT_EQ(plan_of({kLayer, false, kBf16, 16384, 8191}, kH100), "fwd_row vec=8 iters=2 threads=512 scalar_head");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 2048, Align::kShared}, kH100),
            "fwd_row vec=8 iters=2 threads=128 scalar_head");
  // rows not sharing a misalignment: one-element vectors
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 4096, Align::kUnaligned}, kH100), "fwd_row vec=1 iters=16 threads=256");
  // long rows: the bulk-copy pipeline, 32 KB slices
  EXPECT_EQ(plan_of({kRms, false, kBf16, 4096, 65536}, kH100),
            "fwd_bulk vec=8 iters=1 threads=256 cluster=4 stages=2 params_in_regs");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 4096, 131072}, kH100),
            "fwd_bulk vec=8 iters=1 threads=256 cluster=8 stages=2 params_in_regs");
  EXPECT_EQ(plan_of({kLayer, false, kBf16, 4096, 65536}, kH100),
            "fwd_bulk vec=8 iters=1 threads=512 cluster=4 stages=2 params_per_vector");
  EXPECT_EQ(plan_of({kLayer, false, kBf16, 4096, 131072}, kH100),
            "fwd_bulk vec=8 iters=1 threads=256 cluster=8 stages=3 params_in_regs");
  EXPECT_EQ(plan_of({kAdd, false, kBf16, 4096, 65536}, kH100), "fwd_bulk vec=8 iters=1 threads=256 cluster=4 stages=2");
  EXPECT_EQ(plan_of({kRms, false, kFp32, 16384, 8192}, kH100),
            "fwd_bulk vec=4 iters=1 threads=256 stages=2 params_in_regs");
  // rows of 16-32 KB: the bulk pipeline, except residual-add RMSNorm (two stage buffers)
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 12288}, kH100),
            "fwd_bulk vec=8 iters=1 threads=256 stages=2 params_in_regs");
  EXPECT_EQ(plan_of({kAdaRms, false, kBf16, 16384, 8704}, kH100).substr(0, 8), "fwd_bulk");
  EXPECT_EQ(plan_of({kAdd, false, kBf16, 16384, 12288}, kH100).substr(0, 7), "fwd_row");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 100, 12288}, kH100).substr(0, 7), "fwd_row");  // under two rows per SM
  // few long rows: a row over a cluster of 512-thread CTAs
  EXPECT_EQ(plan_of({kRms, false, kBf16, 2, 131072}, kH100), "fwd_cluster vec=8 iters=8 threads=512 cluster=4");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 1, 32768}, kH100), "fwd_cluster vec=8 iters=8 threads=512");
  // AdaLN: 512-thread blocks only without weight and bias; the plain output loop
  EXPECT_EQ(plan_of({kAdaLayer, false, kBf16, 16384, 4096, Align::kAligned, 4096, false}, kH100),
            "fwd_row vec=8 iters=2 threads=256 plain_ada");
  EXPECT_EQ(plan_of({kAdaLayer, false, kBf16, 16384, 8192, Align::kAligned, 4096, false}, kH100),
            "fwd_row vec=8 iters=2 threads=512 plain_ada");
  EXPECT_EQ(plan_of({kAdaLayer, false, kBf16, 16384, 8192, Align::kAligned, 1, true}, kH100),
            "fwd_row vec=8 iters=4 threads=256");
  EXPECT_EQ(plan_of({kAdaRms, false, kBf16, 1, 4096, Align::kAligned, 1, false}, kH100),
            "fwd_row vec=8 iters=2 threads=256 early_params");
}

TEST(NormPlan, ForwardA100T4) {
  EXPECT_EQ(plan_of({kRms, false, kBf16, 16384, 8192}, kA100), "fwd_row vec=8 iters=2 threads=512");
  // no bulk copies and no clusters before sm_90: long rows stream
  EXPECT_EQ(plan_of({kRms, false, kBf16, 4096, 65536}, kA100), "fwd_stream vec=8 iters=1 threads=1024");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 2, 131072}, kA100), "fwd_stream vec=8 iters=1 threads=1024");
  EXPECT_EQ(plan_of({kRms, false, kBf16, 4096, 16384}, kA100), "fwd_row vec=8 iters=8 threads=256");
  EXPECT_EQ(plan_of({kRms, false, kFp16, 16384, 4096}, kT4), "fwd_row vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kRms, false, kFp16, 16384, 8192}, kT4), "fwd_row vec=8 iters=2 threads=512");
  // 40 rows on 40 SMs: one wave, so 256 x 4 with parameters loaded early
  EXPECT_EQ(plan_of({kRms, false, kFp16, 40, 8192}, kT4), "fwd_row vec=8 iters=4 threads=256 early_params");
  EXPECT_EQ(plan_of({kLayer, false, kFp32, 16384, 4095}, kT4), "fwd_row vec=4 iters=2 threads=512 scalar_head");
}

// ---- backward ------------------------------------------------------------------------------------
TEST(NormPlan, BackwardH100) {
  EXPECT_EQ(plan_of({kRms, true, kBf16, 1, 4096}, kH100), "bwd_regs vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 2048}, kH100),
            "bwd_chunk vec=8 iters=1 threads=256 stages=3 chunk_rows=4");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 4096}, kH100),
            "bwd_chunk vec=8 iters=2 threads=256 stages=3 chunk_rows=2");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 8192}, kH100),
            "bwd_chunk vec=8 iters=2 threads=512 stages=3 chunk_rows=2");
  EXPECT_EQ(plan_of({kLayer, true, kBf16, 16384, 8192}, kH100),
            "bwd_chunk vec=8 iters=2 threads=512 stages=3 chunk_rows=2");
  Shape add = {kAdd, true, kBf16, 16384, 4096};
  add.dsum = true;
  EXPECT_EQ(plan_of(add, kH100), "bwd_chunk vec=8 iters=2 threads=256 stages=3 chunk_rows=2");
  EXPECT_EQ(plan_of({kRms, true, kFp32, 16384, 4096}, kH100),
            "bwd_chunk vec=4 iters=2 threads=512 stages=3 chunk_rows=2");
  // odd N: the register kernel with a scalar head
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 4095}, kH100), "bwd_regs vec=8 iters=2 threads=256 scalar_head");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 8191}, kH100), "bwd_regs vec=8 iters=2 threads=512 scalar_head");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 4096, Align::kUnaligned}, kH100), "bwd_regs vec=1 iters=16 threads=256");
  // long rows: row statistics, then column tiles
  EXPECT_EQ(plan_of({kRms, true, kBf16, 4096, 65536}, kH100), "bwd_split vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kLayer, true, kBf16, 4096, 131072}, kH100), "bwd_split vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 2, 131072}, kH100), "bwd_split vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 2, 131071}, kH100), "bwd_stream vec=1 iters=1 threads=512");
  // AdaLN: per-row scale rows staged by bulk copies; grouped scale rows chunked
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 16384, 4096, Align::kAligned, 1, true}, kH100),
            "bwd_regs_bulk vec=8 iters=2 threads=256 stages=4");
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 16384, 4096, Align::kAligned, 4096, false}, kH100),
            "bwd_chunk vec=8 iters=2 threads=256 stages=3 chunk_rows=2");
  EXPECT_EQ(plan_of({kAdaRms, true, kBf16, 16384, 2048, Align::kAligned, 4096, true}, kH100),
            "bwd_chunk vec=8 iters=1 threads=256 stages=3 chunk_rows=4");
  // AdaLN per row over few rows: no staging, but rows that could be staged keep two vectors per thread
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 64, 4096, Align::kAligned, 1, true}, kH100),
            "bwd_regs vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 16384, 8192, Align::kAligned, 1, true}, kH100),
            "bwd_regs_bulk vec=8 iters=2 threads=512 stages=3");
  // ... rows too long to stage take half the vectors per thread (scale and bias in registers)
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 64, 16384, Align::kAligned, 1, true}, kH100),
            "bwd_split vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 64, 4096, Align::kAligned, 1, true}, kA100),
            "bwd_regs vec=8 iters=1 threads=512");
}

TEST(NormPlan, BackwardA100T4) {
  EXPECT_EQ(plan_of({kRms, true, kBf16, 16384, 4096}, kA100), "bwd_regs vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kAdaLayer, true, kBf16, 16384, 4096, Align::kAligned, 1, true}, kA100),
            "bwd_regs vec=8 iters=1 threads=512");
  EXPECT_EQ(plan_of({kRms, true, kBf16, 4096, 65536}, kA100), "bwd_split vec=8 iters=2 threads=256");
  EXPECT_EQ(plan_of({kRms, true, kFp16, 16384, 8192}, kT4), "bwd_regs vec=8 iters=2 threads=512");
  EXPECT_EQ(plan_of({kRms, true, kFp32, 16384, 4096}, kT4), "bwd_regs vec=4 iters=4 threads=256");
  EXPECT_EQ(plan_of({kLayer, true, kFp16, 16384, 4095}, kT4), "bwd_regs vec=8 iters=2 threads=256 scalar_head");
}

// ---- candidates and check_plan -------------------------------------------------------------------
std::vector<Shape> all_shapes() {
  std::vector<Shape> v;
  for (bool bwd : {false, true})
    for (NormOp op : {kRms, kAdd, kLayer, kAdaRms, kAdaLayer})
      for (kf::DType t : {kBf16, kFp32})
        for (int64_t n : {int64_t(1), int64_t(512), int64_t(2048), int64_t(4095), int64_t(8192), int64_t(131072)})
          for (int64_t rows : {int64_t(1), int64_t(4096)})
            for (Align a : {Align::kAligned, Align::kShared, Align::kUnaligned}) {
              Shape s = {op, bwd, t, rows, n, a};
              if (kf::norm_is_ada(op)) s.ada_rpg = rows > 1 ? 1024 : 1;
              s.affine = (n % 2) == 0;
              s.dsum = op == kAdd;
              v.push_back(s);
              if (kf::norm_is_ada(op) && rows > 1) {  // and one scale row per x row
                s.ada_rpg = 1;
                v.push_back(s);
              }
            }
  return v;
}

TEST(NormPlan, CandidatesRunTheProblem) {
  for (const kf::DeviceInfo& dev : {kH100, kA100, kT4}) {
    std::set<NormKernel> kinds;
    for (const Shape& s : all_shapes()) {
      const NormProblem pr = problem(s);
      const std::vector<NormPlan> c = candidate_plans(pr, dev);
      const std::string what = "sm_" + std::to_string(dev.capability) + " op " + std::to_string(int(s.op)) +
                               (s.backward ? " bwd " : " fwd ") + std::to_string(s.rows) + "x" + std::to_string(s.n);
      ASSERT_FALSE(c.empty()) << what;
      EXPECT_EQ(to_string(c[0]), to_string(plan_norm(pr, dev))) << what << ": the default plan comes first";
      for (const NormPlan& p : c) {
        const kf::Status st = check_plan(p, pr, dev);
        EXPECT_TRUE(st.ok()) << what << ": " << st.message();
        kinds.insert(p.kind);
      }
    }
    // every kernel kind is a candidate somewhere (sm_90 kinds only on sm_90)
    const size_t expect = dev.capability >= 90 ? 9 : 6;
    EXPECT_EQ(kinds.size(), expect) << "sm_" << dev.capability;
  }
}

// The alternatives a sweep needs are candidates: the bulk pipeline at any row length and row count,
// the early-parameter kernel on every grid, other team sizes, the persistent kernel, clusters, the
// streaming kernels; chunked / staged / plain / split / streaming backward and other chunk sizes.
TEST(NormPlan, CandidatesIncludeTheAlternatives) {
  auto kinds_of = [](const Shape& s) {
    std::set<std::string> out;
    for (const NormPlan& p : candidate_plans(problem(s), kH100)) out.insert(to_string(p));
    return out;
  };
  const std::set<std::string> f = kinds_of({kRms, false, kBf16, 16384, 4096});
  for (const char* want : {"fwd_row vec=8 iters=2 threads=256", "fwd_row vec=8 iters=2 threads=256 early_params",
                           "fwd_row vec=8 iters=4 threads=128", "fwd_row vec=8 iters=2 threads=512",
                           "fwd_cluster vec=8 iters=2 threads=256", "fwd_stream vec=8 iters=1 threads=1024",
                           "fwd_stream vec=1 iters=1 threads=1024", "fwd_row vec=1 iters=16 threads=256",
                           "fwd_bulk vec=8 iters=1 threads=128 stages=4 params_in_regs",
                           "fwd_bulk vec=8 iters=1 threads=128 cluster=2 stages=4 params_in_regs",
                           "fwd_bulk vec=8 iters=1 threads=128 stages=4"})
    EXPECT_EQ(f.count(want), 1u) << want;
  const std::set<std::string> c = kinds_of({kRms, false, kBf16, 2, 131072});
  EXPECT_EQ(c.count("fwd_cluster vec=8 iters=4 threads=512 cluster=8"), 1u);
  EXPECT_EQ(c.count("fwd_bulk vec=8 iters=1 threads=256 cluster=8 stages=2 params_in_regs"), 1u);
  const std::set<std::string> b = kinds_of({kRms, true, kBf16, 16384, 4096});
  for (const char* want : {"bwd_chunk vec=8 iters=2 threads=256 stages=3 chunk_rows=2",
                           "bwd_chunk vec=8 iters=1 threads=512 stages=3 chunk_rows=4",
                           "bwd_chunk vec=8 iters=2 threads=256 stages=3 chunk_rows=1",
                           "bwd_regs vec=8 iters=2 threads=256", "bwd_regs_bulk vec=8 iters=2 threads=256 stages=4",
                           "bwd_regs vec=8 iters=1 threads=512", "bwd_split vec=8 iters=2 threads=256",
                           "bwd_stream vec=8 iters=1 threads=512", "bwd_regs vec=1 iters=16 threads=256"})
    EXPECT_EQ(b.count(want), 1u) << want;
  const std::set<std::string> h = kinds_of({kRms, true, kBf16, 16384, 4095});
  EXPECT_EQ(h.count("bwd_regs vec=8 iters=2 threads=256 scalar_head"), 1u);
  EXPECT_EQ(h.count("bwd_regs vec=1 iters=16 threads=256"), 1u);
}

TEST(NormPlan, CheckPlanRejects) {
  const NormProblem fwd = problem({kRms, false, kBf16, 16384, 4096});
  const NormProblem bwd = problem({kRms, true, kBf16, 16384, 4096});
  const NormProblem odd = problem({kRms, false, kBf16, 16384, 4095});
  const NormProblem ada_row = problem({kAdaLayer, true, kBf16, 16384, 4096, Align::kAligned, 1, true});
  auto rejects = [](const NormPlan& p, const NormProblem& pr, const kf::DeviceInfo& dev, const char* why) {
    const kf::Status st = check_plan(p, pr, dev);
    EXPECT_FALSE(st.ok()) << to_string(p);
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  NormPlan p = plan_norm(fwd, kH100);
  ASSERT_TRUE(check_plan(p, fwd, kH100).ok());
  NormPlan q = p;
  q.kind = static_cast<NormKernel>(99);
  rejects(q, fwd, kH100, "unknown kernel kind");
  rejects(p, bwd, kH100, "a forward kernel for a backward call");
  q = p;
  q.vec = 3;
  rejects(q, fwd, kH100, "vec must be 1 or 8");
  q = p;
  q.iters = 3;
  rejects(q, fwd, kH100, "iters must be a power of two");
  q = p;
  q.iters = 1;
  rejects(q, fwd, kH100, "do not cover the row");
  q = p;
  q.threads = 512;
  q.iters = 4;
  rejects(q, fwd, kH100, "512 threads with iters=2");
  rejects(p, odd, kH100, "16-byte vectors need");
  q = p;
  q.kind = NormKernel::kFwdCluster;
  q.scalar_head = true;
  rejects(q, odd, kH100, "only fwd_row and bwd_regs take a scalar head");
  q = p;
  q.plain_ada = true;
  rejects(q, fwd, kH100, "plain_ada needs AdaLN");
  NormPlan bulk = plan_norm(problem({kRms, false, kBf16, 4096, 65536}), kH100);
  rejects(bulk, problem({kRms, false, kBf16, 4096, 65536}), kA100, "fwd_bulk needs sm_90");
  bulk.cluster = 9;
  rejects(bulk, problem({kRms, false, kBf16, 4096, 65536}), kH100, "cluster must be 1 to 8");
  NormPlan chunk = plan_norm(bwd, kH100);
  ASSERT_EQ(chunk.kind, NormKernel::kBwdChunk);
  rejects(chunk, ada_row, kH100, "per-row AdaLN");
  chunk.chunk_rows = 3;
  chunk.iters = 2;
  rejects(chunk, bwd, kH100, "iters 1 (up to 8 rows per chunk) or 2 (up to 2)");
  NormPlan split = plan_norm(bwd, kH100);
  split.kind = NormKernel::kBwdSplit;
  split.threads = 512;
  rejects(split, bwd, kH100, "bwd_split runs");
}

}  // namespace
