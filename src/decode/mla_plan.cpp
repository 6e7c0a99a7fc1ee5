// The MLA decode planner: the deepest kMlaTiles row the device's shared memory holds, then the number
// of key splits from the decode planner's cost model (decode_plan.cpp) at one CTA per SM.
//
// Splits: one CTA per (sequence, row tile) reads only its own keys, so a batch-1 call at H = 128 has
// 2 CTAs on a 132-SM GPU unless the keys are split. For each split count s the model counts the CTA
// waves (s * base CTAs over the SMs) times the 32-key tiles per CTA plus a fixed cost per CTA (the
// 72 KB Q tile is worth two tiles, the pipeline fill and the epilogue two more), and the merge pass
// when s > 1; the smallest cost wins, the smaller s on ties. A split holds at least 256 keys.
#include "decode/mla_plan.h"

#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/math.h"
#include "decode/mla_config.h"

namespace kernelforge {

namespace {

// at least 256 keys (8 tiles of 32) per split; Q tile + pipeline fill + epilogue = 4 tiles per CTA; the
// merge 2
constexpr SplitCost kSplitCost = {256, 4, 2, 128};

}  // namespace

std::string to_string(const MlaDecodePlan& plan) {
  return "mla_decode rows=" + std::to_string(plan.rows) + " tile=" + std::to_string(plan.block_n) +
         " warps=" + std::to_string(plan.warps) + " stages=" + std::to_string(plan.stages) +
         " splits=" + std::to_string(plan.splits);
}

MlaDecodePlan plan_mla_decode(const DecodeParams& p, const DeviceInfo& dev) {
  MlaDecodePlan plan;
  plan.rows = kMlaRows;
  plan.block_n = kMlaBlockN;
  plan.warps = kMlaWarps;
  plan.stages = kMlaTiles[kMlaTileCount - 1].stages;  // the shallowest: check_mla_decode_plan names a device too small
  for (const MlaTile& c : kMlaTiles) {                // deepest first
    if (dev.capability >= c.min_capability && mla_smem_bytes(c.stages) <= mla_smem_limit(dev.capability)) {
      plan.stages = c.stages;
      break;
    }
  }
  const int64_t slots = int64_t(dev.sm_count > 0 ? dev.sm_count : 1);  // one CTA per SM (shared memory)
  const int64_t base = int64_t(p.batch) * mla_row_tiles(plan, p);
  plan.splits = split_keys(base, slots, p.max_seq_len > 0 ? p.max_seq_len : 1, plan.block_n, kSplitCost);
  return plan;
}

Status check_mla_decode_plan(const MlaDecodePlan& plan, const DecodeParams& p, const DeviceInfo& dev) {
  const std::string where = "mla_decode: plan " + to_string(plan);
  bool built = false;
  for (const MlaTile& c : kMlaTiles) built = built || c.stages == plan.stages;
  if (!built || plan.rows != kMlaRows || plan.block_n != kMlaBlockN || plan.warps != kMlaWarps)
    return Status::Invalid(where + ": no such kernel is built");
  const int64_t smem = mla_smem_bytes(plan.stages), limit = mla_smem_limit(dev.capability);
  if (smem > limit)
    return Status::NotSupported(where + " needs " + std::to_string(smem) +
                                " bytes of shared memory per block, this GPU (sm_" + std::to_string(dev.capability) +
                                ") has " + std::to_string(limit));
  if (plan.splits < 1 || plan.splits > 65535) return Status::Invalid(where + ": splits must be 1 to 65535");
  if (p.head_dim != kMlaHeadDimK)
    return Status::Invalid(where + " runs the 576-column MLA cache, the call has head dim " +
                           std::to_string(p.head_dim));
  return Status::Ok();
}

size_t mla_decode_workspace_bytes(const MlaDecodePlan& plan, const DecodeParams& p) {
  if (plan.splits <= 1) return 0;
  const size_t rows = size_t(p.batch) * p.q_len * p.heads_q * plan.splits;
  const size_t o = (rows * kMlaHeadDimV * sizeof(float) + 255) / 256 * 256;
  const size_t l = (rows * sizeof(float) + 255) / 256 * 256;
  return o + l;
}

}  // namespace kernelforge
