// The backward planner (see attention_plan.h): the wgmma kernel where it runs (sm_90, head dims
// 64/64 or 128/128, TMA-compatible tensors), otherwise the mma kernel's tile from its compiled tiles
// (kAttnBwdTiles, attention_bwd_mma_config.h) by head dims, the device's shared memory and how many
// blocks the call has; the workspace from attention_bwd_workspace.h.
#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_bwd_mma_config.h"
#include "attention/attention_bwd_workspace.h"
#include "attention/attention_plan.h"
#include "common/math.h"

namespace kernelforge {

namespace {

// mma.sync m16n8k16 with bf16, ldmatrix, cp.async: sm_80.
constexpr int kBwdMinCapability = 80;

// The preferred tile of a head dim is its first kAttnBwdTiles row that fits the device. When the
// call has fewer blocks of it than SMs (one short sequence, few kv heads), the fitting row with the
// smallest block_n runs instead: more key-tile blocks, more SMs busy.
constexpr int64_t kBwdMinBlocksPerSm = 1;

// CUDA's grid limits: gridDim.y carries the (kv or query) heads, gridDim.z the batch.
constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxGridX = 2147483647;

int64_t tile_smem(const AttnBwdTile& t) {
  return attention_bwd_mma_smem_bytes(t.head_dim_qk, t.head_dim_v, t.block_m, t.block_n, t.stages);
}

bool fits(const AttnBwdTile& t, const AttentionProblem& pr, const DeviceInfo& dev) {
  return t.head_dim_qk == pr.head_dim_qk && t.head_dim_v == pr.head_dim_v &&
         tile_smem(t) <= attention_smem_limit(dev.capability);
}

bool has_bwd_kernel(int dqk, int dv) {
  for (const AttnBwdTile& t : kAttnBwdTiles)
    if (t.head_dim_qk == dqk && t.head_dim_v == dv) return true;
  return false;
}

// Blocks of the main kernel that do work: key tiles over every sequence, times the kv heads.
int64_t busy_blocks(const AttentionProblem& pr, int block_n) {
  const int64_t tiles =
      pr.varlen ? ceil_div(pr.total_k, block_n) + pr.batch - 1 : pr.batch * ceil_div(pr.seqlen_k, block_n);
  return tiles * pr.heads_kv;
}

AttentionPlan bwd_plan(const AttnBwdTile& t) {
  AttentionPlan p;
  p.kind = AttentionKernel::kBwdMma;
  p.head_dim_qk = t.head_dim_qk;
  p.head_dim_v = t.head_dim_v;
  p.block_m = t.block_m;
  p.block_n = t.block_n;
  p.warps = t.warps;
  p.stages = t.stages;
  p.splits = 1;
  // blockIdx.x is the key tile, in increasing order (the deterministic mode's semaphores rely on it;
  // causal: the first key tiles see the most query rows and start first anyway).
  p.order = AttentionOrder::kRowMajor;
  return p;
}

// The wgmma kernel (kernels/attention_bwd_wgmma.cuh): 64 (d128) or 128 (d64) query rows x 128 keys,
// 3 warpgroups, 2 Q / dO stages; head dims 64/64 and 128/128. At d64 the 128-row step halves the dQ
// reduce-add bytes per FLOP and doubles the N of the S and dP products (registers allow it there:
// dK and dV take half of what they take at d128). d64 with a softcap takes 64 rows (the d128 step's
// shape): at 128 its consumers spill. Must equal the kernel's kBwdWgmmaBlockM<D, softcap>.
constexpr int wgmma_block_m(int head_dim, bool softcap) { return head_dim == 64 && !softcap ? 128 : 64; }
constexpr int kWgmmaBlockN = 128;
constexpr int kWgmmaWarps = 12;
constexpr int kWgmmaStages = 2;

// Why the wgmma kernel cannot run the problem on the device, or an empty string.
std::string wgmma_unsupported(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (pr.elem_bytes != 2) return "needs float16 or bfloat16";
  if (!pr.tma_ok) return "needs 16-byte aligned tensors and strides (TMA)";
  if (pr.head_dim_qk != pr.head_dim_v || (pr.head_dim_qk != 64 && pr.head_dim_qk != 128))
    return "has head dims 64/64 and 128/128 only";
  if (pr.seqlen_q > (int64_t(1) << 30) || pr.seqlen_k > (int64_t(1) << 30) || pr.total_q > (int64_t(1) << 30) ||
      pr.total_k > (int64_t(1) << 30))
    return "needs fewer than 2^30 rows";
  return "";
}

AttentionPlan bwd_wgmma_plan(const AttentionProblem& pr) {
  AttentionPlan p;
  p.kind = AttentionKernel::kBwdWgmma;
  p.head_dim_qk = pr.head_dim_qk;
  p.head_dim_v = pr.head_dim_qk;
  p.block_m = wgmma_block_m(pr.head_dim_qk, pr.softcap);
  p.block_n = kWgmmaBlockN;
  p.warps = kWgmmaWarps;
  p.stages = kWgmmaStages;
  p.splits = 1;
  p.order = AttentionOrder::kRowMajor;  // key tiles in increasing order, as the mma kernel
  return p;
}

bool same_plan(const AttentionPlan& a, const AttentionPlan& b) {
  return a.kind == b.kind && a.head_dim_qk == b.head_dim_qk && a.head_dim_v == b.head_dim_v && a.block_m == b.block_m &&
         a.block_n == b.block_n && a.warps == b.warps && a.stages == b.stages && a.splits == b.splits &&
         a.order == b.order;
}

}  // namespace

AttentionPlan plan_attention_bwd(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (wgmma_unsupported(pr, dev).empty()) return bwd_wgmma_plan(pr);
  const AttnBwdTile* preferred = nullptr;
  const AttnBwdTile* smallest = nullptr;
  for (const AttnBwdTile& t : kAttnBwdTiles) {
    if (!fits(t, pr, dev)) continue;
    if (preferred == nullptr) preferred = &t;
    if (smallest == nullptr || t.block_n < smallest->block_n) smallest = &t;
  }
  if (preferred == nullptr) {
    // No tile of these head dims fits the device, or none is built: the first row of the head dims
    // (or an empty tile), which check_bwd_plan rejects with the reason.
    for (const AttnBwdTile& t : kAttnBwdTiles)
      if (t.head_dim_qk == pr.head_dim_qk && t.head_dim_v == pr.head_dim_v) return bwd_plan(t);
    AttentionPlan p;
    p.kind = AttentionKernel::kBwdMma;
    p.head_dim_qk = pr.head_dim_qk;
    p.head_dim_v = pr.head_dim_v;
    return p;
  }
  if (smallest != preferred && busy_blocks(pr, preferred->block_n) < kBwdMinBlocksPerSm * dev.sm_count)
    return bwd_plan(*smallest);
  return bwd_plan(*preferred);
}

std::vector<AttentionPlan> candidate_bwd_plans(const AttentionProblem& pr, const DeviceInfo& dev) {
  std::vector<AttentionPlan> plans;
  auto add = [&](const AttentionPlan& p) {
    if (!check_bwd_plan(p, pr, dev).ok()) return;
    for (const AttentionPlan& q : plans)
      if (same_plan(p, q)) return;
    plans.push_back(p);
  };
  add(plan_attention_bwd(pr, dev));
  add(bwd_wgmma_plan(pr));
  for (const AttnBwdTile& t : kAttnBwdTiles) add(bwd_plan(t));
  return plans;
}

Status check_bwd_plan(const AttentionPlan& plan, const AttentionProblem& pr, const DeviceInfo& dev) {
  const std::string what = "attention_backward: plan " + to_string(plan) + ": ";
  if (plan.kind == AttentionKernel::kBwdWgmma) {
    const std::string why = wgmma_unsupported(pr, dev);
    if (!why.empty()) return Status::NotSupported(what + "the wgmma backward kernel " + why);
    if (!same_plan(plan, bwd_wgmma_plan(pr)))
      return Status::Invalid(what + "not the wgmma backward configuration (" + to_string(bwd_wgmma_plan(pr)) + ")");
    if (pr.heads_q > kMaxGridYZ || pr.batch > kMaxGridYZ)
      return Status::NotSupported(what + "at most 65535 query heads and 65535 sequences per call");
    return Status::Ok();
  }
  if (plan.kind != AttentionKernel::kBwdMma)
    return Status::NotSupported(what + "not a backward kernel (kBwdMma or kBwdWgmma)");
  if (pr.elem_bytes != 2) return Status::NotSupported(what + "needs float16 or bfloat16 tensors");
  if (!has_bwd_kernel(pr.head_dim_qk, pr.head_dim_v))
    return Status::NotSupported(what + "no backward kernel for head dims " + std::to_string(pr.head_dim_qk) + "/" +
                                std::to_string(pr.head_dim_v) + " (built: 64, 96, 128, 256 with Dv = Dqk; 192/128)");
  if (plan.head_dim_qk != pr.head_dim_qk || plan.head_dim_v != pr.head_dim_v)
    return Status::Invalid(what + "the call has head dims " + std::to_string(pr.head_dim_qk) + "/" +
                           std::to_string(pr.head_dim_v));
  if (dev.capability < kBwdMinCapability)
    return Status::NotSupported(what + "the backward kernel needs compute capability 8.0 or newer, this GPU is sm_" +
                                std::to_string(dev.capability));
  const AttnBwdTile* tile = nullptr;
  for (const AttnBwdTile& t : kAttnBwdTiles)
    if (t.head_dim_qk == plan.head_dim_qk && t.head_dim_v == plan.head_dim_v && t.block_m == plan.block_m &&
        t.block_n == plan.block_n && t.warps == plan.warps && t.stages == plan.stages)
      tile = &t;
  if (tile == nullptr) return Status::Invalid(what + "no such tile is built (kAttnBwdTiles)");
  if (plan.splits != 1) return Status::Invalid(what + "the backward kernel does not split (splits = 1)");
  if (plan.order != AttentionOrder::kRowMajor)
    return Status::Invalid(what + "the backward kernel walks key tiles in order (order = row)");
  const int64_t limit = attention_smem_limit(dev.capability);
  if (tile_smem(*tile) > limit)
    return Status::Invalid(what + "needs " + std::to_string(tile_smem(*tile)) + " bytes of shared memory, sm_" +
                           std::to_string(dev.capability) + " allows " + std::to_string(limit));
  if (pr.heads_q > kMaxGridYZ || pr.batch > kMaxGridYZ)
    return Status::NotSupported(what + "at most 65535 query heads and 65535 sequences per call");
  if (ceil_div(pr.seqlen_k, plan.block_n) > kMaxGridX || ceil_div(pr.seqlen_q, kAttnBwdPreRows) > kMaxGridX)
    return Status::NotSupported(what + "too many rows per sequence");
  return Status::Ok();
}

size_t bwd_workspace_bytes(const AttentionPlan& plan, const AttentionProblem& pr) {
  return attn_bwd_workspace(plan.block_m, pr.batch, pr.heads_q, pr.seqlen_q, pr.total_q, pr.head_dim_qk,
                            pr.deterministic, pr.sinks)
      .bytes;
}

}  // namespace kernelforge
