// The softmax planner (src/softmax/softmax_plan.h) without a GPU: problem -> the expected kernel and
// launch parameters on H100 / A100 / T4 device facts; candidate_plans non-empty, led by the default
// plan, each passing check_plan; impossible plans rejected with a reason.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "softmax/softmax_plan.h"

namespace {

namespace kf = kernelforge;
using kf::SoftmaxKernel;
using kf::SoftmaxPlan;
using kf::SoftmaxProblem;
using M = kf::SoftmaxRegsMode;

kf::DeviceInfo h100() { return {132, 90, 2048, 50 << 20}; }
kf::DeviceInfo a100() { return {108, 80, 2048, 40 << 20}; }
kf::DeviceInfo t4() { return {40, 75, 1024, 4 << 20}; }

enum Op { kFwd, kLogFwd, kBwd, kLogBwd };
enum Align { kAligned, kShared, kNone };  // contiguous rows / odd rows sharing a misalignment / base + 1

// A contiguous [rows, n] call on 256-byte aligned buffers (`align`: how its rows may be read).
SoftmaxProblem prob(Op op, int elem_size, int64_t rows, int64_t n, Align align = kAligned) {
  SoftmaxProblem p;
  p.log = op == kLogFwd || op == kLogBwd;
  p.backward = op == kBwd || op == kLogBwd;
  p.elem_size = elem_size;
  p.rows = rows;
  p.n = n;
  p.vec_ok = align == kAligned;
  p.head_ok = align != kNone;
  return p;
}

SoftmaxPlan regs(int vec, int iters, int threads, int rows_per_block, M mode, int cluster = 1, bool head = false) {
  SoftmaxPlan p;
  p.kind = SoftmaxKernel::kRegs;
  p.vec = vec, p.iters = iters, p.threads = threads, p.rows_per_block = rows_per_block, p.mode = mode;
  p.cluster = cluster, p.scalar_head = head;
  return p;
}
SoftmaxPlan fwd_row(int vec, int iters, int threads, bool head = false) {
  SoftmaxPlan p;
  p.kind = SoftmaxKernel::kFwdRow;
  p.vec = vec, p.iters = iters, p.threads = threads, p.scalar_head = head;
  return p;
}
SoftmaxPlan stream(int vec, int cluster, bool head = false) {
  SoftmaxPlan p;
  p.kind = SoftmaxKernel::kStream;
  p.vec = vec, p.iters = 0, p.threads = 1024, p.cluster = cluster, p.scalar_head = head;
  return p;
}
SoftmaxPlan bulk_fwd(int vec, int iters, int threads, int cluster, int stages) {
  SoftmaxPlan p;
  p.kind = SoftmaxKernel::kBulkFwd;
  p.vec = vec, p.iters = iters, p.threads = threads, p.cluster = cluster, p.stages = stages;
  return p;
}

struct Expect {
  const char* what;
  kf::DeviceInfo dev;
  SoftmaxProblem problem;
  SoftmaxPlan plan;
};

// Every expected plan below is what the launcher chose for the call before the plan became a value
// (the same kernel instantiation, block, grid, cluster, stages and shared memory).
const std::vector<Expect>& expectations() {
  static const std::vector<Expect> e = {
      // decode: under one wave of blocks, one vector per thread where 512 threads cover the row
      {"1x4096 bf16 fwd", h100(), prob(kFwd, 2, 1, 4096), fwd_row(8, 1, 512)},
      {"1x4096 bf16 log fwd", h100(), prob(kLogFwd, 2, 1, 4096), fwd_row(8, 1, 512)},
      {"1x4096 bf16 bwd", h100(), prob(kBwd, 2, 1, 4096), regs(8, 1, 512, 1, M::kOnline)},
      {"64x4096 bf16 fwd H100 (decode)", h100(), prob(kFwd, 2, 64, 4096), fwd_row(8, 1, 512)},
      {"64x4096 bf16 fwd T4 (a wave)", t4(), prob(kFwd, 2, 64, 4096), fwd_row(8, 2, 256)},
      {"1x32000 bf16 fwd", h100(), prob(kFwd, 2, 1, 32000), regs(8, 8, 512, 1, M::kOnline)},
      {"1x131072 bf16 fwd", h100(), prob(kFwd, 2, 1, 131072), stream(8, 2)},
      {"64x131072 bf16 fwd (rows < SMs)", h100(), prob(kFwd, 2, 64, 131072), stream(8, 2)},
      {"1x3 fp32 fwd", h100(), prob(kFwd, 4, 1, 3, kNone), regs(1, 1, 4, 32, M::kMaxThenSum)},
      // short rows: teams of 64 threads, two rows per block
      {"16384x1024 bf16 fwd", h100(), prob(kFwd, 2, 16384, 1024), regs(8, 2, 64, 2, M::kMaxThenSum)},
      {"16384x1024 bf16 log fwd", h100(), prob(kLogFwd, 2, 16384, 1024), regs(8, 2, 64, 2, M::kMaxThenSum)},
      {"16384x1024 bf16 bwd", h100(), prob(kBwd, 2, 16384, 1024), regs(8, 2, 64, 2, M::kOnline)},
      // one CTA per row: the forward row kernel, the backward's register kernel
      {"16384x2048 bf16 fwd", h100(), prob(kFwd, 2, 16384, 2048), fwd_row(8, 2, 128)},
      {"16384x2048 bf16 bwd", h100(), prob(kBwd, 2, 16384, 2048), regs(8, 2, 128, 1, M::kOnline)},
      {"16384x4096 bf16 fwd", h100(), prob(kFwd, 2, 16384, 4096), fwd_row(8, 2, 256)},
      {"16384x4096 bf16 log bwd", h100(), prob(kLogBwd, 2, 16384, 4096), regs(8, 2, 256, 1, M::kOnline)},
      {"16384x4096 fp32 fwd", h100(), prob(kFwd, 4, 16384, 4096), fwd_row(4, 2, 512)},
      {"16384x8192 bf16 fwd", h100(), prob(kFwd, 2, 16384, 8192), fwd_row(8, 2, 512)},
      {"16384x8192 bf16 log fwd", h100(), prob(kLogFwd, 2, 16384, 8192), fwd_row(8, 2, 512)},
      {"16384x8192 bf16 bwd", h100(), prob(kBwd, 2, 16384, 8192), regs(8, 2, 512, 1, M::kOnline)},
      {"16384x12288 bf16 fwd", h100(), prob(kFwd, 2, 16384, 12288), fwd_row(8, 4, 512)},
      {"16384x16384 bf16 fwd (32 KB)", h100(), prob(kFwd, 2, 16384, 16384), fwd_row(8, 4, 512)},
      {"16384x4096 fp16 fwd T4", t4(), prob(kFwd, 2, 16384, 4096), fwd_row(8, 2, 256)},
      {"1x4096 fp16 fwd T4", t4(), prob(kFwd, 2, 1, 4096), fwd_row(8, 1, 512)},
      // rows over 32 KB: the bulk kernel once the rows fill a wave; the backward in registers
      {"16384x32768 bf16 fwd", h100(), prob(kFwd, 2, 16384, 32768), bulk_fwd(8, 8, 512, 1, 2)},
      {"16384x32768 bf16 bwd", h100(), prob(kBwd, 2, 16384, 32768), regs(8, 8, 512, 1, M::kOnline)},
      {"16384x32768 fp32 fwd", h100(), prob(kFwd, 4, 16384, 32768), bulk_fwd(4, 8, 512, 2, 2)},
      {"16384x32768 bf16 fwd A100", a100(), prob(kFwd, 2, 16384, 32768), regs(8, 8, 512, 1, M::kOnline)},
      {"8192x32000 bf16 fwd", h100(), prob(kFwd, 2, 8192, 32000), bulk_fwd(8, 8, 512, 1, 2)},
      {"4096x32768 bf16 fwd", h100(), prob(kFwd, 2, 4096, 32768), bulk_fwd(8, 8, 512, 1, 2)},
      {"4096x32768 bf16 log bwd", h100(), prob(kLogBwd, 2, 4096, 32768), regs(8, 8, 512, 1, M::kOnline)},
      {"132x131072 bf16 fwd", h100(), prob(kFwd, 2, 132, 131072), bulk_fwd(8, 8, 512, 4, 2)},
      {"4096x131072 bf16 fwd", h100(), prob(kFwd, 2, 4096, 131072), bulk_fwd(8, 8, 512, 4, 2)},
      {"4096x131072 bf16 log fwd", h100(), prob(kLogFwd, 2, 4096, 131072), bulk_fwd(8, 8, 512, 4, 2)},
      {"4096x131072 bf16 bwd", h100(), prob(kBwd, 2, 4096, 131072), regs(8, 4, 512, 1, M::kOnline, 8)},
      {"4096x131072 bf16 fwd A100", a100(), prob(kFwd, 2, 4096, 131072), stream(8, 1)},
      {"4096x131072 bf16 bwd A100", a100(), prob(kBwd, 2, 4096, 131072), stream(8, 1)},
      {"4096x131072 fp16 bwd T4", t4(), prob(kBwd, 2, 4096, 131072), stream(8, 1)},
      {"256x262144 bf16 fwd", h100(), prob(kFwd, 2, 256, 262144), bulk_fwd(8, 8, 512, 8, 2)},
      {"256x262144 bf16 bwd", h100(), prob(kBwd, 2, 256, 262144), regs(8, 8, 512, 1, M::kOnline, 8)},
      {"256x262144 fp32 fwd (1 MB rows: over the bulk cap)", h100(), prob(kFwd, 4, 256, 262144), stream(4, 2)},
      {"256x262144 fp32 bwd", h100(), prob(kBwd, 4, 256, 262144), stream(4, 2)},
      // odd rows sharing their misalignment: a scalar head, then 16-byte vectors
      {"16384x1031 bf16 fwd", h100(), prob(kFwd, 2, 16384, 1031, kShared), fwd_row(8, 2, 128, true)},
      {"16384x2047 bf16 fwd", h100(), prob(kFwd, 2, 16384, 2047, kShared), fwd_row(8, 2, 128, true)},
      {"16384x2047 bf16 bwd", h100(), prob(kBwd, 2, 16384, 2047, kShared), regs(8, 2, 128, 1, M::kOnline, 1, true)},
      {"16384x4095 bf16 fwd", h100(), prob(kFwd, 2, 16384, 4095, kShared), fwd_row(8, 2, 256, true)},
      {"16384x4095 bf16 log fwd", h100(), prob(kLogFwd, 2, 16384, 4095, kShared), fwd_row(8, 2, 256, true)},
      {"16384x4095 bf16 bwd", h100(), prob(kBwd, 2, 16384, 4095, kShared), regs(8, 2, 256, 1, M::kOnline, 1, true)},
      {"16384x2047 fp32 fwd", h100(), prob(kFwd, 4, 16384, 2047, kShared), fwd_row(4, 2, 256, true)},
      {"16384x8191 bf16 fwd", h100(), prob(kFwd, 2, 16384, 8191, kShared), fwd_row(8, 2, 512, true)},
      {"16384x16383 bf16 fwd", h100(), prob(kFwd, 2, 16384, 16383, kShared), fwd_row(8, 4, 512, true)},
      {"16384x8191 bf16 bwd", h100(), prob(kBwd, 2, 16384, 8191, kShared), stream(8, 1, true)},
      {"8192x32001 bf16 fwd", h100(), prob(kFwd, 2, 8192, 32001, kShared), stream(8, 1, true)},
      {"2048x131073 bf16 fwd", h100(), prob(kFwd, 2, 2048, 131073, kShared), stream(8, 2, true)},
      {"16384x1023 bf16 fwd (short: one element)", h100(), prob(kFwd, 2, 16384, 1023, kShared),
       regs(1, 2, 512, 1, M::kMaxThenSumRepeat)},
      {"16384x7 fp32 bwd (teams under a vector)", h100(), prob(kBwd, 4, 16384, 7, kShared),
       regs(1, 2, 4, 32, M::kOnline)},
      // rows that share nothing: one element per access
      {"16384x4095 bf16 fwd unaligned", h100(), prob(kFwd, 2, 16384, 4095, kNone),
       regs(1, 8, 512, 1, M::kMaxThenSumRepeat)},
      {"16384x4095 bf16 log fwd unaligned", h100(), prob(kLogFwd, 2, 16384, 4095, kNone),
       regs(1, 8, 512, 1, M::kMaxThenSum)},
      {"16384x65536 bf16 fwd unaligned", h100(), prob(kFwd, 2, 16384, 65536, kNone), stream(1, 1)},
      {"16384x8192 bf16 bwd unaligned", h100(), prob(kBwd, 2, 16384, 8192, kNone), regs(1, 8, 512, 1, M::kOnline, 2)},
      {"16384x8192 bf16 bwd unaligned A100", a100(), prob(kBwd, 2, 16384, 8192, kNone), stream(1, 1)},
  };
  return e;
}

TEST(SoftmaxPlan, DefaultPlans) {
  for (const Expect& e : expectations()) {
    const SoftmaxPlan got = kf::plan_softmax(e.problem, e.dev);
    EXPECT_EQ(kf::to_string(got), kf::to_string(e.plan)) << e.what;
    EXPECT_TRUE(got == e.plan) << e.what;
    const kf::Status st = kf::check_plan(got, e.problem, e.dev);
    EXPECT_TRUE(st.ok()) << e.what << ": " << st.message();
  }
}

TEST(SoftmaxPlan, ToString) {
  EXPECT_EQ(kf::to_string(fwd_row(8, 2, 256)), "fwd_row vec=8 iters=2 threads=256");
  EXPECT_EQ(kf::to_string(regs(8, 2, 64, 2, M::kMaxThenSum)),
            "regs vec=8 iters=2 threads=64 rows_per_block=2 mode=max_then_sum");
  EXPECT_EQ(kf::to_string(bulk_fwd(8, 8, 512, 4, 2)), "bulk_fwd vec=8 iters=8 threads=512 cluster=4 stages=2");
  EXPECT_EQ(kf::to_string(stream(8, 1, true)), "stream vec=8 threads=1024 scalar_head");
}

TEST(SoftmaxPlan, CandidatesRunnable) {
  const Op ops[] = {kFwd, kLogFwd, kBwd, kLogBwd};
  const Align aligns[] = {kAligned, kShared, kNone};
  const kf::DeviceInfo devs[] = {h100(), a100(), t4()};
  const int64_t shapes[][2] = {{1, 1},         {3, 7},        {1, 4096},     {64, 4096},     {16384, 1024},
                               {16384, 2048},  {16384, 4096}, {16384, 8192}, {16384, 32768}, {4096, 32768},
                               {4096, 131072}, {256, 262144}, {16384, 2047}, {16384, 4095},  {8192, 32001},
                               {2, 131073},    {5, 16383}};
  for (const kf::DeviceInfo& dev : devs)
    for (Op op : ops)
      for (int es : {2, 4})
        for (Align al : aligns)
          for (const auto& s : shapes) {
            const SoftmaxProblem pr = prob(op, es, s[0], s[1], al);
            const std::string what = std::to_string(s[0]) + "x" + std::to_string(s[1]) + " op " + std::to_string(op) +
                                     " es " + std::to_string(es) + " align " + std::to_string(al) + " sm_" +
                                     std::to_string(dev.capability);
            const std::vector<SoftmaxPlan> c = kf::candidate_plans(pr, dev);
            ASSERT_FALSE(c.empty()) << what;
            EXPECT_TRUE(c.front() == kf::plan_softmax(pr, dev)) << what;
            for (size_t i = 0; i < c.size(); ++i) {
              const kf::Status st = kf::check_plan(c[i], pr, dev);
              EXPECT_TRUE(st.ok()) << what << ": " << st.message();
              for (size_t j = 0; j < i; ++j)
                EXPECT_FALSE(c[i] == c[j]) << what << ": duplicate " << kf::to_string(c[i]);
            }
            // the fallback of every plan runs too
            for (const SoftmaxPlan& p : c) {
              const SoftmaxPlan f = kf::fallback_plan(p, pr, dev);
              EXPECT_TRUE(kf::check_plan(f, pr, dev).ok()) << what << ": fallback of " << kf::to_string(p);
            }
          }
}

// The alternatives the candidates must include (each kernel kind where it can run).
TEST(SoftmaxPlan, CandidatesCoverTheKernels) {
  auto kinds = [](const SoftmaxProblem& pr, const kf::DeviceInfo& dev) {
    std::vector<int> count(5, 0);
    for (const SoftmaxPlan& p : kf::candidate_plans(pr, dev)) ++count[int(p.kind)];
    return count;
  };
  // 4096x131072 bf16 forward on the H100: register clusters, streaming at 1..8 CTAs, bulk at 4 and 8 CTAs
  std::vector<int> k = kinds(prob(kFwd, 2, 4096, 131072), h100());
  EXPECT_GT(k[int(SoftmaxKernel::kRegs)], 0);
  EXPECT_EQ(k[int(SoftmaxKernel::kStream)], 8);  // 1, 2, 4, 8 CTAs at 16-byte vectors and at one element
  EXPECT_GT(k[int(SoftmaxKernel::kBulkFwd)], 1);
  // the backward's bulk kernel is a candidate (no default plan selects it), short rows too
  k = kinds(prob(kBwd, 2, 140, 4096), h100());
  EXPECT_GT(k[int(SoftmaxKernel::kBulkBwd)], 0);
  EXPECT_EQ(k[int(SoftmaxKernel::kFwdRow)], 0);
  // forward rows of 4096: every compiled row configuration covering 512 vectors, the register modes
  k = kinds(prob(kFwd, 2, 16384, 4096), h100());
  EXPECT_EQ(k[int(SoftmaxKernel::kFwdRow)], 4);  // 512 x 1, 256 x 2, 512 x 2, 512 x 4
  EXPECT_GT(k[int(SoftmaxKernel::kRegs)], 3);
  // no clusters and no bulk kernels below sm_90
  for (const SoftmaxPlan& p : kf::candidate_plans(prob(kFwd, 2, 4096, 131072), a100())) {
    EXPECT_EQ(p.cluster, 1) << kf::to_string(p);
    EXPECT_NE(p.kind, SoftmaxKernel::kBulkFwd);
  }
}

TEST(SoftmaxPlan, FallbackPlans) {
  // a bulk plan that cannot be resident: the plan without the bulk kernels
  EXPECT_EQ(kf::to_string(kf::fallback_plan(bulk_fwd(8, 8, 512, 1, 2), prob(kFwd, 2, 16384, 32768), h100())),
            kf::to_string(regs(8, 8, 512, 1, M::kOnline)));
  EXPECT_EQ(kf::to_string(kf::fallback_plan(bulk_fwd(8, 8, 512, 4, 2), prob(kFwd, 2, 4096, 131072), h100())),
            kf::to_string(stream(8, 2)));
  // a register cluster: the streaming kernel; a streaming cluster: one CTA per row
  EXPECT_EQ(kf::to_string(kf::fallback_plan(regs(8, 4, 512, 1, M::kOnline, 8), prob(kBwd, 2, 4096, 131072), h100())),
            kf::to_string(stream(8, 2)));
  EXPECT_EQ(kf::to_string(kf::fallback_plan(stream(8, 2), prob(kBwd, 2, 4096, 131072), h100())),
            kf::to_string(stream(8, 1)));
}

TEST(SoftmaxPlan, ImpossiblePlansRejected) {
  struct Bad {
    const char* what;
    SoftmaxPlan plan;
    SoftmaxProblem problem;
    kf::DeviceInfo dev;
    const char* needle;
  };
  SoftmaxPlan unknown = fwd_row(8, 2, 256);
  unknown.kind = static_cast<SoftmaxKernel>(99);
  SoftmaxPlan bulk_bwd_as_fwd = bulk_fwd(8, 8, 512, 4, 2);
  SoftmaxPlan head_regs_fwd = regs(8, 2, 256, 1, M::kOnline, 1, true);
  const std::vector<Bad> bad = {
      {"unknown kernel", unknown, prob(kFwd, 2, 16384, 4096), h100(), "unknown kernel"},
      {"row kernel for the backward", fwd_row(8, 2, 256), prob(kBwd, 2, 16384, 4096), h100(), "forward only"},
      {"row kernel not compiled", fwd_row(8, 4, 256), prob(kFwd, 2, 16384, 4096), h100(), "not compiled"},
      {"row kernel too small", fwd_row(8, 1, 128), prob(kFwd, 2, 16384, 4096), h100(), "covers fewer"},
      {"row kernel partial vectors", fwd_row(8, 2, 256), prob(kFwd, 2, 1, 4095), h100(), "multiple of vec"},
      {"bulk on the A100", bulk_fwd(8, 8, 512, 4, 2), prob(kFwd, 2, 4096, 131072), a100(), "sm_90"},
      {"bulk over the shared memory cap", bulk_fwd(4, 8, 512, 4, 4), prob(kFwd, 4, 256, 262144), h100(), "200 KB"},
      {"bulk forward for the backward", bulk_bwd_as_fwd, prob(kBwd, 2, 4096, 131072), h100(), "bulk_bwd"},
      {"bulk slices not 16 bytes", bulk_fwd(8, 8, 512, 3, 2), prob(kFwd, 2, 4096, 131072), h100(), "slices"},
      {"bulk stages", bulk_fwd(8, 8, 512, 4, 5), prob(kFwd, 2, 4096, 131072), h100(), "stages"},
      {"bulk on unaligned rows", bulk_fwd(8, 8, 512, 4, 2), prob(kFwd, 2, 4096, 131072, kShared), h100(), "16-byte"},
      {"cluster on the A100", regs(8, 4, 512, 1, M::kOnline, 8), prob(kBwd, 2, 4096, 131072), a100(), "sm_90"},
      {"cluster of 9", stream(8, 9), prob(kFwd, 2, 4096, 131072), h100(), "cluster must be 1..8"},
      {"team not a power of two", regs(8, 2, 384, 1, M::kOnline), prob(kBwd, 2, 16384, 4096), h100(), "power of two"},
      {"three vectors per thread", regs(8, 3, 256, 1, M::kOnline), prob(kBwd, 2, 16384, 4096), h100(), "iters"},
      {"team too small", regs(8, 2, 128, 1, M::kOnline), prob(kBwd, 2, 16384, 4096), h100(), "covers fewer"},
      {"repeat mode for log_softmax", regs(8, 2, 256, 1, M::kMaxThenSumRepeat), prob(kLogFwd, 2, 16384, 4096), h100(),
       "log_softmax"},
      {"two-reduction mode backward", regs(8, 2, 256, 1, M::kMaxThenSum), prob(kBwd, 2, 16384, 4096), h100(),
       "backward"},
      {"two-reduction mode over 16 values", regs(8, 4, 128, 1, M::kMaxThenSum), prob(kFwd, 2, 16384, 4096), h100(),
       "16 values"},
      {"vec 3", regs(3, 2, 256, 1, M::kOnline), prob(kBwd, 2, 16384, 4096), h100(), "vec must be"},
      {"16-byte vectors on unaligned rows", regs(8, 2, 256, 1, M::kOnline), prob(kBwd, 2, 16384, 4095, kNone), h100(),
       "16-byte"},
      {"scalar head without shared misalignment", stream(8, 1, true), prob(kFwd, 2, 16384, 40950, kNone), h100(),
       "scalar_head"},
      {"forward register kernel with a head", head_regs_fwd, prob(kFwd, 2, 16384, 4095, kShared), h100(),
       "backward only"},
      {"streaming at 512 threads",
       [] {
         SoftmaxPlan p = stream(8, 1);
         p.threads = 512;
         return p;
       }(),
       prob(kFwd, 2, 4096, 131072), h100(), "1024 threads"},
      {"blocks over 512 threads", regs(8, 1, 512, 2, M::kOnline), prob(kBwd, 2, 16384, 4096), h100(), "up to 512"},
  };
  for (const Bad& b : bad) {
    const kf::Status st = kf::check_plan(b.plan, b.problem, b.dev);
    EXPECT_FALSE(st.ok()) << b.what;
    EXPECT_NE(st.message().find(b.needle), std::string::npos) << b.what << ": " << st.message();
    EXPECT_NE(st.message().find("softmax plan"), std::string::npos) << b.what << ": " << st.message();
  }
}

// The alignment facts of a call, from its params.
TEST(SoftmaxPlan, ProblemFromParams) {
  alignas(256) static char buf[1 << 16];
  kf::SoftmaxParams p;
  p.in = buf;
  p.out = buf + 32768;
  p.rows = 4, p.n = 2048, p.in_stride = 2048, p.out_stride = 2048;
  SoftmaxProblem pr = kf::make_softmax_problem(p, false, false, 2);
  EXPECT_TRUE(pr.vec_ok && pr.head_ok);
  EXPECT_EQ(pr.rows, 4);
  EXPECT_EQ(pr.n, 2048);
  // odd rows, contiguous: every row starts at its own offset, shared by x and y
  p.n = 2047, p.in_stride = 2047, p.out_stride = 2047;
  pr = kf::make_softmax_problem(p, false, false, 2);
  EXPECT_FALSE(pr.vec_ok);
  EXPECT_TRUE(pr.head_ok);
  // one row: the stride does not matter
  p.rows = 1;
  EXPECT_TRUE(kf::make_softmax_problem(p, false, false, 2).vec_ok);
  // x one element off: nothing shared
  p.rows = 4;
  p.in = buf + 2;
  pr = kf::make_softmax_problem(p, false, false, 2);
  EXPECT_FALSE(pr.vec_ok);
  EXPECT_FALSE(pr.head_ok);
  // the backward's y must share the misalignment too
  p.in = buf;
  p.y = buf + 16386;
  p.y_stride = 2047;
  pr = kf::make_softmax_problem(p, false, true, 2);
  EXPECT_FALSE(pr.head_ok);
  p.y = buf + 16384;
  EXPECT_TRUE(kf::make_softmax_problem(p, false, true, 2).head_ok);
}

}  // namespace
