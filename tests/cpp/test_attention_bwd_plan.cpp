// The backward planner (src/attention/attention_plan_bwd.cpp) and its workspace layout
// (attention_bwd_workspace.h) on the device facts of an H100, an A100, an sm_89 device (99 KB of
// shared memory per block) and a T4, without a GPU: problem -> the expected kernel and tile; every
// candidate passes check_bwd_plan; impossible plans are rejected with the reason; the workspace
// regions; the wgmma kernel's paired schedule (order=paired: which calls the planner pairs with
// KF_ATTN_BWD_PAIRED=1, none by default, never deterministic ones).
#include <cstdlib>
#include <string>
#include <vector>

#include "attention/attention_bwd_mma_config.h"
#include "attention/attention_bwd_workspace.h"
#include "attention/attention_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::AttentionKernel;
using kf::AttentionOrder;
using kf::AttentionPlan;
using kf::AttentionProblem;
using kf::DeviceInfo;

const DeviceInfo kH100 = {132, 90, 2048, 50 * 1024 * 1024};
const DeviceInfo kA100 = {108, 80, 2048, 40 * 1024 * 1024};
const DeviceInfo kAda = {128, 89, 1536, 72 * 1024 * 1024};
const DeviceInfo kT4 = {40, 75, 1024, 4 * 1024 * 1024};

AttentionProblem problem(int64_t batch, int heads_q, int heads_kv, int64_t sq, int64_t sk, int dqk, int dv,
                         bool tma_ok = true) {
  AttentionProblem p;
  p.elem_bytes = 2;
  p.bf16 = true;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.total_q = batch * sq;
  p.total_k = batch * sk;
  p.head_dim_qk = dqk;
  p.head_dim_v = dv;
  p.lse = true;
  p.tma_ok = tma_ok;
  return p;
}
AttentionProblem with_softcap(AttentionProblem p) {
  p.softcap = true;
  return p;
}
AttentionProblem with_causal(AttentionProblem p) {
  p.causal = true;
  return p;
}

// Sets (value non-null) or unsets an environment variable for its lifetime, then restores it.
struct EnvVar {
  std::string name, old;
  bool had = false;
  EnvVar(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value != nullptr)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~EnvVar() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
};

struct Expect {
  const char* what;
  AttentionProblem problem;
  const DeviceInfo* dev;
  const char* plan;  // to_string of the expected plan
};

// sm_90 with head dims 64/64 or 128/128 and TMA-compatible tensors: the wgmma kernel, 128 query rows
// per step at d64 without a softcap, 64 otherwise. Otherwise the first
// kAttnBwdTiles row of the head dims that fits the device's shared memory (H100 227 KB, A100 163 KB,
// sm_89 99 KB); the smallest block_n when the call has fewer key-tile blocks than SMs.
std::vector<Expect> expectations() {
  return {
      {"h100 d64", problem(2, 16, 16, 2048, 2048, 64, 64), &kH100,
       "attn_bwd_wgmma d=64/64 tile=128x128 warps=12 stages=2 order=row"},
      {"h100 d64 softcap", with_softcap(problem(2, 16, 16, 2048, 2048, 64, 64)), &kH100,
       "attn_bwd_wgmma d=64/64 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d64 gqa softcap", with_softcap(problem(2, 32, 8, 2048, 2048, 64, 64)), &kH100,
       "attn_bwd_wgmma d=64/64 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d128 softcap", with_softcap(problem(2, 16, 16, 2048, 2048, 128, 128)), &kH100,
       "attn_bwd_wgmma d=128/128 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d64 unaligned", problem(2, 16, 16, 2048, 2048, 64, 64, false), &kH100,
       "attn_bwd_mma d=64/64 tile=64x128 warps=8 stages=2 order=row"},
      {"h100 d96", problem(2, 16, 16, 2048, 2048, 96, 96), &kH100,
       "attn_bwd_mma d=96/96 tile=64x64 warps=4 stages=2 order=row"},
      {"h100 d128", problem(2, 16, 16, 2048, 2048, 128, 128), &kH100,
       "attn_bwd_wgmma d=128/128 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d128 gqa", problem(2, 32, 8, 2048, 2048, 128, 128), &kH100,
       "attn_bwd_wgmma d=128/128 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d128 unaligned", problem(2, 16, 16, 2048, 2048, 128, 128, false), &kH100,
       "attn_bwd_mma d=128/128 tile=64x128 warps=8 stages=2 order=row"},
      {"h100 d192/128", problem(2, 16, 16, 2048, 2048, 192, 128), &kH100,
       "attn_bwd_wgmma d=192/128 tile=64x64 warps=12 stages=2 order=row"},
      {"h100 d192/128 unaligned", problem(2, 16, 16, 2048, 2048, 192, 128, false), &kH100,
       "attn_bwd_mma d=192/128 tile=32x64 warps=8 stages=2 order=row"},
      {"h100 d256", problem(2, 16, 16, 2048, 2048, 256, 256), &kH100,
       "attn_bwd_wgmma d=256/256 tile=64x64 warps=12 stages=2 order=row"},
      {"h100 d256 softcap", with_softcap(problem(2, 16, 16, 2048, 2048, 256, 256)), &kH100,
       "attn_bwd_wgmma d=256/256 tile=64x64 warps=12 stages=2 order=row"},
      {"h100 d256 unaligned", problem(2, 16, 16, 2048, 2048, 256, 256, false), &kH100,
       "attn_bwd_mma d=256/256 tile=32x64 warps=8 stages=2 order=row"},
      {"h100 d64 few blocks", problem(1, 4, 1, 512, 512, 64, 64, false), &kH100,
       "attn_bwd_mma d=64/64 tile=64x64 warps=4 stages=2 order=row"},
      {"h100 d128 few blocks", problem(1, 4, 1, 512, 512, 128, 128), &kH100,
       "attn_bwd_wgmma d=128/128 tile=64x128 warps=12 stages=2 order=row"},
      {"h100 d128 few blocks unaligned", problem(1, 4, 1, 512, 512, 128, 128, false), &kH100,
       "attn_bwd_mma d=128/128 tile=64x64 warps=4 stages=2 order=row"},
      {"a100 d128", problem(2, 16, 16, 2048, 2048, 128, 128), &kA100,
       "attn_bwd_mma d=128/128 tile=64x64 warps=4 stages=2 order=row"},
      {"a100 d256", problem(2, 16, 16, 2048, 2048, 256, 256), &kA100,
       "attn_bwd_mma d=256/256 tile=32x64 warps=8 stages=2 order=row"},
      {"ada d64", problem(2, 16, 16, 2048, 2048, 64, 64), &kAda,
       "attn_bwd_mma d=64/64 tile=64x64 warps=4 stages=2 order=row"},
      {"ada d96", problem(2, 16, 16, 2048, 2048, 96, 96), &kAda,
       "attn_bwd_mma d=96/96 tile=64x64 warps=4 stages=2 order=row"},
      {"ada d128", problem(2, 16, 16, 2048, 2048, 128, 128), &kAda,
       "attn_bwd_mma d=128/128 tile=32x64 warps=8 stages=2 order=row"},
      {"ada d192/128", problem(2, 16, 16, 2048, 2048, 192, 128), &kAda,
       "attn_bwd_mma d=192/128 tile=32x64 warps=8 stages=2 order=row"},
      {"ada d256", problem(2, 16, 16, 2048, 2048, 256, 256), &kAda,
       "attn_bwd_mma d=256/256 tile=32x32 warps=4 stages=1 order=row"},
  };
}

TEST(AttentionBwdPlan, ExpectedPlans) {
  const EnvVar paired("KF_ATTN_BWD_PAIRED", nullptr);  // the default
  for (const Expect& e : expectations()) {
    SCOPED_TRACE(e.what);
    const AttentionPlan p = kf::plan_attention_bwd(e.problem, *e.dev);
    EXPECT_EQ(kf::to_string(p), e.plan);
    const kf::Status s = kf::check_bwd_plan(p, e.problem, *e.dev);
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

TEST(AttentionBwdPlan, CandidatesPassCheckPlan) {
  const EnvVar paired("KF_ATTN_BWD_PAIRED", nullptr);  // the default
  for (const Expect& e : expectations()) {
    SCOPED_TRACE(e.what);
    const std::vector<AttentionPlan> plans = kf::candidate_bwd_plans(e.problem, *e.dev);
    ASSERT_FALSE(plans.empty());
    EXPECT_EQ(kf::to_string(plans.front()), e.plan);  // the default comes first
    for (size_t i = 0; i < plans.size(); ++i) {
      const AttentionPlan& p = plans[i];
      EXPECT_TRUE(p.kind == AttentionKernel::kBwdMma || p.kind == AttentionKernel::kBwdWgmma) << kf::to_string(p);
      const kf::Status s = kf::check_bwd_plan(p, e.problem, *e.dev);
      EXPECT_TRUE(s.ok()) << s.message();
      for (size_t j = 0; j < i; ++j) EXPECT_NE(kf::to_string(p), kf::to_string(plans[j]));
    }
  }
}

TEST(AttentionBwdPlan, CandidateTilesPerDevice) {
  // Every built tile of the head dims that fits: H100 all (and the wgmma kernels: at d64, d128 with
  // both orders, row and paired; at 256/256 and 192/128 order=row); 99 KB devices only the small ones.
  const int dims[][3] = {{64, 64, 4}, {96, 96, 1}, {128, 128, 5}, {192, 128, 2}, {256, 256, 3}};
  for (const auto& d : dims) {
    SCOPED_TRACE(d[0]);
    const AttentionProblem pr = problem(2, 16, 16, 4096, 4096, d[0], d[1]);
    EXPECT_EQ(kf::candidate_bwd_plans(pr, kH100).size(), size_t(d[2]));
    const std::vector<AttentionPlan> ada = kf::candidate_bwd_plans(pr, kAda);
    ASSERT_FALSE(ada.empty());
    for (const AttentionPlan& p : ada) {
      EXPECT_EQ(p.kind, AttentionKernel::kBwdMma);
      EXPECT_LE(kf::attention_bwd_mma_smem_bytes(p.head_dim_qk, p.head_dim_v, p.block_m, p.block_n, p.stages),
                99 * 1024)
          << kf::to_string(p);
    }
  }
}

TEST(AttentionBwdPlan, SharedMemoryFootprint) {
  // K, V [block_n][D + 8], stages x (Q, dO [block_m][D + 8] and two float rows), P^T, dS^T
  // [block_n][block_m + 8]; 2-byte elements.
  EXPECT_EQ(kf::attention_bwd_mma_smem_bytes(128, 128, 64, 128, 2),
            128 * 272 * 2 + 2 * (64 * 272 * 2 + 2 * 64 * 4) + 2 * 128 * 72 * 2);
  EXPECT_EQ(kf::attention_bwd_mma_smem_bytes(128, 128, 64, 128, 2), 177152);
  EXPECT_EQ(kf::attention_bwd_mma_smem_bytes(256, 256, 32, 32, 1), 72960);
  for (const kf::AttnBwdTile& t : kf::kAttnBwdTiles) {
    EXPECT_LE(kf::attention_bwd_mma_smem_bytes(t.head_dim_qk, t.head_dim_v, t.block_m, t.block_n, t.stages),
              227 * 1024);
    EXPECT_GE(32 * t.warps, 2 * t.block_m);  // one thread per lse2 / D element of a query tile
  }
}

TEST(AttentionBwdPlan, BelowSm80NotSupported) {
  const AttentionProblem pr = problem(2, 16, 16, 1024, 1024, 128, 128);
  const kf::Status s = kf::check_bwd_plan(kf::plan_attention_bwd(pr, kA100), pr, kT4);
  EXPECT_EQ(s.code(), kf::StatusCode::kNotSupported) << s.message();
  EXPECT_NE(s.message().find("compute capability 8.0"), std::string::npos) << s.message();
  EXPECT_TRUE(kf::candidate_bwd_plans(pr, kT4).empty());
}

TEST(AttentionBwdPlan, ImpossiblePlansRejected) {
  // The mma kernel's plan for d128 (unaligned tensors: no wgmma plan).
  const AttentionProblem pr = problem(2, 16, 16, 1024, 1024, 128, 128, false);
  const AttentionPlan good = kf::plan_attention_bwd(pr, kH100);
  ASSERT_EQ(good.kind, AttentionKernel::kBwdMma);
  ASSERT_TRUE(kf::check_bwd_plan(good, pr, kH100).ok());
  auto rejects = [&](AttentionPlan p, const AttentionProblem& prob, const DeviceInfo& dev, kf::StatusCode code,
                     const char* needle) {
    const kf::Status s = kf::check_bwd_plan(p, prob, dev);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("attention_backward"), std::string::npos) << s.message();
  };
  AttentionPlan p = good;
  p.kind = AttentionKernel::kMma;
  rejects(p, pr, kH100, kf::StatusCode::kNotSupported, "kBwdMma");
  p = good;
  p.block_n = 96;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "no such tile");
  p = good;
  p.stages = 1;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "no such tile");
  p = good;
  p.splits = 2;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "splits");
  p = good;
  p.order = AttentionOrder::kLongestFirst;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "order");
  // 173 KB of shared memory: not on an A100 (163 KB).
  rejects(good, pr, kA100, kf::StatusCode::kInvalidArgument, "bytes of shared memory");
  // Head dims without a kernel, and a plan for other head dims.
  rejects(good, problem(2, 16, 16, 1024, 1024, 80, 80, false), kH100, kf::StatusCode::kNotSupported, "head dims 80/80");
  rejects(good, problem(2, 16, 16, 1024, 1024, 64, 64, false), kH100, kf::StatusCode::kInvalidArgument,
          "head dims 64/64");
  // Grid limits: query heads (and kv heads) ride on gridDim.y.
  rejects(good, problem(1, 70000, 70000, 128, 128, 128, 128, false), kH100, kf::StatusCode::kNotSupported, "65535");
}

TEST(AttentionBwdPlan, WgmmaPlansRejected) {
  const AttentionProblem pr = problem(2, 16, 16, 1024, 1024, 128, 128);
  const AttentionPlan w = kf::plan_attention_bwd(pr, kH100);
  ASSERT_EQ(w.kind, AttentionKernel::kBwdWgmma);
  ASSERT_TRUE(kf::check_bwd_plan(w, pr, kH100).ok());
  auto rejects = [&](const AttentionPlan& p, const AttentionProblem& prob, const DeviceInfo& dev, kf::StatusCode code,
                     const char* needle) {
    const kf::Status s = kf::check_bwd_plan(p, prob, dev);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  rejects(w, pr, kA100, kf::StatusCode::kNotSupported, "sm_90");
  rejects(w, problem(2, 16, 16, 1024, 1024, 128, 128, false), kH100, kf::StatusCode::kNotSupported, "16-byte");
  rejects(w, problem(2, 16, 16, 1024, 1024, 192, 128), kH100, kf::StatusCode::kInvalidArgument,
          "wgmma backward configuration");  // a d128 plan for a 192/128 call
  rejects(w, problem(2, 16, 16, 1024, 1024, 96, 96), kH100, kf::StatusCode::kNotSupported, "192/128 only");
  rejects(w, problem(2, 16, 16, 1024, 1024, 256, 256), kH100, kf::StatusCode::kInvalidArgument,
          "wgmma backward configuration");  // a d128 plan for a d256 call
  // d256: the column-split kernel's 64 x 64 tile, order=row only.
  const AttentionProblem d256 = with_causal(problem(2, 16, 16, 2048, 2048, 256, 256));
  AttentionPlan w256 = kf::plan_attention_bwd(d256, kH100);
  EXPECT_TRUE(kf::check_bwd_plan(w256, d256, kH100).ok());
  rejects(w256, pr, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  w256.order = AttentionOrder::kPaired;
  rejects(w256, d256, kH100, kf::StatusCode::kInvalidArgument, "head dims 64 and 128");
  const AttentionProblem d192 = with_causal(problem(2, 16, 16, 2048, 2048, 192, 128));
  AttentionPlan w192 = kf::plan_attention_bwd(d192, kH100);
  EXPECT_EQ(kf::to_string(w192), "attn_bwd_wgmma d=192/128 tile=64x64 warps=12 stages=2 order=row");
  EXPECT_TRUE(kf::check_bwd_plan(w192, d192, kH100).ok());
  rejects(w192, d256, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  w192.order = AttentionOrder::kPaired;
  rejects(w192, d192, kH100, kf::StatusCode::kInvalidArgument, "head dims 64 and 128");
  rejects(w, problem(2, 16, 16, 1024, 1024, 64, 64), kH100, kf::StatusCode::kInvalidArgument,
          "wgmma backward configuration");  // a d128 plan for a d64 call
  AttentionPlan p = w;
  p.block_m = 128;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  p = w;
  p.stages = 3;
  rejects(p, pr, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  rejects(w, problem(1, 70000, 70000, 128, 128, 128, 128), kH100, kf::StatusCode::kNotSupported, "65535");
  // d64: 128 query rows per step without a softcap, 64 with one; each plan is rejected for the other.
  const AttentionProblem d64 = problem(2, 16, 16, 1024, 1024, 64, 64), d64_cap = with_softcap(d64);
  const AttentionPlan w64 = kf::plan_attention_bwd(d64, kH100), w64_cap = kf::plan_attention_bwd(d64_cap, kH100);
  ASSERT_EQ(w64.kind, AttentionKernel::kBwdWgmma);
  ASSERT_EQ(w64_cap.kind, AttentionKernel::kBwdWgmma);
  EXPECT_EQ(w64.block_m, 128);
  EXPECT_EQ(w64_cap.block_m, 64);
  EXPECT_TRUE(kf::check_bwd_plan(w64, d64, kH100).ok());
  EXPECT_TRUE(kf::check_bwd_plan(w64_cap, d64_cap, kH100).ok());
  rejects(w64, d64_cap, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  rejects(w64_cap, d64, kH100, kf::StatusCode::kInvalidArgument, "wgmma backward configuration");
  // The workspace's semaphores follow the plan's query tiles: 16 per sequence and head at 64 rows.
  AttentionProblem det = d64_cap;
  det.deterministic = true;
  EXPECT_EQ(kf::bwd_workspace_bytes(w64_cap, det),
            kf::attn_bwd_workspace(64, 2, 16, 1024, 2048, 64, true, false).bytes);
  // Elsewhere the mma kernel runs d128: no wgmma candidate on an A100.
  for (const AttentionPlan& c : kf::candidate_bwd_plans(pr, kA100)) EXPECT_EQ(c.kind, AttentionKernel::kBwdMma);
}

TEST(AttentionBwdPlan, PairedSchedule) {
  // The wgmma kernel's paired schedule: a CTA per key-tile pair t, T - 1 - t. The planner takes it
  // (with KF_ATTN_BWD_PAIRED=1; off by default) for causal calls without a window, not
  // deterministic, whose grid model finishes earlier paired: the Llama-3.2-1B shape (b2 x 32/8 x
  // 2048, 256 unpaired CTAs on 132 SMs) pairs; at 1024 tokens the unpaired grid is one wave (128
  // CTAs) and stays unpaired, as do grids of more than 4 waves.
  const char* kRow = "attn_bwd_wgmma d=64/64 tile=128x128 warps=12 stages=2 order=row";
  const char* kPaired = "attn_bwd_wgmma d=64/64 tile=128x128 warps=12 stages=2 order=paired";
  const AttentionProblem llama = with_causal(problem(2, 32, 8, 2048, 2048, 64, 64));
  AttentionProblem det = llama, window = llama, varlen = llama;
  det.deterministic = true;
  window.window = true;  // causal with a left window: every key tile has about the same work
  varlen.varlen = true;  // two sequences, 4096 tokens: the model takes the mean length
  auto plan = [](const AttentionProblem& pr) { return kf::to_string(kf::plan_attention_bwd(pr, kH100)); };
  {
    const EnvVar env("KF_ATTN_BWD_PAIRED", nullptr);  // the default: off
    EXPECT_EQ(plan(llama), kRow);
  }
  {
    const EnvVar env("KF_ATTN_BWD_PAIRED", "0");
    EXPECT_EQ(plan(llama), kRow);
  }
  {
    const EnvVar env("KF_ATTN_BWD_PAIRED", "1");
    EXPECT_EQ(plan(llama), kPaired);
    EXPECT_EQ(plan(varlen), kPaired);
    EXPECT_EQ(plan(det), kRow);
    EXPECT_EQ(plan(window), kRow);
    EXPECT_EQ(plan(problem(2, 32, 8, 2048, 2048, 64, 64)), kRow);               // no mask: even work
    EXPECT_EQ(plan(with_causal(problem(2, 32, 8, 1024, 1024, 64, 64))), kRow);  // one wave unpaired
    EXPECT_EQ(plan(with_causal(problem(8, 32, 8, 2048, 2048, 64, 64))), kRow);  // 8 waves unpaired
    EXPECT_EQ(plan(with_causal(problem(2, 32, 8, 4096, 4096, 64, 64))), kPaired);
    EXPECT_EQ(plan(with_causal(problem(2, 32, 8, 2048, 2048, 128, 128))),
              "attn_bwd_wgmma d=128/128 tile=64x128 warps=12 stages=2 order=paired");
    EXPECT_EQ(plan(with_softcap(llama)), "attn_bwd_wgmma d=64/64 tile=64x128 warps=12 stages=2 order=paired");
    EXPECT_EQ(plan(with_causal(problem(2, 16, 16, 2048, 2048, 256, 256))),
              "attn_bwd_wgmma d=256/256 tile=64x64 warps=12 stages=2 order=row");  // the d256 kernel does not pair
    EXPECT_EQ(kf::to_string(kf::plan_attention_bwd(llama, kA100)),
              "attn_bwd_mma d=64/64 tile=64x128 warps=8 stages=2 order=row");  // the mma kernel does not pair
    const AttentionPlan p = kf::plan_attention_bwd(llama, kH100);
    EXPECT_EQ(p.order, AttentionOrder::kPaired);
    EXPECT_TRUE(kf::check_bwd_plan(p, llama, kH100).ok());
    // The workspace does not depend on the order.
    EXPECT_EQ(kf::bwd_workspace_bytes(p, llama), kf::bwd_workspace_bytes(kf::plan_attention_bwd(det, kH100), llama));
  }
  // check_bwd_plan: paired runs every non-deterministic call of the wgmma kernel (any mask), never a
  // deterministic one; the mma kernel has no paired order.
  AttentionPlan paired = kf::plan_attention_bwd(llama, kH100);
  paired.order = AttentionOrder::kPaired;
  EXPECT_TRUE(kf::check_bwd_plan(paired, llama, kH100).ok());
  EXPECT_TRUE(kf::check_bwd_plan(paired, window, kH100).ok());
  EXPECT_TRUE(kf::check_bwd_plan(paired, problem(2, 32, 8, 2048, 2048, 64, 64), kH100).ok());
  kf::Status st = kf::check_bwd_plan(paired, det, kH100);
  EXPECT_EQ(st.code(), kf::StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("deterministic"), std::string::npos) << st.message();
  AttentionPlan longest = paired;
  longest.order = AttentionOrder::kLongestFirst;
  st = kf::check_bwd_plan(longest, llama, kH100);
  EXPECT_EQ(st.code(), kf::StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("order=row or order=paired"), std::string::npos) << st.message();
  const AttentionProblem unaligned_llama = with_causal(problem(2, 32, 8, 2048, 2048, 64, 64, false));
  AttentionPlan mma = kf::plan_attention_bwd(unaligned_llama, kH100);
  ASSERT_EQ(mma.kind, AttentionKernel::kBwdMma);
  mma.order = AttentionOrder::kPaired;
  st = kf::check_bwd_plan(mma, unaligned_llama, kH100);
  EXPECT_EQ(st.code(), kf::StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("order"), std::string::npos) << st.message();
  // Candidates: the paired plan for every non-deterministic wgmma call (the GPU tests run it), none
  // for deterministic ones.
  auto has_paired = [](const std::vector<AttentionPlan>& plans) {
    for (const AttentionPlan& c : plans)
      if (c.order == AttentionOrder::kPaired) return true;
    return false;
  };
  EXPECT_TRUE(has_paired(kf::candidate_bwd_plans(llama, kH100)));
  EXPECT_TRUE(has_paired(kf::candidate_bwd_plans(window, kH100)));
  EXPECT_TRUE(has_paired(kf::candidate_bwd_plans(problem(1, 4, 1, 512, 512, 128, 128), kH100)));
  EXPECT_FALSE(has_paired(kf::candidate_bwd_plans(det, kH100)));
  EXPECT_FALSE(has_paired(kf::candidate_bwd_plans(llama, kA100)));
}

TEST(AttentionBwdPlan, WorkspaceLayout) {
  // B = 2, Hq = 4, Sq = 100 (total 200), Dqk = 128, block_m 64: 2 query tiles and 2 preprocessing
  // blocks per sequence. Regions in order, each 256-byte aligned.
  AttentionProblem pr = problem(2, 4, 2, 100, 300, 128, 128);
  AttentionPlan plan = kf::plan_attention_bwd(pr, kH100);
  ASSERT_EQ(plan.block_m, 64);
  kf::AttnBwdWorkspace w = kf::attn_bwd_workspace(64, 2, 4, 100, 200, 128, false, false);
  EXPECT_EQ(w.q_tiles, 2);
  EXPECT_EQ(w.pre_tiles, 2);
  EXPECT_EQ(w.dq_acc, 0u);
  EXPECT_EQ(w.lse2, 4u * 200 * 128 * 4);  // 409600
  EXPECT_EQ(w.dsum, w.lse2 + 3328);       // 4 * 200 floats, rounded up to 256
  EXPECT_EQ(w.sem, w.dsum + 3328);        // empty without deterministic
  EXPECT_EQ(w.sinks, w.sem);              // empty without sinks
  EXPECT_EQ(w.bytes, w.sem);
  EXPECT_EQ(kf::bwd_workspace_bytes(plan, pr), w.bytes);
  pr.deterministic = true;
  pr.sinks = true;
  w = kf::attn_bwd_workspace(64, 2, 4, 100, 200, 128, true, true);
  EXPECT_EQ(w.sinks, w.sem + 256);    // 2 x 4 x 2 semaphores
  EXPECT_EQ(w.bytes, w.sinks + 256);  // 4 x 2 x 2 partials
  EXPECT_EQ(kf::bwd_workspace_bytes(plan, pr), w.bytes);
  for (size_t off : {w.dq_acc, w.lse2, w.dsum, w.sem, w.sinks, w.bytes}) EXPECT_EQ(off % 256, 0u);
  // No query rows: only the (empty) regions, no semaphores.
  w = kf::attn_bwd_workspace(64, 2, 4, 0, 0, 128, true, true);
  EXPECT_EQ(w.bytes, 0u);
}

}  // namespace
