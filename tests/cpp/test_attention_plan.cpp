// The attention planner (src/attention/attention_plan.h) on the device facts of an H100, an A100, an
// RTX 4090-class sm_89 device (99 KB of shared memory per block) and a T4, without a GPU: problem ->
// the expected kernel and tile; every candidate plan passes check_plan; impossible plans are rejected
// with the reason.
#include <string>
#include <vector>

#include "attention/attention_fwd_mma_config.h"
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
                         bool causal = false) {
  AttentionProblem p;
  p.elem_bytes = 2;
  p.bf16 = true;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.total_q = batch * sq;
  p.head_dim_qk = dqk;
  p.head_dim_v = dv;
  p.causal = causal;
  p.tma_ok = true;
  return p;
}

AttentionProblem varlen(int64_t batch, int heads_q, int heads_kv, int64_t total_q, int64_t max_q, int d) {
  AttentionProblem p = problem(batch, heads_q, heads_kv, max_q, max_q, d, d);
  p.varlen = true;
  p.total_q = total_q;
  return p;
}

struct Expect {
  const char* what;
  AttentionProblem problem;
  const DeviceInfo* dev;
  const char* plan;  // to_string of the expected plan
};

// Expected plans, from the rules of attention_plan.cpp and attention_plan_wgmma.cpp. On sm_90 with
// TMA-aligned tensors the wgmma kernel runs every head dim it has (64, 128, 192/128, 256; 128 x 128
// tiles, 128 x 80 for d256). Otherwise the mma kernel: each head dim's first kAttnMmaTiles row that
// fits the device's shared memory (128 x 64 with 8 warps for d64..d128, 128 x 32 for 192/128, 64 x 32
// for d256); the row with the smallest block_m when the call has fewer blocks than SMs. Causal calls
// start the longest query tiles first.
AttentionProblem no_tma(AttentionProblem p) {
  p.tma_ok = false;
  return p;
}

const Expect kExpect[] = {
    {"d128 b4 s4096 h32", problem(4, 32, 8, 4096, 4096, 128, 128), &kH100,
     "attn_fwd_wgmma d=128/128 tile=128x128 warps=12 stages=2 order=row"},
    {"d128 b4 s4096 h32 causal", problem(4, 32, 8, 4096, 4096, 128, 128, true), &kH100,
     "attn_fwd_wgmma d=128/128 tile=128x128 warps=12 stages=2 order=longest"},
    {"d128 b4 s4096 h32 unaligned", no_tma(problem(4, 32, 8, 4096, 4096, 128, 128)), &kH100,
     "attn_fwd_mma d=128/128 tile=128x64 warps=8 stages=2 order=row"},
    {"d128 b4 s4096 h32 causal unaligned", no_tma(problem(4, 32, 8, 4096, 4096, 128, 128, true)), &kH100,
     "attn_fwd_mma d=128/128 tile=128x64 warps=8 stages=2 order=longest"},
    {"d128 b4 s4096 h32 A100", problem(4, 32, 8, 4096, 4096, 128, 128), &kA100,
     "attn_fwd_mma d=128/128 tile=128x64 warps=8 stages=2 order=row"},
    // 102 KB of 128 x 64 exceeds sm_89's 99 KB per block
    {"d128 b4 s4096 h32 sm_89", problem(4, 32, 8, 4096, 4096, 128, 128), &kAda,
     "attn_fwd_mma d=128/128 tile=64x64 warps=4 stages=2 order=row"},
    // 4 query tiles x 8 heads = 32 blocks of 128 rows < 132 SMs: 64-row tiles
    {"d128 b1 s512 h8 unaligned", no_tma(problem(1, 8, 8, 512, 512, 128, 128)), &kH100,
     "attn_fwd_mma d=128/128 tile=64x64 warps=4 stages=2 order=row"},
    {"d128 b1 s512 h8", problem(1, 8, 8, 512, 512, 128, 128), &kH100,
     "attn_fwd_wgmma d=128/128 tile=128x128 warps=12 stages=2 order=row"},
    // 11 query tiles x 12 heads = 132 blocks of 128 rows: enough
    {"d128 b1 s1408 h12 A100", problem(1, 12, 12, 1408, 1408, 128, 128), &kA100,
     "attn_fwd_mma d=128/128 tile=128x64 warps=8 stages=2 order=row"},
    {"d64 b8 s2048 h16", problem(8, 16, 16, 2048, 2048, 64, 64), &kH100,
     "attn_fwd_wgmma d=64/64 tile=128x128 warps=12 stages=2 order=row"},
    {"d64 b8 s2048 h16 A100", problem(8, 16, 16, 2048, 2048, 64, 64), &kA100,
     "attn_fwd_mma d=64/64 tile=128x64 warps=8 stages=2 order=row"},
    {"d64 decode-sized s1 unaligned", no_tma(problem(1, 16, 16, 1, 2048, 64, 64)), &kH100,
     "attn_fwd_mma d=64/64 tile=64x64 warps=4 stages=2 order=row"},
    // the wgmma kernel has no d96: the mma kernel on every device
    {"d96 b2 s4096 h32", problem(2, 32, 32, 4096, 4096, 96, 96), &kH100,
     "attn_fwd_mma d=96/96 tile=128x64 warps=8 stages=2 order=row"},
    {"d96 b2 s4096 h32 A100", problem(2, 32, 32, 4096, 4096, 96, 96), &kA100,
     "attn_fwd_mma d=96/96 tile=128x64 warps=8 stages=2 order=row"},
    {"d192/128 MLA prefill", problem(1, 128, 128, 4096, 4096, 192, 128, true), &kH100,
     "attn_fwd_wgmma d=192/128 tile=128x128 warps=12 stages=2 order=longest"},
    {"d192/128 MLA prefill A100", problem(1, 128, 128, 4096, 4096, 192, 128, true), &kA100,
     "attn_fwd_mma d=192/128 tile=128x32 warps=8 stages=2 order=longest"},
    {"d192/128 sm_89", problem(1, 128, 128, 4096, 4096, 192, 128), &kAda,
     "attn_fwd_mma d=192/128 tile=128x32 warps=8 stages=2 order=row"},
    {"d256 b2 s4096 h16", problem(2, 16, 16, 4096, 4096, 256, 256), &kH100,
     "attn_fwd_wgmma d=256/256 tile=128x80 warps=12 stages=2 order=row"},
    {"d256 b2 s4096 h16 A100", problem(2, 16, 16, 4096, 4096, 256, 256), &kA100,
     "attn_fwd_mma d=256/256 tile=64x32 warps=4 stages=2 order=row"},
    {"d256 sm_89 (99 KB exactly)", problem(2, 16, 16, 4096, 4096, 256, 256), &kAda,
     "attn_fwd_mma d=256/256 tile=64x32 warps=4 stages=2 order=row"},
    {"varlen d128", varlen(3, 32, 8, 3000, 1000, 128), &kH100,
     "attn_fwd_wgmma d=128/128 tile=128x128 warps=12 stages=2 order=row"},
    // varlen: 3 x 1000 query rows over 32 heads: at least 24 x 32 blocks of 128 rows
    {"varlen d128 A100", varlen(3, 32, 8, 3000, 1000, 128), &kA100,
     "attn_fwd_mma d=128/128 tile=128x64 warps=8 stages=2 order=row"},
    {"varlen d128 short A100", varlen(3, 4, 4, 300, 100, 128), &kA100,
     "attn_fwd_mma d=128/128 tile=64x64 warps=4 stages=2 order=row"},
};

TEST(AttentionPlan, ExpectedPlans) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const AttentionPlan p = kf::plan_attention_fwd(e.problem, *e.dev);
    EXPECT_EQ(kf::to_string(p), e.plan);
    const kf::Status s = kf::check_plan(p, e.problem, *e.dev);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(kf::workspace_bytes(p, e.problem), 0u);
  }
}

TEST(AttentionPlan, CandidatesPassCheckPlan) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(e.what);
    const std::vector<AttentionPlan> plans = kf::candidate_plans(e.problem, *e.dev);
    ASSERT_FALSE(plans.empty());
    EXPECT_EQ(kf::to_string(plans.front()), e.plan);  // the default comes first
    for (const AttentionPlan& p : plans) {
      SCOPED_TRACE(kf::to_string(p));
      const kf::Status s = kf::check_plan(p, e.problem, *e.dev);
      EXPECT_TRUE(s.ok()) << s.message();
      for (const AttentionPlan& q : plans)
        if (&q != &p) {
          EXPECT_NE(kf::to_string(p), kf::to_string(q));
        }
    }
  }
}

// Every head dim has both of its mma tiles on the H100 and the A100, and its wgmma tile on the H100
// (every head dim but 96); on sm_89 only the mma tiles within 99 KB.
TEST(AttentionPlan, CandidateTilesPerDevice) {
  const int dims[][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 128}, {256, 256}};
  for (const auto& d : dims) {
    SCOPED_TRACE(std::to_string(d[0]) + "/" + std::to_string(d[1]));
    const AttentionProblem pr = problem(2, 16, 16, 4096, 4096, d[0], d[1]);
    EXPECT_EQ(kf::candidate_plans(pr, kH100).size(), d[0] == 96 ? 2u : 3u);
    // A100: 163 KB holds every tile (the largest: 192/128 64x64 109 KB, d256 128x32 132 KB)
    EXPECT_EQ(kf::candidate_plans(pr, kA100).size(), 2u);
    for (const AttentionPlan& p : kf::candidate_plans(pr, kAda)) {
      EXPECT_LE(kf::attention_mma_smem_bytes(p.head_dim_qk, p.head_dim_v, p.block_m, p.block_n), 99 * 1024)
          << kf::to_string(p);
    }
  }
  // sm_89 (99 KB): d128 128x64 (102 KB), 192/128 64x64 (109 KB) and d256 128x32 (132 KB) do not fit
  EXPECT_EQ(kf::candidate_plans(problem(2, 16, 16, 4096, 4096, 128, 128), kAda).size(), 1u);
  EXPECT_EQ(kf::candidate_plans(problem(2, 16, 16, 4096, 4096, 192, 128), kAda).size(), 1u);
  EXPECT_EQ(kf::candidate_plans(problem(2, 16, 16, 4096, 4096, 256, 256), kAda).size(), 1u);
  EXPECT_EQ(kf::candidate_plans(problem(2, 16, 16, 4096, 4096, 64, 64), kAda).size(), 2u);
}

// The shared-memory footprint: Q tile + 2 stages of (K, V), rows padded by 8 elements.
TEST(AttentionPlan, SharedMemoryFootprint) {
  EXPECT_EQ(kf::attention_mma_smem_bytes(128, 128, 128, 64), 2 * (128 * 136 + 2 * 64 * (136 + 136)));
  EXPECT_EQ(kf::attention_mma_smem_bytes(128, 128, 128, 64), 104448);
  EXPECT_EQ(kf::attention_mma_smem_bytes(256, 256, 64, 32), 99 * 1024);
  EXPECT_EQ(kf::attention_mma_smem_bytes(192, 128, 128, 32), 94208);
  for (const kf::AttnMmaTile& t : kf::kAttnMmaTiles) {
    EXPECT_LE(kf::attention_mma_smem_bytes(t.head_dim_qk, t.head_dim_v, 16 * t.warps, t.block_n), 227 * 1024);
  }
}

TEST(AttentionPlan, BelowSm80NotSupported) {
  for (int d : {64, 128, 256}) {
    const AttentionProblem pr = problem(2, 16, 16, 1024, 1024, d, d);
    const AttentionPlan p = kf::plan_attention_fwd(pr, kT4);
    const kf::Status s = kf::check_plan(p, pr, kT4);
    EXPECT_EQ(s.code(), kf::StatusCode::kNotSupported) << s.message();
    EXPECT_NE(s.message().find("compute capability 8.0"), std::string::npos) << s.message();
    EXPECT_TRUE(kf::candidate_plans(pr, kT4).empty());
  }
}

TEST(AttentionPlan, ImpossiblePlansRejected) {
  const AttentionProblem pr = no_tma(problem(2, 16, 4, 1024, 1024, 128, 128));  // an mma plan on the H100
  const AttentionPlan good = kf::plan_attention_fwd(pr, kH100);
  ASSERT_TRUE(kf::check_plan(good, pr, kH100).ok());
  auto rejected = [&](const AttentionPlan& p, const AttentionProblem& on, const DeviceInfo& dev, kf::StatusCode code,
                      const char* needle) {
    const kf::Status s = kf::check_plan(p, on, dev);
    EXPECT_EQ(s.code(), code) << kf::to_string(p) << ": " << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  AttentionPlan p = good;
  p.kind = static_cast<AttentionKernel>(7);
  rejected(p, pr, kH100, kf::StatusCode::kNotSupported, "no such kernel");
  EXPECT_NE(kf::to_string(p).find("attn_unknown(7)"), std::string::npos);
  // head dims without a kernel (Dqk 80; Dv != Dqk except 192/128)
  for (const auto& d : {std::pair<int, int>{80, 80}, {128, 64}, {192, 192}, {512, 512}}) {
    const AttentionProblem bad = problem(2, 16, 4, 1024, 1024, d.first, d.second);
    rejected(kf::plan_attention_fwd(bad, kH100), bad, kH100, kf::StatusCode::kNotSupported,
             "no mma kernel for head dims");
    EXPECT_TRUE(kf::candidate_plans(bad, kH100).empty());
  }
  // a plan for other head dims than the call's
  p = kf::plan_attention_fwd(no_tma(problem(2, 16, 4, 1024, 1024, 64, 64)), kH100);
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "the call has head dims 128/128");
  // tiles that are not built
  p = good;
  p.block_n = 48;
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "no such tile");
  p = good;
  p.block_m = 256;
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "no such tile");
  p = good;
  p.warps = 2;
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "no such tile");
  p = good;
  p.stages = 3;
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "2 pipeline stages");
  p = good;
  p.splits = 4;
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "splits = 1");
  p = good;
  p.order = static_cast<AttentionOrder>(9);
  rejected(p, pr, kH100, kf::StatusCode::kInvalidArgument, "unknown tile order");
  // a tile that exceeds the device's shared memory
  const AttentionProblem d256 = problem(2, 16, 4, 1024, 1024, 256, 256);
  p = good;
  p.head_dim_qk = p.head_dim_v = 256;
  p.block_m = 128, p.block_n = 32, p.warps = 8;
  ASSERT_TRUE(kf::check_plan(p, d256, kH100).ok());
  rejected(p, d256, kAda, kf::StatusCode::kInvalidArgument, "bytes of shared memory");
  // capability 7.5
  rejected(good, pr, kT4, kf::StatusCode::kNotSupported, "compute capability 8.0");
  // grid limits
  rejected(good, problem(70000, 16, 4, 128, 128, 128, 128), kH100, kf::StatusCode::kNotSupported, "65535");
  // the wgmma kernel's plans go to its own check
  p = good;
  p.kind = AttentionKernel::kWgmma;
  EXPECT_FALSE(kf::check_plan(p, pr, kH100).ok());
  // the wgmma plan of an aligned call: valid on the H100, not on the A100 or for unaligned tensors
  const AttentionProblem aligned = problem(2, 16, 4, 1024, 1024, 128, 128);
  const AttentionPlan w = kf::plan_attention_fwd(aligned, kH100);
  ASSERT_EQ(w.kind, AttentionKernel::kWgmma) << kf::to_string(w);
  EXPECT_TRUE(kf::check_plan(w, aligned, kH100).ok());
  EXPECT_FALSE(kf::check_plan(w, aligned, kA100).ok());
  EXPECT_FALSE(kf::check_plan(w, pr, kH100).ok());
  p = w;
  p.block_n = 64;
  rejected(p, aligned, kH100, kf::StatusCode::kInvalidArgument, "");
}

TEST(AttentionPlan, ToString) {
  AttentionPlan p;
  p.kind = AttentionKernel::kMma;
  p.head_dim_qk = 192, p.head_dim_v = 128, p.block_m = 128, p.block_n = 32, p.warps = 8, p.stages = 2;
  EXPECT_EQ(kf::to_string(p), "attn_fwd_mma d=192/128 tile=128x32 warps=8 stages=2 order=row");
  p.kind = AttentionKernel::kWgmma;
  p.splits = 2;
  p.order = AttentionOrder::kLongestFirst;
  EXPECT_EQ(kf::to_string(p), "attn_fwd_wgmma d=192/128 tile=128x32 warps=8 stages=2 splits=2 order=longest");
}

}  // namespace
