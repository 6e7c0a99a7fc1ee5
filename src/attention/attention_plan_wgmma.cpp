// The wgmma kernel's plan table (host only): which problems the sm_90a warp-specialized kernel runs
// and with which tile. It needs an sm_90 device (the sm_90a instructions do not run on later majors),
// TMA-compatible tensors (16-byte aligned bases and strides) and one of the compiled head-dim pairs.
#include <string>
#include <vector>

#include "attention/attention_plan.h"

namespace kernelforge {

namespace {

struct WgmmaConfig {
  int head_dim_qk, head_dim_v, block_n;
};
// One row per compiled kernel (attention_fwd_wgmma_launch.cuh: WgmmaTile). Query tile 128 rows (two
// consumer warpgroups x 64), 3 warpgroups, 2 K/V stages. d256 keys in tiles of 80: 224 KB of shared
// memory and 40 + 128 accumulator registers per consumer thread.
constexpr WgmmaConfig kWgmmaConfigs[] = {
    {64, 64, 128},
    {128, 128, 128},
    {192, 128, 128},
    {256, 256, 80},
};
constexpr int kBlockM = 128;
constexpr int kWarps = 12;
constexpr int kStages = 2;

const WgmmaConfig* find_config(int dqk, int dv) {
  for (const WgmmaConfig& c : kWgmmaConfigs)
    if (c.head_dim_qk == dqk && c.head_dim_v == dv) return &c;
  return nullptr;
}

// Why the kernel cannot run the problem on the device, or an empty string.
std::string unsupported(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (pr.elem_bytes != 2) return "needs float16 or bfloat16";
  if (!pr.tma_ok) return "needs 16-byte aligned tensors and strides (TMA)";
  if (find_config(pr.head_dim_qk, pr.head_dim_v) == nullptr) return "has no kernel for these head dims";
  if (pr.seqlen_q > (int64_t(1) << 30) || pr.seqlen_k > (int64_t(1) << 30)) return "needs sequences below 2^30";
  if (pr.batch > 65535 || pr.heads_q > 65535) return "needs batch and heads below 65536 (grid y and z)";
  return "";
}

}  // namespace

std::vector<AttentionPlan> wgmma_plans(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (!unsupported(pr, dev).empty()) return {};
  const WgmmaConfig& c = *find_config(pr.head_dim_qk, pr.head_dim_v);
  AttentionPlan plan;
  plan.kind = AttentionKernel::kWgmma;
  plan.head_dim_qk = c.head_dim_qk;
  plan.head_dim_v = c.head_dim_v;
  plan.block_m = kBlockM;
  plan.block_n = c.block_n;
  plan.warps = kWarps;
  plan.stages = kStages;
  plan.splits = 1;
  // Causal / windowed tiles differ in work: the ones that see the most keys start first.
  plan.order = pr.causal || pr.window ? AttentionOrder::kLongestFirst : AttentionOrder::kRowMajor;
  return {plan};
}

Status check_wgmma_plan(const AttentionPlan& plan, const AttentionProblem& pr, const DeviceInfo& dev) {
  const std::string why = unsupported(pr, dev);
  if (!why.empty()) return Status::NotSupported("attention_forward: " + to_string(plan) + ": the wgmma kernel " + why);
  const WgmmaConfig& c = *find_config(pr.head_dim_qk, pr.head_dim_v);
  if (plan.kind != AttentionKernel::kWgmma || plan.head_dim_qk != c.head_dim_qk || plan.head_dim_v != c.head_dim_v ||
      plan.block_m != kBlockM || plan.block_n != c.block_n || plan.warps != kWarps || plan.stages != kStages ||
      plan.splits != 1)
    return Status::Invalid("attention_forward: " + to_string(plan) + " is not a wgmma configuration (expected tile " +
                           std::to_string(kBlockM) + "x" + std::to_string(c.block_n) + ", warps " +
                           std::to_string(kWarps) + ", stages " + std::to_string(kStages) + ", splits 1)");
  return Status::Ok();
}

}  // namespace kernelforge
