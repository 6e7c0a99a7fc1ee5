// The RoPE planner (src/rope/rope_plan.h) on the device facts of an H100, an A100 and a T4, without a
// GPU: problem -> the expected kernel (flat for decode steps, token otherwise), vector width, units,
// block and grid; every candidate plan passes check_plan; impossible plans are rejected.
#include <string>
#include <vector>

#include "rope/rope_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::DeviceInfo;
using kf::RopeKernel;
using kf::RopePlan;
using kf::RopeProblem;

const DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

RopeProblem problem(int elem_bytes, int64_t tokens, int heads, int D, int R, bool interleaved, bool vec_ok,
                    bool inplace = false) {
  RopeProblem p;
  p.elem_bytes = elem_bytes;
  p.tokens = tokens;
  p.heads = heads;
  p.head_dim = D;
  p.rot_dim = R;
  p.interleaved = interleaved;
  p.all_inplace = inplace;
  p.vec_ok = vec_ok;
  return p;
}

struct Expect {
  const char* what;
  RopeProblem problem;
  const DeviceInfo* dev;
  const char* plan;  // to_string of the expected plan
};

// Expected plans, derived from the launch rules: 16-byte vectors when every pointer, stride and the
// pairing allow; up to 1024 tokens the flat kernel (block = units x heads per group, at most 256
// threads, grid = tokens x groups); above, the token kernel with at least 8 heads per thread (ty head
// slots, tz = 256 / (tx * ty) tokens per block).
const Expect kExpect[] = {
    // Llama-style q 32 heads, k 8 heads, D = R = 128, bf16, rotate-half: 8 units of 2 x 16 B
    {"decode b1 s1", problem(2, 1, 40, 128, 128, false, true), &kH100,
     "rope_flat vec=8 units=8+0 block=8x20x1 grid=1x2"},
    {"decode b1 s1 T4", problem(2, 1, 40, 128, 128, false, true), &kT4,
     "rope_flat vec=8 units=8+0 block=8x20x1 grid=1x2"},
    {"decode b64 s1", problem(2, 64, 40, 128, 128, false, true), &kH100,
     "rope_flat vec=8 units=8+0 block=8x20x1 grid=64x2"},
    {"b1 s1024 (the last flat size)", problem(2, 1024, 40, 128, 128, false, true), &kA100,
     "rope_flat vec=8 units=8+0 block=8x20x1 grid=1024x2"},
    {"b1 s1025", problem(2, 1025, 40, 128, 128, false, true), &kH100,
     "rope_token vec=8 units=8+0 block=8x5x6 grid=171x1"},
    {"prefill b4 s4096", problem(2, 16384, 40, 128, 128, false, true), &kH100,
     "rope_token vec=8 units=8+0 block=8x5x6 grid=2731x1"},
    {"prefill b4 s4096 A100", problem(2, 16384, 40, 128, 128, false, true), &kA100,
     "rope_token vec=8 units=8+0 block=8x5x6 grid=2731x1"},
    {"prefill interleaved", problem(2, 16384, 40, 128, 128, true, true), &kH100,
     "rope_token vec=8 units=16+0 block=16x5x3 grid=5462x1"},
    {"prefill fp32", problem(4, 16384, 40, 128, 128, false, true), &kH100,
     "rope_token vec=4 units=16+0 block=16x5x3 grid=5462x1"},
    // unaligned strides or pointers: one element per access (interleaved: pairs of single elements)
    {"prefill unaligned", problem(2, 16384, 40, 128, 128, false, false), &kH100,
     "rope_token vec=1 units=64+0 block=64x4x1 grid=16384x1"},
    {"prefill unaligned interleaved", problem(2, 16384, 40, 128, 128, true, false), &kH100,
     "rope_token vec=1 units=64+0 block=64x4x1 grid=16384x1"},
    {"decode unaligned", problem(2, 1, 40, 128, 128, false, false), &kH100,
     "rope_flat vec=1 units=64+0 block=64x4x1 grid=1x10"},
    // partial rotary (R = 64 of D = 128): 8 passthrough vectors unless rotated in place
    {"partial rotary", problem(2, 16384, 40, 128, 64, false, true), &kH100,
     "rope_token vec=8 units=4+8 block=12x5x4 grid=4096x1"},
    {"partial rotary in place", problem(2, 16384, 40, 128, 64, false, true, true), &kH100,
     "rope_token vec=8 units=4+0 block=4x5x12 grid=1366x1"},
    // LTX-Video: q and k [B, S, C] as one head of C = 2048 channels each, interleaved pairs
    {"LTX b1 s4096 C2048", problem(2, 4096, 2, 2048, 2048, true, true), &kH100,
     "rope_token vec=8 units=256+0 block=256x1x1 grid=4096x1"},
    {"LTX b1 s1024 C2048", problem(2, 1024, 2, 2048, 2048, true, true), &kH100,
     "rope_flat vec=8 units=256+0 block=256x1x1 grid=1024x2"},
};

TEST(RopePlan, ExpectedPlans) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    EXPECT_EQ(kf::to_string(kf::plan_rope(e.problem, *e.dev)), e.plan);
  }
}

TEST(RopePlan, CandidatesPassCheckPlan) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const std::vector<RopePlan> plans = kf::candidate_plans(e.problem, *e.dev);
    ASSERT_FALSE(plans.empty());
    EXPECT_EQ(kf::to_string(plans.front()), e.plan);  // the default comes first
    bool flat = false, token = false;
    for (const RopePlan& p : plans) {
      SCOPED_TRACE(kf::to_string(p));
      const kf::Status s = kf::check_plan(p, e.problem, *e.dev);
      EXPECT_TRUE(s.ok()) << s.message();
      flat = flat || p.kind == RopeKernel::kFlat;
      token = token || p.kind == RopeKernel::kToken;
      for (const RopePlan& q : plans)
        if (&q != &p) {
          EXPECT_NE(kf::to_string(p), kf::to_string(q));
        }
    }
    EXPECT_TRUE(flat && token) << "both kernels can run every shape here";
  }
}

// Decode: the flat kernel and the token kernel at one head per thread and at 8, each at 16 B and one
// element (with one-element units a thread takes 10 heads either way: one token plan).
TEST(RopePlan, DecodeCandidates) {
  const std::vector<RopePlan> plans = kf::candidate_plans(problem(2, 1, 40, 128, 128, false, true), kH100);
  std::vector<std::string> names;
  for (const RopePlan& p : plans) names.push_back(kf::to_string(p));
  const std::vector<std::string> want = {
      "rope_flat vec=8 units=8+0 block=8x20x1 grid=1x2",   "rope_token vec=8 units=8+0 block=8x20x1 grid=1x1",
      "rope_token vec=8 units=8+0 block=8x5x6 grid=1x1",   "rope_flat vec=1 units=64+0 block=64x4x1 grid=1x10",
      "rope_token vec=1 units=64+0 block=64x4x1 grid=1x1",  // 10 heads per thread either way: one plan
  };
  EXPECT_EQ(names, want);
  EXPECT_TRUE(kf::candidate_plans(problem(2, 0, 40, 128, 128, false, true), kH100).empty());
  EXPECT_TRUE(kf::candidate_plans(problem(2, 4, 0, 128, 128, false, true), kH100).empty());
}

TEST(RopePlan, BogusPlansRejected) {
  const RopeProblem pr = problem(2, 64, 40, 128, 128, false, false);  // one element per access only
  const RopePlan flat = kf::plan_rope(pr, kH100);
  ASSERT_EQ(flat.kind, RopeKernel::kFlat);
  ASSERT_TRUE(kf::check_plan(flat, pr, kH100).ok());
  RopePlan token = flat;
  for (const RopePlan& p : kf::candidate_plans(pr, kH100))
    if (p.kind == RopeKernel::kToken) token = p;
  ASSERT_EQ(token.kind, RopeKernel::kToken);
  auto rejected = [&](const RopePlan& p, const char* needle, const RopeProblem& on) {
    const kf::Status s = kf::check_plan(p, on, kH100);
    EXPECT_FALSE(s.ok()) << kf::to_string(p);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  RopePlan p = flat;
  p.kind = static_cast<RopeKernel>(5);
  rejected(p, "unknown kernel", pr);
  p = flat;
  p.vec = 8;
  rejected(p, "16-byte vectors do not fit", pr);
  p = flat;
  p.vec = 3;
  rejected(p, "vec must be", pr);
  p = flat;
  p.units = 70;
  rejected(p, "64 rotation and 0 passthrough units", pr);
  p = token;
  p.block_x = 64, p.block_y = 4, p.block_z = 2;  // 512 threads
  rejected(p, "1..256 threads", pr);
  p = token;
  p.block_x = 1, p.block_y = 1, p.block_z = 65;
  rejected(p, "block_z", pr);
  p = token;
  p.grid_y = 2;
  rejected(p, "one-dimensional", pr);
  p = flat;
  p.block_x = 16, p.block_z = 2;
  rejected(p, "one token per block", pr);
  p = flat;
  p.grid_x = 32;
  rejected(p, "token count", pr);
  p = flat;
  p.grid_y = 9;  // 9 groups of 4 heads: 36 < 40
  rejected(p, "do not cover", pr);
  p = flat;
  p.grid_x = 0;
  rejected(p, "grid is empty", pr);
  rejected(flat, "empty", problem(2, 0, 40, 128, 128, false, false));
}

// make_rope_problem: token and head counts, in place, and when 16-byte vectors fit.
TEST(RopePlan, ProblemFromParams) {
  kf::RopeParams p;
  p.batch = 4, p.seq = 4096, p.head_dim = 128, p.rot_dim = 128;
  p.t[0].heads = 32, p.t[1].heads = 8;
  p.t[0].in = reinterpret_cast<const void*>(uintptr_t{0x100000});
  p.t[0].out = reinterpret_cast<void*>(uintptr_t{0x200000});
  p.t[1].in = reinterpret_cast<const void*>(uintptr_t{0x300000});
  p.t[1].out = reinterpret_cast<void*>(uintptr_t{0x400000});
  for (kf::RopeHeads& h : p.t) {
    h.in_sb = h.out_sb = int64_t(4096) * h.heads * 128;
    h.in_ss = h.out_ss = int64_t(h.heads) * 128;
    h.in_sh = h.out_sh = 128;
  }
  p.cos = reinterpret_cast<const void*>(uintptr_t{0x500000});
  p.sin = reinterpret_cast<const void*>(uintptr_t{0x600000});
  p.cos_ss = p.sin_ss = 128;
  RopeProblem pr = kf::make_rope_problem(p, 2);
  EXPECT_EQ(pr.tokens, 16384);
  EXPECT_EQ(pr.heads, 40);
  EXPECT_TRUE(pr.vec_ok);
  EXPECT_FALSE(pr.all_inplace);
  p.t[1].in_sh = 129;  // a head stride that is not a multiple of 8 elements
  EXPECT_FALSE(kf::make_rope_problem(p, 2).vec_ok);
  p.t[1].in_sh = 128;
  p.sin = reinterpret_cast<const void*>(uintptr_t{0x600004});  // sin 4 bytes off
  EXPECT_FALSE(kf::make_rope_problem(p, 2).vec_ok);
  p.sin = reinterpret_cast<const void*>(uintptr_t{0x600000});
  p.rot_dim = 8;  // rotate-half: R/2 = 4 is not a multiple of 8 bf16
  EXPECT_FALSE(kf::make_rope_problem(p, 2).vec_ok);
  EXPECT_TRUE(kf::make_rope_problem(p, 4).vec_ok);  // fp32: 4 elements per vector
  p.interleaved = true;                             // interleaved: R = 8 is a multiple of 8
  EXPECT_TRUE(kf::make_rope_problem(p, 2).vec_ok);
  p.t[0].inplace = true;
  EXPECT_FALSE(kf::make_rope_problem(p, 2).all_inplace);
  p.t[1].inplace = true;
  EXPECT_TRUE(kf::make_rope_problem(p, 2).all_inplace);
  p.t[1].heads = 0;  // q alone
  p.t[1].inplace = false;
  EXPECT_TRUE(kf::make_rope_problem(p, 2).all_inplace);
  EXPECT_EQ(kf::make_rope_problem(p, 2).heads, 32);
}

}  // namespace
