// The decode attention planner: a kDecodeTiles row for the head dim and the rows of one kv head,
// then the number of key splits from a small cost model over the SM count.
//
// Splits: one CTA per (sequence, kv head, row tile) reads only its own keys, so a batch-1 call has
// Hkv CTAs (8 for Llama 3) on a 132-SM GPU unless the keys are split. For each split count s the
// model counts the CTA waves (s * base CTAs over the resident CTAs of the GPU) times the key tiles per
// CTA plus a fixed cost per CTA (the pipeline fill and the merge of the warps, about two
// tiles), and the merge pass when s > 1; the smallest cost wins, the smaller s on ties. A split holds
// at least 256 keys (shorter ones are all overhead). split_keys is the model, shared with MLA decode.
// Kernel: the TMA kernel (kernels/decode_attention_tma.cuh) wherever it can run the call (an sm_90
// device, a 90a build, page size >= 16 or the contiguous cache, TMA-legal strides), else the cp.async
// kernel (kernels/decode_attention.cuh); the calls ask for it while kDecodeTmaByDefault is set
// (decode_plan.h).
#include "decode/decode_plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/math.h"
#include "decode/decode_config.h"
#include "decode/mla_config.h"

namespace kernelforge {

namespace {

// at least 256 keys (4 tiles of 64) per split; pipeline fill + warp merge = 2 tiles per CTA; the merge 1
constexpr SplitCost kSplitCost = {256, 2, 1, 128};
constexpr int64_t kSmemPerSm = 227 * 1024;  // sm_80 / sm_90 opt-in per SM

// What the TMA kernel needs of the call's layout: page size >= 16 (a box per page of at least 16 rows
// of 128 bytes: 2 KB per copy; smaller pages keep the cp.async kernel, whose cost does not depend on
// the page size) or the contiguous cache, 16-byte aligned caches with 16-byte multiples below 2^40
// bytes as the strides of the dimensions longer than 1 (validation already asks for the alignment).
std::string tma_layout_unsupported(const DecodeParams& p) {
  if (p.block_table != nullptr && p.page_size < 16) return "needs a page size of at least 16 or a contiguous cache";
  auto bad = [](int64_t stride, int64_t extent) {
    return extent > 1 && (stride <= 0 || (stride * 2) % 16 != 0 || stride * 2 >= (int64_t(1) << 40));
  };
  for (int kv = 0; kv < 2; ++kv) {
    const void* base = kv == 0 ? p.k_cache : p.v_cache;
    const int64_t st = kv == 0 ? p.k_st : p.v_st, sh = kv == 0 ? p.k_sh : p.v_sh, sp = kv == 0 ? p.k_sp : p.v_sp;
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || bad(st, p.page_size) || bad(sh, p.heads_kv) || bad(sp, p.pages))
      return "needs the caches 16-byte aligned with strides of 16-byte multiples below 2^40 bytes";
  }
  return "";
}

// The tile's plan with the key split of the cost model.
DecodePlan tile_plan(const DecodeTile& c, const DecodeParams& p, const DeviceInfo& dev) {
  DecodePlan plan;
  plan.kernel = c.kernel;
  plan.head_dim = c.head_dim;
  plan.rows = c.rows;
  plan.warps = c.warps;
  plan.block_n = decode_tile_block_n(c);
  plan.stages = c.stages;
  const int64_t sms = dev.sm_count > 0 ? dev.sm_count : 1;
  const int64_t smem = decode_tile_smem_bytes(c);
  int64_t resident = kSmemPerSm / (smem + 1024);  // 1 KB per CTA reserved by the hardware
  resident = resident > c.ctas_per_sm ? c.ctas_per_sm : resident;
  resident = resident < 1 ? 1 : resident;
  const int64_t slots = sms * resident;
  const int64_t base = c.kernel == DecodeKernel::kHeadGroup ? int64_t(p.batch) * ceil_div(p.heads_kv, c.warps)
                                                            : int64_t(p.batch) * p.heads_kv * decode_row_tiles(plan, p);
  plan.splits = split_keys(base, slots, p.max_seq_len > 0 ? p.max_seq_len : 1, plan.block_n, kSplitCost);
  return plan;
}

int64_t smem_limit_of(const DeviceInfo& dev) {
  return dev.capability > 0 ? mla_smem_limit(dev.capability) : kSmemPerSm;
}

// The head-group tile for the call: rows <= 16, the largest group of heads the call fills (8 heads
// when Hkv >= 8, else 4), within the device's shared memory; nullptr when none.
const DecodeTile* head_group_tile(const DecodeParams& p, const DeviceInfo& dev) {
  if (p.rows > 16) return nullptr;
  const DecodeTile* pick = nullptr;
  for (const DecodeTile& c : kDecodeTiles)
    if (c.kernel == DecodeKernel::kHeadGroup && c.head_dim == p.head_dim && c.warps <= p.heads_kv &&
        decode_tile_smem_bytes(c) <= smem_limit_of(dev) && (pick == nullptr || c.warps > pick->warps))
      pick = &c;
  return pick;
}

}  // namespace

std::string to_string(const DecodePlan& plan) {
  if (plan.kernel == DecodeKernel::kHeadGroup)
    return "decode_heads d=" + std::to_string(plan.head_dim) + " rows=" + std::to_string(plan.rows) +
           " tile=" + std::to_string(plan.block_n) + " heads=" + std::to_string(plan.warps) +
           " stages=" + std::to_string(plan.stages) + " splits=" + std::to_string(plan.splits);
  const bool tma = plan.kernel == DecodeKernel::kTma;
  return std::string(tma ? "decode_tma" : "decode") + " d=" + std::to_string(plan.head_dim) +
         " rows=" + std::to_string(plan.rows) + " tile=" + std::to_string(plan.block_n) +
         " warps=" + std::to_string(plan.warps) + (tma ? "+1" : "") + " stages=" + std::to_string(plan.stages) +
         " splits=" + std::to_string(plan.splits);
}

std::string decode_tma_unsupported(const DecodeParams& p, const DeviceInfo& dev, bool tma_built) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (!tma_built) return "is not in this build (KF_CUDA_ARCHS without 90a-real)";
  return tma_layout_unsupported(p);
}

DecodePlan plan_decode(const DecodeParams& p, const DeviceInfo& dev, bool tma_built, bool head_group) {
  if (head_group && p.block_table != nullptr && p.page_size == 1) {
    if (const DecodeTile* c = head_group_tile(p, dev)) return tile_plan(*c, p, dev);
  }
  const DecodeKernel kernel =
      decode_tma_unsupported(p, dev, tma_built).empty() ? DecodeKernel::kTma : DecodeKernel::kCpAsync;
  // The row: 16 rows, or 32 when group * Lq needs them and the head dim has a 32-row tile.
  const DecodeTile* pick = nullptr;
  for (const DecodeTile& c : kDecodeTiles) {
    if (c.kernel != kernel || c.head_dim != p.head_dim || c.use != DecodeTileUse::kDefault) continue;
    if (pick == nullptr || (pick->rows < p.rows && c.rows > pick->rows)) pick = &c;
  }
  if (pick == nullptr) {  // no kernel for this head dim: check_decode_plan says so
    DecodePlan plan;
    plan.head_dim = p.head_dim;
    return plan;
  }
  // The use, by shape (dev/decode_variants.cu on the H100, GQA 32/8, d128, each tile at its best
  // split): 4 warps x 3 stages is the best at b16 x kv4k and b64 x kv2k (2244 / 2561 GB/s against
  // 2194 / 2300 for 8 x 2). A grid of few (sequence, kv head) pairs runs on splits alone, and
  // b1 x kv8k (8 pairs on 132 SMs) gains 11 % with 8 warps x 2 stages (1033 vs 929 GB/s): half as
  // many CTAs, each with 128 keys per stage, so fewer pipeline fills and warp merges. Page size 1
  // gains 14 % at b16 x kv4k with 4 warps x 2 stages (1873 vs 1640 GB/s): 72 KB of shared memory
  // lets three CTAs share an SM, and every row is its own scattered 256-byte read, so more rows in
  // flight per SM beat a deeper ring. "Few pairs": at most a quarter of the SMs (b1-b4 at 8 kv heads
  // on 132 SMs); a small grid wins over page size 1 (its latency is the larger cost; not measured
  // together). The TMA kernel takes the same uses (its small-grid tile: 8 + 1 warps, not measured;
  // page size 1 never reaches it).
  const int64_t sms = dev.sm_count > 0 ? dev.sm_count : 1;
  const int64_t pairs = int64_t(p.batch) * p.heads_kv;
  DecodeTileUse use = DecodeTileUse::kDefault;
  if (pairs * 4 <= sms)
    use = DecodeTileUse::kSmallGrid;
  else if (p.block_table != nullptr && p.page_size == 1)
    use = DecodeTileUse::kPage1;
  // (only where the device's opt-in shared memory per block holds it: 140 KB is more than sm_86 / sm_89 give)
  const int64_t smem_limit = smem_limit_of(dev);
  for (const DecodeTile& c : kDecodeTiles)
    if (use != DecodeTileUse::kDefault && c.use == use && c.kernel == kernel && c.head_dim == pick->head_dim &&
        c.rows == pick->rows && decode_tile_smem_bytes(c) <= smem_limit)
      pick = &c;
  return tile_plan(*pick, p, dev);
}

std::vector<DecodePlan> decode_candidate_plans(const DecodeParams& p, const DeviceInfo& dev, bool tma_built) {
  const bool tma = decode_tma_unsupported(p, dev, tma_built).empty();
  std::vector<DecodePlan> plans;
  for (const DecodeTile& c : kDecodeTiles) {
    const bool runs = c.kernel == DecodeKernel::kCpAsync || (c.kernel == DecodeKernel::kTma && tma) ||
                      (c.kernel == DecodeKernel::kHeadGroup && p.rows <= 16);
    if (c.head_dim == p.head_dim && runs && decode_tile_smem_bytes(c) <= smem_limit_of(dev))
      plans.push_back(tile_plan(c, p, dev));
  }
  return plans;
}

int split_keys(int64_t base_ctas, int64_t slots, int64_t keys, int64_t block_n, const SplitCost& cost) {
  int64_t max_s = ceil_div(keys, cost.min_split_keys);
  max_s = max_s < 1 ? 1 : (max_s > cost.max_splits ? cost.max_splits : max_s);
  int64_t best_s = 1, best_cost = -1;
  for (int64_t s = 1; s <= max_s; ++s) {
    const int64_t waves = ceil_div(base_ctas * s, slots);
    const int64_t tiles = ceil_div(ceil_div(keys, s), block_n);
    const int64_t c = waves * (tiles + cost.cta_overhead) + (s > 1 ? cost.merge : 0);
    if (best_cost < 0 || c < best_cost) best_cost = c, best_s = s;
  }
  return int(best_s);
}

Status check_decode_plan(const DecodePlan& plan, const DecodeParams& p) {
  const std::string where = "decode_attention: plan " + to_string(plan);
  if (plan.head_dim != p.head_dim)
    return Status::Invalid(where + " is for head dim " + std::to_string(plan.head_dim) + ", the call has " +
                           std::to_string(p.head_dim));
  bool built = false;
  for (const DecodeTile& c : kDecodeTiles)
    built = built || (c.kernel == plan.kernel && c.head_dim == plan.head_dim && c.rows == plan.rows &&
                      c.warps == plan.warps && c.stages == plan.stages && plan.block_n == decode_tile_block_n(c));
  if (!built) return Status::Invalid(where + ": no such kernel is built");
  if (plan.kernel == DecodeKernel::kHeadGroup && p.rows > 16)
    return Status::Invalid(where +
                           ": the head-group kernel takes at most 16 query rows per kv head (group x Lq), "
                           "the call has " +
                           std::to_string(p.rows));
  if (plan.kernel == DecodeKernel::kTma) {  // the device and the build: the launcher (the kernel's image)
    const std::string why = tma_layout_unsupported(p);
    if (!why.empty()) return Status::NotSupported(where + ": the TMA kernel " + why);
  }
  if (plan.splits < 1 || plan.splits > 65535) return Status::Invalid(where + ": splits must be 1 to 65535");
  if (int64_t(decode_row_tiles(plan, p)) * p.heads_kv > 65535)
    return Status::Invalid(where + ": kv heads x row tiles (" + std::to_string(decode_row_tiles(plan, p)) + " x " +
                           std::to_string(p.heads_kv) + ") exceed the grid's 65535");
  return Status::Ok();
}

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }
size_t partial_o_bytes(const DecodePlan& plan, const DecodeParams& p) {
  return align256(size_t(p.batch) * p.q_len * p.heads_q * plan.splits * plan.head_dim * sizeof(float));
}
}  // namespace

size_t decode_workspace_bytes(const DecodePlan& plan, const DecodeParams& p) {
  if (plan.splits <= 1) return 0;
  const size_t rows = size_t(p.batch) * p.q_len * p.heads_q * plan.splits;
  return decode_attention_counter_bytes(p.batch, p.heads_kv) + partial_o_bytes(plan, p) +
         align256(rows * sizeof(float));
}

DecodeWorkspace decode_workspace(const DecodePlan& plan, const DecodeParams& p, void* workspace) {
  char* base = static_cast<char*>(workspace);
  const size_t counters = decode_attention_counter_bytes(p.batch, p.heads_kv);
  DecodeWorkspace w;
  w.counters = reinterpret_cast<int32_t*>(base);
  w.o = reinterpret_cast<float*>(base + counters);
  w.lse = reinterpret_cast<float*>(base + counters + partial_o_bytes(plan, p));
  return w;
}

}  // namespace kernelforge
