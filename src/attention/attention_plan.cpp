// The attention planner (see attention_plan.h): the mma kernel's tile from its compiled tiles
// (kAttnMmaTiles, attention_fwd_mma_config.h) by head dim, the device's shared memory and how many
// blocks the call has; the wgmma kernel's first plan (attention_plan_wgmma.cpp) once it is enabled.
#include "attention/attention_plan.h"

#include <algorithm>
#include <cstdint>

#include "attention/attention_fwd_mma_config.h"
#include "common/math.h"

namespace kernelforge {

namespace {

// set true once the wgmma kernel is verified on the GPU: production then runs the first entry of
// wgmma_plans() whenever it is non-empty (sm_90, head dims, features and alignment it supports).
constexpr bool kUseWgmma = true;

// The mma kernel needs mma.sync m16n8k16 with bf16, ldmatrix and cp.async: sm_80.
constexpr int kMmaMinCapability = 80;

// Opt-in dynamic shared memory per block by compute capability (CUDA C Programming Guide, "Technical
// Specifications per Compute Capability"); a capability not listed gets the smallest sm_8x+ value.
struct SmemLimit {
  int capability;
  int64_t bytes;
};
constexpr SmemLimit kSmemLimits[] = {
    {80, 163 * 1024},   // A100
    {86, 99 * 1024},    // GA10x (RTX 30, A40, A10)
    {87, 163 * 1024},   // Jetson Orin
    {89, 99 * 1024},    // Ada (RTX 40, L4, L40)
    {90, 227 * 1024},   // H100, H200
    {100, 227 * 1024},  // B200
    {103, 227 * 1024},  // B300
    {120, 99 * 1024},   // RTX 50
};
constexpr int64_t kSmemLimitDefault = 99 * 1024;

// The preferred tile of a head dim is its first kAttnMmaTiles row that fits the device. When the
// call has fewer than kMmaMinBlocksPerSm blocks of it per SM (a short prefill, few heads), the
// fitting row with the smallest block_m runs instead: twice the blocks, the SMs filled.
constexpr int64_t kMmaMinBlocksPerSm = 1;

// CUDA's grid limits: gridDim.y carries the query heads, gridDim.z the batch.
constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxGridX = 2147483647;

int64_t smem_limit(int capability) {
  for (const SmemLimit& s : kSmemLimits)
    if (s.capability == capability) return s.bytes;
  return kSmemLimitDefault;
}

int block_m_of(const AttnMmaTile& t) { return kAttnMmaWarpRows * t.warps; }

int64_t tile_smem(const AttnMmaTile& t) {
  return attention_mma_smem_bytes(t.head_dim_qk, t.head_dim_v, block_m_of(t), t.block_n);
}

bool fits(const AttnMmaTile& t, const AttentionProblem& pr, const DeviceInfo& dev) {
  return t.head_dim_qk == pr.head_dim_qk && t.head_dim_v == pr.head_dim_v && tile_smem(t) <= smem_limit(dev.capability);
}

bool has_mma_kernel(int dqk, int dv) {
  for (const AttnMmaTile& t : kAttnMmaTiles)
    if (t.head_dim_qk == dqk && t.head_dim_v == dv) return true;
  return false;
}

// Blocks of the grid that do work: query tiles over every sequence, times the query heads.
int64_t busy_blocks(const AttentionProblem& pr, int block_m) {
  const int64_t tiles =
      pr.varlen ? ceil_div(pr.total_q, block_m) + pr.batch - 1 : pr.batch * ceil_div(pr.seqlen_q, block_m);
  return tiles * pr.heads_q;
}

AttentionPlan mma_plan(const AttentionProblem& pr, const AttnMmaTile& t) {
  AttentionPlan p;
  p.kind = AttentionKernel::kMma;
  p.head_dim_qk = t.head_dim_qk;
  p.head_dim_v = t.head_dim_v;
  p.block_m = block_m_of(t);
  p.block_n = t.block_n;
  p.warps = t.warps;
  p.stages = kAttnMmaStages;
  p.splits = 1;
  // Causal: the last query tiles see the most keys; starting them first keeps them off the tail.
  p.order = pr.causal ? AttentionOrder::kLongestFirst : AttentionOrder::kRowMajor;
  return p;
}

bool same_plan(const AttentionPlan& a, const AttentionPlan& b) {
  return a.kind == b.kind && a.head_dim_qk == b.head_dim_qk && a.head_dim_v == b.head_dim_v && a.block_m == b.block_m &&
         a.block_n == b.block_n && a.warps == b.warps && a.stages == b.stages && a.splits == b.splits &&
         a.order == b.order;
}

}  // namespace

int64_t attention_smem_limit(int capability) { return smem_limit(capability); }

std::string to_string(const AttentionPlan& plan) {
  std::string s;
  switch (plan.kind) {
    case AttentionKernel::kMma:
      s = "attn_fwd_mma";
      break;
    case AttentionKernel::kWgmma:
      s = "attn_fwd_wgmma";
      break;
    case AttentionKernel::kBwdMma:
      s = "attn_bwd_mma";
      break;
    case AttentionKernel::kBwdWgmma:
      s = "attn_bwd_wgmma";
      break;
    default:
      s = "attn_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  s += " d=" + std::to_string(plan.head_dim_qk) + "/" + std::to_string(plan.head_dim_v) +
       " tile=" + std::to_string(plan.block_m) + "x" + std::to_string(plan.block_n) +
       " warps=" + std::to_string(plan.warps) + " stages=" + std::to_string(plan.stages);
  if (plan.splits != 1) s += " splits=" + std::to_string(plan.splits);
  s += plan.order == AttentionOrder::kLongestFirst ? " order=longest"
       : plan.order == AttentionOrder::kPaired     ? " order=paired"
                                                   : " order=row";
  return s;
}

AttentionPlan plan_attention_fwd(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (kUseWgmma) {
    const std::vector<AttentionPlan> w = wgmma_plans(pr, dev);
    if (!w.empty()) return w.front();
  }
  const AttnMmaTile* preferred = nullptr;
  const AttnMmaTile* smallest = nullptr;
  for (const AttnMmaTile& t : kAttnMmaTiles) {
    if (!fits(t, pr, dev)) continue;
    if (preferred == nullptr) preferred = &t;
    if (smallest == nullptr || t.warps < smallest->warps) smallest = &t;
  }
  if (preferred == nullptr) {
    // No tile of these head dims fits the device, or none is built: the first row of the head dims
    // (or an empty tile), which check_plan rejects with the reason.
    for (const AttnMmaTile& t : kAttnMmaTiles)
      if (t.head_dim_qk == pr.head_dim_qk && t.head_dim_v == pr.head_dim_v) return mma_plan(pr, t);
    AttentionPlan p;
    p.kind = AttentionKernel::kMma;
    p.head_dim_qk = pr.head_dim_qk;
    p.head_dim_v = pr.head_dim_v;
    return p;
  }
  if (smallest != preferred && busy_blocks(pr, block_m_of(*preferred)) < kMmaMinBlocksPerSm * dev.sm_count)
    return mma_plan(pr, *smallest);
  return mma_plan(pr, *preferred);
}

std::vector<AttentionPlan> candidate_plans(const AttentionProblem& pr, const DeviceInfo& dev) {
  std::vector<AttentionPlan> plans;
  auto add = [&](const AttentionPlan& p) {
    if (!check_plan(p, pr, dev).ok()) return;
    for (const AttentionPlan& q : plans)
      if (same_plan(p, q)) return;
    plans.push_back(p);
  };
  add(plan_attention_fwd(pr, dev));
  for (const AttnMmaTile& t : kAttnMmaTiles) add(mma_plan(pr, t));
  for (const AttentionPlan& p : wgmma_plans(pr, dev)) add(p);
  return plans;
}

Status check_plan(const AttentionPlan& plan, const AttentionProblem& pr, const DeviceInfo& dev) {
  const std::string what = "attention_forward: plan " + to_string(plan) + ": ";
  if (plan.kind == AttentionKernel::kWgmma) return check_wgmma_plan(plan, pr, dev);
  if (plan.kind != AttentionKernel::kMma) return Status::NotSupported(what + "no such kernel");
  if (!has_mma_kernel(pr.head_dim_qk, pr.head_dim_v))
    return Status::NotSupported(what + "no mma kernel for head dims " + std::to_string(pr.head_dim_qk) + "/" +
                                std::to_string(pr.head_dim_v) + " (built: 64, 96, 128, 256 with Dv = Dqk; 192/128)");
  if (plan.head_dim_qk != pr.head_dim_qk || plan.head_dim_v != pr.head_dim_v)
    return Status::Invalid(what + "the call has head dims " + std::to_string(pr.head_dim_qk) + "/" +
                           std::to_string(pr.head_dim_v));
  if (dev.capability < kMmaMinCapability)
    return Status::NotSupported(what + "the mma kernel needs compute capability 8.0 or newer, this GPU is sm_" +
                                std::to_string(dev.capability));
  const AttnMmaTile* tile = nullptr;
  for (const AttnMmaTile& t : kAttnMmaTiles)
    if (t.head_dim_qk == plan.head_dim_qk && t.head_dim_v == plan.head_dim_v && t.block_n == plan.block_n &&
        t.warps == plan.warps && block_m_of(t) == plan.block_m)
      tile = &t;
  if (tile == nullptr) return Status::Invalid(what + "no such tile is built (kAttnMmaTiles)");
  if (plan.stages != kAttnMmaStages) return Status::Invalid(what + "the mma kernel has 2 pipeline stages");
  if (plan.splits != 1) return Status::Invalid(what + "the mma kernel does not split over keys (splits = 1)");
  if (plan.order != AttentionOrder::kRowMajor && plan.order != AttentionOrder::kLongestFirst)
    return Status::Invalid(what + "unknown tile order");
  if (tile_smem(*tile) > smem_limit(dev.capability))
    return Status::Invalid(what + "needs " + std::to_string(tile_smem(*tile)) + " bytes of shared memory, sm_" +
                           std::to_string(dev.capability) + " allows " + std::to_string(smem_limit(dev.capability)));
  if (pr.heads_q > kMaxGridYZ || pr.batch > kMaxGridYZ)
    return Status::NotSupported(what + "at most 65535 query heads and 65535 sequences per call");
  if (ceil_div(pr.seqlen_q, plan.block_m) > kMaxGridX)
    return Status::NotSupported(what + "too many query rows per sequence");
  return Status::Ok();
}

size_t workspace_bytes(const AttentionPlan& plan, const AttentionProblem& pr) {
  (void)plan;
  (void)pr;
  return 0;  // no plan splits over keys
}

}  // namespace kernelforge
