// The dropout planner on the device facts of an H100 (no GPU needed): the kernel follows the
// alignment, small problems take one item per thread, the grid covers the problem, and check_plan
// rejects plans that cannot run.
#include <cstdint>

#include "dropout/dropout_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;

kf::DeviceInfo h100() {
  kf::DeviceInfo d;
  d.sm_count = 132;
  d.capability = 90;
  d.max_threads_per_sm = 2048;
  d.l2_bytes = 50 << 20;
  return d;
}

kf::DropProblem problem(int64_t numel, int elem_bytes, bool vec_ok = true) {
  kf::DropProblem pr;
  pr.numel = numel;
  pr.elem_bytes = elem_bytes;
  pr.vec_ok = vec_ok;
  return pr;
}

TEST(DropPlan, AlignmentPicksKernel) {
  const kf::DeviceInfo dev = h100();
  kf::DropPlan p = kf::plan_dropout(problem(16384 * 4096, 2), dev);
  EXPECT_EQ(p.kind, kf::DropKernel::kVec) << kf::to_string(p);
  EXPECT_EQ(p.vec, 8);
  EXPECT_EQ(p.unroll, 2);
  EXPECT_EQ(p.grid, 132 * 2048 / 256);  // one resident wave, the grid-stride loop covers the rest
  p = kf::plan_dropout(problem(4097 * 1023, 4), dev);
  EXPECT_EQ(p.vec, 4);
  p = kf::plan_dropout(problem(16384 * 4096, 2, false), dev);
  EXPECT_EQ(p.kind, kf::DropKernel::kScalar) << kf::to_string(p);
  EXPECT_EQ(p.vec, 8);  // one Philox group of 8 elements
  EXPECT_EQ(p.unroll, 2);
}

TEST(DropPlan, MakeProblemReadsAlignment) {
  kf::DropParams q;
  q.numel = 100;
  q.in = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  q.out = reinterpret_cast<void*>(uintptr_t{2} << 20);
  EXPECT_TRUE(kf::make_drop_problem(q, 2).vec_ok);
  q.mask = reinterpret_cast<uint8_t*>((uintptr_t{3} << 20) + 4);  // 4-byte aligned: not 8 for bf16 vectors
  EXPECT_FALSE(kf::make_drop_problem(q, 2).vec_ok);
  EXPECT_TRUE(kf::make_drop_problem(q, 4).vec_ok);  // float32 vectors write 4 mask bytes
  q.mask = nullptr;
  q.add = reinterpret_cast<const void*>((uintptr_t{4} << 20) + 2);  // residual one bf16 off
  EXPECT_FALSE(kf::make_drop_problem(q, 2).vec_ok);
}

TEST(DropPlan, SmallProblemsOneItemPerThread) {
  const kf::DropPlan p = kf::plan_dropout(problem(7 * 4096, 2), h100());
  EXPECT_EQ(p.unroll, 1) << kf::to_string(p);
  EXPECT_EQ(p.grid, (7 * 4096 / 8 + 255) / 256);
  EXPECT_EQ(kf::plan_dropout(problem(1, 4), h100()).grid, 1);
}

TEST(DropPlan, CandidatesRunAndCover) {
  const kf::DeviceInfo dev = h100();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(16384) * 4096}) {
    for (int eb : {2, 4}) {
      for (bool vec_ok : {true, false}) {
        const kf::DropProblem pr = problem(n, eb, vec_ok);
        const std::vector<kf::DropPlan> plans = kf::candidate_plans(pr, dev);
        ASSERT_FALSE(plans.empty());
        bool capped = false;
        for (const kf::DropPlan& p : plans) {
          EXPECT_TRUE(kf::check_plan(p, pr, dev).ok()) << kf::to_string(p);
          if (!vec_ok) {
            EXPECT_EQ(p.kind, kf::DropKernel::kScalar);
          }
          capped = capped || (p.grid == dev.sm_count);
        }
        if (n == int64_t(16384) * 4096) {
          EXPECT_TRUE(capped) << "a grid-stride candidate";
        }
      }
    }
  }
  EXPECT_TRUE(kf::candidate_plans(problem(0, 2), dev).empty());
}

TEST(DropPlan, CheckPlanRejects) {
  const kf::DeviceInfo dev = h100();
  const kf::DropProblem pr = problem(4099, 2, false);
  kf::DropPlan p = kf::plan_dropout(problem(4099, 2), dev);
  EXPECT_FALSE(kf::check_plan(p, pr, dev).ok());  // vectors on unaligned data
  p = kf::plan_dropout(pr, dev);
  p.unroll = 3;
  EXPECT_FALSE(kf::check_plan(p, pr, dev).ok());  // not built
  p = kf::plan_dropout(pr, dev);
  p.vec = 4;  // the scalar kernel's item is one Philox group of 8
  EXPECT_FALSE(kf::check_plan(p, pr, dev).ok());
  p = kf::plan_dropout(pr, dev);
  p.grid = 0;
  EXPECT_FALSE(kf::check_plan(p, pr, dev).ok());
  EXPECT_FALSE(kf::check_plan(kf::plan_dropout(problem(1, 2), dev), problem(0, 2), dev).ok());
  EXPECT_EQ(kf::to_string(kf::plan_dropout(problem(16384 * 4096, 2), dev)), "dropout_vec vec=8 unroll=2 grid=1056");
}

}  // namespace
