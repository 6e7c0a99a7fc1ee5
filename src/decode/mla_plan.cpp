// The MLA decode planner: the wgmma kernel (sm_90a) where it runs, else the deepest kMlaTiles row of the
// mma.sync kernel the device's shared memory holds; then the number of key splits from the decode
// planner's cost model (decode_plan.cpp) at one CTA per SM.
//
// Kernel: the wgmma kernel needs an sm_90 device, the library's sm_90a image of it (mla_wgmma_image),
// and a cache TMA can read by boxes: pages of at least 16 rows (one box per page of a 64-key tile) or
// a contiguous cache; strides are 16-byte multiples by validation. The calls ask for it while
// kMlaWgmmaByDefault is set (mla_plan.h), and for its seesaw schedule (the same tile, ring, limits and
// split model) while kMlaSeesawByDefault is set.
//
// Splits: one CTA per (sequence, row tile) reads only its own keys, so a batch-1 call at H = 128 has
// 2 CTAs on a 132-SM GPU unless the keys are split. For each split count s the model counts the CTA
// waves (s * base CTAs over the SMs) times the key tiles per CTA plus a fixed cost per CTA, and the
// merge pass when s > 1; the smallest cost wins, the smaller s on ties. A split holds at least 256 keys.
#include "decode/mla_plan.h"

#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/math.h"
#include "decode/mla_config.h"

namespace kernelforge {

namespace {

// mma.sync, 32-key tiles: at least 256 keys (8 tiles) per split; Q tile (72 KB: two tiles) + pipeline
// fill + epilogue = 4 tiles per CTA; the merge 2.
constexpr SplitCost kSplitCost = {256, 4, 2, 128};
// wgmma, 64-key tiles: at least 256 keys (4 tiles) per split; Q tile (one tile's bytes) + fill +
// epilogue = 2 tiles per CTA; the merge 1.
constexpr SplitCost kWgmmaSplitCost = {256, 2, 1, 128};

const char* kernel_name(MlaKernel k) {
  return k == MlaKernel::kWgmma ? "wgmma" : k == MlaKernel::kWgmmaSeesaw ? "wgmma_seesaw" : "mma_sync";
}

int mla_splits(const DecodeParams& p, const DeviceInfo& dev, const MlaDecodePlan& plan, const SplitCost& cost) {
  const int64_t slots = int64_t(dev.sm_count > 0 ? dev.sm_count : 1);  // one CTA per SM (shared memory)
  const int64_t base = int64_t(p.batch) * mla_row_tiles(plan, p);
  return split_keys(base, slots, p.max_seq_len > 0 ? p.max_seq_len : 1, plan.block_n, cost);
}

}  // namespace

std::string to_string(const MlaDecodePlan& plan) {
  return std::string("mla_decode kernel=") + kernel_name(plan.kernel) + " rows=" + std::to_string(plan.rows) +
         " tile=" + std::to_string(plan.block_n) + " warps=" + std::to_string(plan.warps) +
         " stages=" + std::to_string(plan.stages) + " splits=" + std::to_string(plan.splits);
}

std::string mla_wgmma_unsupported(const DecodeParams& p, const DeviceInfo& dev, bool wgmma_image) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (!wgmma_image) return "needs a build with 90a-real (the library has no sm_90a image of it)";
  if (p.block_table != nullptr && p.page_size < kMlaWgmmaMinPage)
    return "needs pages of at least " + std::to_string(kMlaWgmmaMinPage) + " rows (TMA boxes), the cache has " +
           std::to_string(p.page_size);
  if (p.head_dim != kMlaHeadDimK) return "runs the 576-column MLA cache";
  if (p.pages < 1) return "needs a cache of at least one page (a TMA map)";
  // TMA: strides below 2^40 bytes (16-byte multiples and aligned bases are validated)
  if (p.k_st * 2 >= (int64_t(1) << 40) || p.k_sp * 2 >= (int64_t(1) << 40))
    return "needs cache strides below 2^40 bytes";
  return "";
}

MlaDecodePlan mla_wgmma_plan(const DecodeParams& p, const DeviceInfo& dev, bool seesaw) {
  MlaDecodePlan plan;
  plan.kernel = seesaw ? MlaKernel::kWgmmaSeesaw : MlaKernel::kWgmma;
  plan.rows = kMlaRows;
  plan.block_n = kMlaWgmmaBlockN;
  plan.warps = kMlaWgmmaWarps;
  plan.stages = kMlaWgmmaStages;
  plan.splits = mla_splits(p, dev, plan, kWgmmaSplitCost);
  return plan;
}

MlaDecodePlan plan_mla_decode(const DecodeParams& p, const DeviceInfo& dev, bool wgmma_image, bool seesaw) {
  if (mla_wgmma_unsupported(p, dev, wgmma_image).empty()) return mla_wgmma_plan(p, dev, seesaw);
  MlaDecodePlan plan;
  plan.kernel = MlaKernel::kMmaSync;
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
  plan.splits = mla_splits(p, dev, plan, kSplitCost);
  return plan;
}

Status check_mla_decode_plan(const MlaDecodePlan& plan, const DecodeParams& p, const DeviceInfo& dev,
                             bool wgmma_image) {
  const std::string where = "mla_decode: plan " + to_string(plan);
  if (plan.splits < 1 || plan.splits > 65535) return Status::Invalid(where + ": splits must be 1 to 65535");
  if (p.head_dim != kMlaHeadDimK)
    return Status::Invalid(where + " runs the 576-column MLA cache, the call has head dim " +
                           std::to_string(p.head_dim));
  if (plan.kernel == MlaKernel::kWgmma || plan.kernel == MlaKernel::kWgmmaSeesaw) {
    if (plan.rows != kMlaRows || plan.block_n != kMlaWgmmaBlockN || plan.warps != kMlaWgmmaWarps ||
        plan.stages != kMlaWgmmaStages)
      return Status::Invalid(where + ": no such kernel is built (" + kernel_name(plan.kernel) +
                             ": rows=" + std::to_string(kMlaRows) + " tile=" + std::to_string(kMlaWgmmaBlockN) +
                             " warps=" + std::to_string(kMlaWgmmaWarps) + " stages=" + std::to_string(kMlaWgmmaStages) +
                             ")");
    const std::string why = mla_wgmma_unsupported(p, dev, wgmma_image);
    if (!why.empty()) return Status::NotSupported(where + ": the wgmma kernel " + why);
    return Status::Ok();
  }
  if (plan.kernel != MlaKernel::kMmaSync) return Status::Invalid(where + ": no such kernel is built");
  bool built = false;
  for (const MlaTile& c : kMlaTiles) built = built || c.stages == plan.stages;
  if (!built || plan.rows != kMlaRows || plan.block_n != kMlaBlockN || plan.warps != kMlaWarps)
    return Status::Invalid(where + ": no such kernel is built");
  const int64_t smem = mla_smem_bytes(plan.stages), limit = mla_smem_limit(dev.capability);
  if (smem > limit)
    return Status::NotSupported(where + " needs " + std::to_string(smem) +
                                " bytes of shared memory per block, this GPU (sm_" + std::to_string(dev.capability) +
                                ") has " + std::to_string(limit));
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
