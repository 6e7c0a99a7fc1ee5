// The activation planner (src/activation/activation_plan.h) on the device facts of an H100, an A100
// and a T4, without a GPU: problem -> the expected kernel, vector width, vectors per thread, block
// and grid; every candidate plan passes check_plan; impossible plans are rejected with a reason.
#include <string>
#include <vector>

#include "activation/activation_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::ActKernel;
using kf::ActPlan;
using kf::ActProblem;
using kf::DeviceInfo;

const DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

ActProblem problem(bool backward, int elem_bytes, int64_t rows, int64_t n, int align_bytes = 16) {
  ActProblem p;
  p.backward = backward;
  p.elem_bytes = elem_bytes;
  p.rows = rows;
  p.n = n;
  p.align_bytes = align_bytes;
  return p;
}

ActPlan plan_of(ActKernel kind, int vec, int vecs, int tx, int ty, int gx, int gy) {
  ActPlan p;
  p.kind = kind;
  p.vec = vec;
  p.vecs = vecs;
  p.tx = tx;
  p.ty = ty;
  p.grid_x = gx;
  p.grid_y = gy;
  return p;
}

struct Expect {
  const char* what;
  ActProblem problem;
  const DeviceInfo* dev;
  ActPlan plan;
};

constexpr ActKernel F = ActKernel::kFwd;
constexpr ActKernel B = ActKernel::kBwd;

// Expected plans, derived from the launch rules: 16-byte vectors when aligned (forward 1 vector per
// thread, backward 2; 4-byte / one-element accesses 8 forward, 4 backward); tx = the power of two
// covering a row's vectors in `vecs` passes (32..256), ty = 256 / tx rows (no more than the rows);
// a 16-byte backward grid of fewer blocks than SMs takes one vector per thread.
const Expect kExpect[] = {
    // the MLP widths of 16384 tokens, bf16, forward: one 16-byte vector per thread, 256 threads per row chunk
    {"fwd 16384x2048", problem(false, 2, 16384, 2048), &kH100, plan_of(F, 8, 1, 256, 1, 1, 16384)},
    {"fwd 16384x4096", problem(false, 2, 16384, 4096), &kH100, plan_of(F, 8, 1, 256, 1, 2, 16384)},
    {"fwd 16384x8192", problem(false, 2, 16384, 8192), &kH100, plan_of(F, 8, 1, 256, 1, 4, 16384)},
    {"fwd 16384x14336", problem(false, 2, 16384, 14336), &kH100, plan_of(F, 8, 1, 256, 1, 7, 16384)},
    {"fwd 16384x4096 A100", problem(false, 2, 16384, 4096), &kA100, plan_of(F, 8, 1, 256, 1, 2, 16384)},
    {"fwd 16384x4096 fp32", problem(false, 4, 16384, 4096), &kH100, plan_of(F, 4, 1, 256, 1, 4, 16384)},
    // backward: two 16-byte vectors per thread
    {"bwd 16384x2048", problem(true, 2, 16384, 2048), &kH100, plan_of(B, 8, 2, 128, 2, 1, 8192)},
    {"bwd 16384x4096", problem(true, 2, 16384, 4096), &kH100, plan_of(B, 8, 2, 256, 1, 1, 16384)},
    {"bwd 16384x8192", problem(true, 2, 16384, 8192), &kH100, plan_of(B, 8, 2, 256, 1, 2, 16384)},
    {"bwd 16384x14336", problem(true, 2, 16384, 14336), &kH100, plan_of(B, 8, 2, 256, 1, 4, 16384)},
    {"bwd 16384x4096 T4 fp16", problem(true, 2, 16384, 4096), &kT4, plan_of(B, 8, 2, 256, 1, 1, 16384)},
    // decode: one row
    {"fwd 1x4096", problem(false, 2, 1, 4096), &kH100, plan_of(F, 8, 1, 256, 1, 2, 1)},
    {"fwd 1x1", problem(false, 2, 1, 1), &kH100, plan_of(F, 8, 1, 32, 1, 1, 1)},
    {"bwd 1x4096 (under one wave: 1 vector)", problem(true, 2, 1, 4096), &kH100, plan_of(B, 8, 1, 256, 1, 2, 1)},
    {"bwd 1x4096 T4", problem(true, 2, 1, 4096), &kT4, plan_of(B, 8, 1, 256, 1, 2, 1)},
    // 64 rows of 4096: 64 blocks, under one wave of the H100 and A100, not of the T4
    {"bwd 64x4096 H100", problem(true, 2, 64, 4096), &kH100, plan_of(B, 8, 1, 256, 1, 2, 64)},
    {"bwd 64x4096 A100", problem(true, 2, 64, 4096), &kA100, plan_of(B, 8, 1, 256, 1, 2, 64)},
    {"bwd 64x4096 T4", problem(true, 2, 64, 4096), &kT4, plan_of(B, 8, 2, 256, 1, 1, 64)},
    // odd sizes: 4-byte and one-element accesses
    {"fwd 7x127 fp16 odd stride", problem(false, 2, 7, 127, 2), &kH100, plan_of(F, 1, 8, 32, 8, 1, 1)},
    {"fwd 19x4097 fp16 4-byte", problem(false, 2, 19, 4097, 4), &kH100, plan_of(F, 2, 8, 256, 1, 2, 19)},
    {"bwd 19x4097 bf16 4-byte", problem(true, 2, 19, 4097, 4), &kH100, plan_of(B, 2, 4, 256, 1, 3, 19)},
    {"fwd 3x4097 fp32 unaligned", problem(false, 4, 3, 4097, 4), &kH100, plan_of(F, 1, 8, 256, 1, 3, 3)},
    {"bwd 257x520 fp32 unaligned", problem(true, 4, 257, 520, 4), &kA100, plan_of(B, 1, 4, 256, 1, 1, 257)},
    // 600000 rows of 3: 75000 row groups of 8, capped at 65535 (the kernels loop over rows)
    {"fwd 600000x3 fp16", problem(false, 2, 600000, 3, 2), &kH100, plan_of(F, 1, 8, 32, 8, 1, 65535)},
};

void expect_same(const ActPlan& got, const ActPlan& want) {
  EXPECT_EQ(kf::to_string(got), kf::to_string(want));
  EXPECT_EQ(got.kind, want.kind);
}

TEST(ActPlan, ExpectedPlans) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    expect_same(kf::plan_activation(e.problem, *e.dev), e.plan);
  }
}

TEST(ActPlan, ToString) {
  EXPECT_EQ(kf::to_string(plan_of(F, 8, 1, 128, 2, 1, 8192)), "act_fwd vec=8 vecs=1 block=128x2 grid=1x8192");
  EXPECT_EQ(kf::to_string(plan_of(B, 2, 4, 32, 8, 3, 7)), "act_bwd vec=2 vecs=4 block=32x8 grid=3x7");
}

TEST(ActPlan, CandidatesPassCheckPlan) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const std::vector<ActPlan> plans = kf::candidate_plans(e.problem, *e.dev);
    ASSERT_FALSE(plans.empty());
    expect_same(plans.front(), kf::plan_activation(e.problem, *e.dev));  // the default comes first
    for (const ActPlan& p : plans) {
      SCOPED_TRACE(kf::to_string(p));
      const kf::Status s = kf::check_plan(p, e.problem, *e.dev);
      EXPECT_TRUE(s.ok()) << s.message();
      for (const ActPlan& q : plans)
        if (&q != &p) {
          EXPECT_NE(kf::to_string(p), kf::to_string(q));
        }
    }
  }
}

// What the build-time sweep switches and tuning keys could force is a candidate: four 16-byte
// vectors per thread in the forward, two in the backward under one wave, narrow accesses on aligned
// rows.
TEST(ActPlan, CandidatesCoverTheVariants) {
  auto has = [](const std::vector<ActPlan>& plans, ActKernel k, int vec, int vecs) {
    for (const ActPlan& p : plans)
      if (p.kind == k && p.vec == vec && p.vecs == vecs) return true;
    return false;
  };
  const std::vector<ActPlan> fwd = kf::candidate_plans(problem(false, 2, 16384, 4096), kH100);
  EXPECT_TRUE(has(fwd, F, 8, 1));
  EXPECT_TRUE(has(fwd, F, 8, 4));
  EXPECT_TRUE(has(fwd, F, 2, 8));
  EXPECT_TRUE(has(fwd, F, 1, 8));
  EXPECT_EQ(fwd.size(), 4u);
  const std::vector<ActPlan> bwd = kf::candidate_plans(problem(true, 2, 1, 4096), kH100);
  EXPECT_TRUE(has(bwd, B, 8, 1));
  EXPECT_TRUE(has(bwd, B, 8, 2));
  EXPECT_TRUE(has(bwd, B, 2, 4));
  EXPECT_TRUE(has(bwd, B, 1, 4));
  const std::vector<ActPlan> fp32 = kf::candidate_plans(problem(false, 4, 3, 4097, 4), kH100);
  ASSERT_EQ(fp32.size(), 1u);  // one element per access is all an unaligned fp32 row allows
  EXPECT_TRUE(has(fp32, F, 1, 8));
  EXPECT_TRUE(kf::candidate_plans(problem(false, 2, 0, 4096), kH100).empty());
  EXPECT_TRUE(kf::candidate_plans(problem(true, 2, 5, 0), kH100).empty());
}

TEST(ActPlan, BogusPlansRejected) {
  const ActProblem pr = problem(false, 2, 16384, 4096, 4);  // 4-byte aligned rows
  const ActPlan good = kf::plan_activation(pr, kH100);
  ASSERT_TRUE(kf::check_plan(good, pr, kH100).ok());
  auto rejected = [&](ActPlan p, const char* needle, const ActProblem& on) {
    const kf::Status s = kf::check_plan(p, on, kH100);
    EXPECT_FALSE(s.ok()) << kf::to_string(p);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  ActPlan p = good;
  p.kind = static_cast<ActKernel>(7);
  rejected(p, "unknown kernel", pr);
  p = good;
  p.kind = B;
  rejected(p, "forward call", pr);
  p = good;
  p.vec = 8;  // 16 bytes on 4-byte aligned rows
  rejected(p, "do not fit rows aligned to 4 bytes", pr);
  p = good;
  p.vecs = 3;
  rejected(p, "not built for 3 vectors", pr);
  p = good;
  p.tx = 48;
  rejected(p, "power of two", pr);
  p = good;
  p.ty = 2;  // 256 x 2 threads
  rejected(p, "at most 256 threads", pr);
  p = good;
  p.tx = 128;  // 128 threads x 8 vectors of one block column: half of the row's 2048 vectors
  rejected(p, "does not cover", pr);
  p = good;
  p.grid_y = 70000;
  rejected(p, "grid_y", pr);
  rejected(good, "empty", problem(false, 2, 0, 4096, 4));
}

// ---- the bias gradient (gelu_backward_bias_grad) ---------------------------------------------------
ActProblem bias_problem(int elem_bytes, int64_t rows, int64_t n, int align_bytes = 16) {
  ActProblem p = problem(true, elem_bytes, rows, n, align_bytes);
  p.bias_grad = true;
  return p;
}
constexpr ActKernel G = ActKernel::kBiasGrad;
ActPlan bias_plan(int vec, int rows, int gx, int chunks, int64_t chunk_rows) {
  ActPlan p = plan_of(G, vec, rows, 32, 8, gx, chunks);
  p.chunk_rows = chunk_rows;
  return p;
}

// Strips of 32 vectors; chunks for ~1024 blocks at a nominal 256-column strip, at most 128 chunks of at
// least 32 rows; 4 rows in flight on 16-byte vectors, 8 on narrow ones.
TEST(ActPlan, BiasGradPlans) {
  struct Case {
    const char* what;
    ActProblem problem;
    ActPlan plan;
  };
  const Case cases[] = {
      // 16 strips of 256 columns x 64 chunks of 256 rows: 1024 blocks; 1 MB of partials
      {"16384x4096 bf16", bias_problem(2, 16384, 4096), bias_plan(8, 4, 16, 64, 256)},
      {"16384x14336 bf16", bias_problem(2, 16384, 14336), bias_plan(8, 4, 56, 19, 863)},
      {"4096x4096 fp32", bias_problem(4, 4096, 4096), bias_plan(4, 4, 32, 64, 64)},
      // few rows: one chunk; a row's last partial vector in the last strip
      {"1x7 bf16", bias_problem(2, 1, 7), bias_plan(8, 4, 1, 1, 1)},
      {"7x4099 fp16", bias_problem(2, 7, 4099), bias_plan(8, 4, 17, 1, 7)},
      // 1000 rows: 32 chunks of 32 rows (the minimum chunk)
      {"1000x4099 fp32 unaligned", bias_problem(4, 1000, 4099, 4), bias_plan(1, 8, 129, 32, 32)},
      {"1000x1 bf16 4-byte", bias_problem(2, 1000, 1, 4), bias_plan(2, 8, 1, 32, 32)},
      // no rows: no column pass, the reduction writes zeros
      {"0x4096 bf16", bias_problem(2, 0, 4096), bias_plan(8, 4, 16, 0, 1)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    for (const kf::DeviceInfo* dev : {&kH100, &kA100, &kT4}) {  // the device changes nothing
      expect_same(kf::plan_activation(c.problem, *dev), c.plan);
      const std::vector<ActPlan> plans = kf::candidate_plans(c.problem, *dev);
      ASSERT_FALSE(plans.empty());
      expect_same(plans.front(), c.plan);
      for (const ActPlan& p : plans) {
        SCOPED_TRACE(kf::to_string(p));
        EXPECT_EQ(p.kind, G);
        EXPECT_EQ(p.grid_y, c.plan.grid_y);  // one chunking for every plan: one summation order
        EXPECT_EQ(p.chunk_rows, c.plan.chunk_rows);
        const kf::Status s = kf::check_plan(p, c.problem, *dev);
        EXPECT_TRUE(s.ok()) << s.message();
      }
    }
    EXPECT_EQ(kf::act_bias_workspace_floats(c.problem.rows, c.problem.n), int64_t(c.plan.grid_y) * c.problem.n);
  }
  EXPECT_EQ(kf::to_string(bias_plan(8, 4, 16, 64, 256)), "act_bias_grad vec=8 vecs=4 block=32x8 grid=16x64 chunk=256");
  // every width and built row count of an aligned 16-bit problem
  EXPECT_EQ(kf::candidate_plans(bias_problem(2, 16384, 4096), kH100).size(), 4u);  // 8x{4,2}, 2x8, 1x8
  EXPECT_EQ(kf::gelu_backward_bias_grad_workspace_size(16384, 4096), size_t(64) * 4096 * 4);
  EXPECT_EQ(kf::gelu_backward_bias_grad_workspace_size(0, 4096), 0u);
  EXPECT_EQ(kf::gelu_backward_bias_grad_workspace_size(5, 0), 0u);
  // empty only without columns
  EXPECT_FALSE(kf::act_empty(bias_problem(2, 0, 4096)));
  EXPECT_TRUE(kf::act_empty(bias_problem(2, 5, 0)));
  EXPECT_TRUE(kf::candidate_plans(bias_problem(2, 5, 0), kH100).empty());
}

TEST(ActPlan, BiasGradBogusPlansRejected) {
  const ActProblem pr = bias_problem(2, 16384, 4096);
  const ActPlan good = kf::plan_activation(pr, kH100);
  ASSERT_TRUE(kf::check_plan(good, pr, kH100).ok());
  auto rejected = [&](ActPlan p, const char* needle) {
    const kf::Status s = kf::check_plan(p, pr, kH100);
    EXPECT_FALSE(s.ok()) << kf::to_string(p);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  ActPlan p = good;
  p.kind = B;
  rejected(p, "bias-gradient call");
  p = good;
  p.vecs = 3;
  rejected(p, "not built for 3 vectors");
  p = good;
  p.tx = 64;
  p.ty = 4;
  rejected(p, "block is 32x8");
  p = good;
  p.grid_x = 8;
  rejected(p, "does not cover");
  p = good;
  p.grid_y = 32;
  p.chunk_rows = 512;
  rejected(p, "row chunks must be the sizes' 64 x 256 rows");
  rejected(plan_of(B, 8, 2, 256, 1, 1, 16384), "bias-gradient call");
}

// make_act_problem: the widest access every base pointer and row stride allows.
TEST(ActPlan, ProblemAlignment) {
  kf::ActParams p;
  p.rows = 16;
  p.n = 4096;
  p.a = reinterpret_cast<const void*>(uintptr_t{0x10000});
  p.b = reinterpret_cast<const void*>(uintptr_t{0x10000 + 2 * 4096});  // second half of [16, 8192] bf16
  p.y = reinterpret_cast<void*>(uintptr_t{0x80000});
  p.a_stride = p.b_stride = 8192;
  p.y_stride = 4096;
  EXPECT_EQ(kf::make_act_problem(p, false, 2).align_bytes, 16);
  p.b = reinterpret_cast<const void*>(uintptr_t{0x10000 + 2 * 4097});  // odd I: the second half is 2 bytes off
  EXPECT_EQ(kf::make_act_problem(p, false, 2).align_bytes, 2);
  p.b = reinterpret_cast<const void*>(uintptr_t{0x10000 + 2 * 4098});
  EXPECT_EQ(kf::make_act_problem(p, false, 2).align_bytes, 4);
  EXPECT_EQ(kf::make_act_problem(p, false, 4).align_bytes, 4);  // fp32: one element (4 bytes)
  // the backward ignores y; its own tensors decide
  p.b = reinterpret_cast<const void*>(uintptr_t{0x10000 + 2 * 4096});
  p.y = reinterpret_cast<void*>(uintptr_t{0x80002});
  p.dy = reinterpret_cast<const void*>(uintptr_t{0x90000});
  p.da = reinterpret_cast<void*>(uintptr_t{0xa0000});
  p.db = reinterpret_cast<void*>(uintptr_t{0xa0000 + 2 * 4096});
  p.dy_stride = 4096;
  p.da_stride = p.db_stride = 8192;
  EXPECT_EQ(kf::make_act_problem(p, false, 2).align_bytes, 2);
  EXPECT_EQ(kf::make_act_problem(p, true, 2).align_bytes, 16);
  // one row: the strides are never used
  p.rows = 1;
  p.dy_stride = 3;
  EXPECT_EQ(kf::make_act_problem(p, true, 2).align_bytes, 16);
  const ActProblem pr = kf::make_act_problem(p, true, 2);
  EXPECT_TRUE(pr.backward);
  EXPECT_FALSE(pr.bias_grad);
  // a bias gradient: dbias (written element by element) does not narrow the access
  p.dbias = reinterpret_cast<void*>(uintptr_t{0xb0002});
  EXPECT_TRUE(kf::make_act_problem(p, true, 2).bias_grad);
  EXPECT_EQ(kf::make_act_problem(p, true, 2).align_bytes, 16);
  EXPECT_EQ(pr.rows, 1);
  EXPECT_EQ(pr.n, 4096);
}

}  // namespace
