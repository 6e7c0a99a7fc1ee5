// The cross-entropy planner (src/cross_entropy/cross_entropy_plan.h) on the device facts of an H100,
// an A100 and a T4, without a GPU: problem -> the expected read path (16-byte vectors, scalar head +
// vectors, one element), segments or tiles and grid; every candidate plan passes check_plan;
// impossible plans are rejected.
#include <string>
#include <vector>

#include "cross_entropy/cross_entropy_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::CeKernel;
using kf::CePlan;
using kf::CeProblem;
using kf::DeviceInfo;

const DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

CeProblem problem(bool backward, int elem_bytes, int64_t rows, int64_t vocab, bool aligned, bool head_ok) {
  CeProblem p;
  p.backward = backward;
  p.elem_bytes = elem_bytes;
  p.rows = rows;
  p.vocab = vocab;
  p.aligned = aligned;
  p.head_ok = head_ok;
  return p;
}

struct Expect {
  const char* what;
  CeProblem problem;
  const DeviceInfo* dev;
  const char* plan;  // to_string of the expected plan
};

// Expected plans, derived from the launch rules: the forward splits rows into segments of 16384
// bf16/fp16 (8192 fp32) logits, one CTA each, and finalizes 256 rows per block; the backward into
// tiles of 256 threads x 4 vectors (8192 bf16 logits on the 16-byte path, 1024 on the one-element
// path). Aligned rows read 16-byte vectors, misaligned rows that a scalar head fixes read the head
// then vectors, anything else one element per access.
const Expect kExpect[] = {
    {"fwd 16384x32000", problem(false, 2, 16384, 32000, true, true), &kH100,
     "ce_fwd vec=8 head=0 segments=2 grid=32768 finalize=64"},
    {"fwd 16384x128256", problem(false, 2, 16384, 128256, true, true), &kH100,
     "ce_fwd vec=8 head=0 segments=8 grid=131072 finalize=64"},
    {"fwd 16384x128256 A100", problem(false, 2, 16384, 128256, true, true), &kA100,
     "ce_fwd vec=8 head=0 segments=8 grid=131072 finalize=64"},
    {"fwd 16384x50257 (odd vocabulary: scalar head)", problem(false, 2, 16384, 50257, false, true), &kH100,
     "ce_fwd vec=8 head=1 segments=4 grid=65536 finalize=64"},
    {"fwd 16384x32000 fp32", problem(false, 4, 16384, 32000, true, true), &kH100,
     "ce_fwd vec=4 head=0 segments=4 grid=65536 finalize=64"},
    {"fwd 16384x32000 fp16 T4", problem(false, 2, 16384, 32000, true, true), &kT4,
     "ce_fwd vec=8 head=0 segments=2 grid=32768 finalize=64"},
    {"fwd 16384x256000 (Gemma 2, softcap: same plan)", problem(false, 2, 16384, 256000, true, true), &kH100,
     "ce_fwd vec=8 head=0 segments=16 grid=262144 finalize=64"},
    {"fwd 1x128256 (decode)", problem(false, 2, 1, 128256, true, true), &kH100,
     "ce_fwd vec=8 head=0 segments=8 grid=8 finalize=1"},
    {"fwd 0 rows (the reduction still runs)", problem(false, 2, 0, 32000, true, true), &kH100,
     "ce_fwd vec=8 head=0 segments=2 grid=0 finalize=0"},
    {"fwd element-misaligned logits", problem(false, 2, 3, 1000, false, false), &kH100,
     "ce_fwd vec=1 head=0 segments=1 grid=3 finalize=1"},
    {"bwd 16384x32000", problem(true, 2, 16384, 32000, true, true), &kH100, "ce_bwd vec=8 head=0 tiles=4 grid=65536"},
    {"bwd 16384x128256", problem(true, 2, 16384, 128256, true, true), &kH100,
     "ce_bwd vec=8 head=0 tiles=16 grid=262144"},
    {"bwd 16384x50257 in place", problem(true, 2, 16384, 50257, false, true), &kH100,
     "ce_bwd vec=8 head=1 tiles=7 grid=114688"},
    {"bwd 16384x50257 dlogits misaligned otherwise", problem(true, 2, 16384, 50257, false, false), &kH100,
     "ce_bwd vec=1 head=0 tiles=50 grid=819200"},
    {"bwd 16384x32000 fp32", problem(true, 4, 16384, 32000, true, true), &kA100,
     "ce_bwd vec=4 head=0 tiles=8 grid=131072"},
};

TEST(CePlan, ExpectedPlans) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    EXPECT_EQ(kf::to_string(kf::plan_cross_entropy(e.problem, *e.dev)), e.plan);
  }
}

TEST(CePlan, CandidatesPassCheckPlan) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const std::vector<CePlan> plans = kf::candidate_plans(e.problem, *e.dev);
    ASSERT_FALSE(plans.empty());
    EXPECT_EQ(kf::to_string(plans.front()), e.plan);  // the default comes first
    for (const CePlan& p : plans) {
      SCOPED_TRACE(kf::to_string(p));
      const kf::Status s = kf::check_plan(p, e.problem, *e.dev);
      EXPECT_TRUE(s.ok()) << s.message();
    }
    // every path the layout allows: aligned rows 3, head-fixable rows 2, others 1
    const size_t want = e.problem.aligned ? 3 : e.problem.head_ok ? 2 : 1;
    EXPECT_EQ(plans.size(), want);
  }
  // aligned rows also run the scalar-head kernel (its head is empty) and the one-element kernel
  const std::vector<CePlan> plans = kf::candidate_plans(problem(true, 2, 8, 32000, true, true), kH100);
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(kf::to_string(plans[1]), "ce_bwd vec=8 head=1 tiles=4 grid=32");
  EXPECT_EQ(kf::to_string(plans[2]), "ce_bwd vec=1 head=0 tiles=32 grid=256");
  EXPECT_TRUE(kf::candidate_plans(problem(true, 2, 0, 32000, true, true), kH100).empty());
}

TEST(CePlan, BogusPlansRejected) {
  const CeProblem pr = problem(false, 2, 64, 50257, false, true);  // an odd vocabulary
  const CePlan good = kf::plan_cross_entropy(pr, kH100);
  ASSERT_TRUE(kf::check_plan(good, pr, kH100).ok());
  auto rejected = [&](const CePlan& p, const char* needle, const CeProblem& on) {
    const kf::Status s = kf::check_plan(p, on, kH100);
    EXPECT_FALSE(s.ok()) << kf::to_string(p);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  CePlan p = good;
  p.kind = static_cast<CeKernel>(9);
  rejected(p, "unknown kernel", pr);
  p = good;
  p.kind = CeKernel::kBackward;
  rejected(p, "forward call", pr);
  p = good;
  p.vec = 4;
  rejected(p, "vec must be", pr);
  p = good;
  p.vec = 1;  // one element with a scalar head: not built
  rejected(p, "16-byte path only", pr);
  p = good;
  p.scalar_head = false;  // 16-byte vectors from the row start of misaligned rows
  rejected(p, "16-byte aligned rows", pr);
  rejected(good, "scalar head can fix", problem(false, 2, 64, 50257, false, false));
  p = good;
  p.segments = 3;
  rejected(p, "segments must be 4", pr);
  p = good;
  p.grid = 100;
  rejected(p, "rows x segments", pr);
  p = good;
  p.finalize_blocks = 2;
  rejected(p, "finalize blocks", pr);
  CePlan b = kf::plan_cross_entropy(problem(true, 2, 64, 50257, false, true), kH100);
  rejected(b, "empty", problem(true, 2, 0, 50257, false, true));
  b.segments = 1;
  rejected(b, "tiles must be 7", problem(true, 2, 64, 50257, false, true));
}

// make_ce_problem: aligned rows, and whether a scalar head fixes misaligned ones.
TEST(CePlan, ProblemFromParams) {
  kf::CeParams p;
  p.rows = 16;
  p.vocab = 32000;
  p.logits = reinterpret_cast<const void*>(uintptr_t{0x100000});
  p.ld = 32000;
  CeProblem pr = kf::make_ce_problem(p, false, 2);
  EXPECT_TRUE(pr.aligned);
  EXPECT_TRUE(pr.head_ok);
  EXPECT_EQ(pr.rows, 16);
  EXPECT_EQ(pr.vocab, 32000);
  p.vocab = p.ld = 32001;  // odd vocabulary, contiguous: rows start 2 bytes further each
  pr = kf::make_ce_problem(p, false, 2);
  EXPECT_FALSE(pr.aligned);
  EXPECT_TRUE(pr.head_ok);
  // backward in place: dlogits shares every row's misalignment
  p.dlogits = const_cast<void*>(p.logits);
  p.dld = p.ld;
  pr = kf::make_ce_problem(p, true, 2);
  EXPECT_FALSE(pr.aligned);
  EXPECT_TRUE(pr.head_ok);
  // dlogits 2 bytes off the logits' misalignment: no common head
  p.dlogits = reinterpret_cast<void*>(uintptr_t{0x200002});
  pr = kf::make_ce_problem(p, true, 2);
  EXPECT_FALSE(pr.head_ok);
  // dlogits with an aligned row stride against odd logits rows: no common head either
  p.dlogits = reinterpret_cast<void*>(uintptr_t{0x200000});
  p.dld = 32008;
  EXPECT_FALSE(kf::make_ce_problem(p, true, 2).head_ok);
  // both aligned
  p.ld = 32008;
  EXPECT_TRUE(kf::make_ce_problem(p, true, 2).aligned);
  p.dlogits = reinterpret_cast<void*>(uintptr_t{0x200010});
  EXPECT_TRUE(kf::make_ce_problem(p, true, 2).aligned);
  p.dlogits = reinterpret_cast<void*>(uintptr_t{0x200008});
  EXPECT_FALSE(kf::make_ce_problem(p, true, 2).aligned);
  EXPECT_FALSE(kf::make_ce_problem(p, true, 2).head_ok);
  EXPECT_TRUE(kf::make_ce_problem(p, false, 2).aligned);  // the forward ignores dlogits
}

}  // namespace
