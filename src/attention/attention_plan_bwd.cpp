// The backward planner (see attention_plan.h): the wgmma kernels where they run (sm_90, head dims
// 64/64, 128/128, 256/256 or 192/128, TMA-compatible tensors), otherwise the mma kernel's tile from its compiled tiles
// (kAttnBwdTiles, attention_bwd_mma_config.h) by head dims, the device's shared memory and how many
// blocks the call has; the workspace from attention_bwd_workspace.h.
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <vector>

#include "attention/attention_bwd_mma_config.h"
#include "attention/attention_bwd_workspace.h"
#include "attention/attention_plan.h"
#include "common/device.h"
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

// The wgmma kernels: kernels/attention_bwd_wgmma.cuh, 64 (d128) or 128 (d64) query rows x 128 keys,
// 3 warpgroups, 2 Q / dO stages, head dims 64/64 and 128/128; kernels/attention_bwd_wgmma_cols.cuh,
// 64 query rows x 64 keys, 3 warpgroups, 2 Q stages, head dims 256/256 and 192/128 (dK, dV and dQ
// split by columns between the consumers: 64 keys x all columns of dK and dV do not fit one
// warpgroup's registers next to S, dP and dQ). At
// d64 the 128-row step halves the dQ reduce-add bytes per FLOP and doubles the N of the S and dP
// products (registers allow it there: dK and dV take half of what they take at d128). d64 with a
// softcap takes 64 rows (the d128 step's shape): at 128 its consumers spill. Must equal the kernels'
// kBwdWgmmaBlockM<D, softcap> and kBwdColsBlockM, kBwdWgmmaBlockN and kBwdColsBlockN.
constexpr int wgmma_block_m(int head_dim, bool softcap) { return head_dim == 64 && !softcap ? 128 : 64; }
constexpr int wgmma_block_n(int head_dim_qk) { return head_dim_qk >= 192 ? 64 : 128; }
constexpr int kWgmmaBlockN = 128;  // the paired schedule's key tile (head dims 64 and 128)
constexpr int kWgmmaWarps = 12;
constexpr int kWgmmaStages = 2;

// Why the wgmma kernel cannot run the problem on the device, or an empty string.
std::string wgmma_unsupported(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (pr.elem_bytes != 2) return "needs float16 or bfloat16";
  if (!pr.tma_ok) return "needs 16-byte aligned tensors and strides (TMA)";
  const bool dims =
      (pr.head_dim_qk == pr.head_dim_v && (pr.head_dim_qk == 64 || pr.head_dim_qk == 128 || pr.head_dim_qk == 256)) ||
      (pr.head_dim_qk == 192 && pr.head_dim_v == 128);
  if (!dims) return "has head dims 64/64, 128/128, 256/256 and 192/128 only";
  if (pr.seqlen_q > (int64_t(1) << 30) || pr.seqlen_k > (int64_t(1) << 30) || pr.total_q > (int64_t(1) << 30) ||
      pr.total_k > (int64_t(1) << 30))
    return "needs fewer than 2^30 rows";
  return "";
}

// order: kRowMajor, one key tile per CTA in increasing order, as the mma kernel; kPaired, key tiles t
// and T - 1 - t of a sequence per CTA (see below).
AttentionPlan bwd_wgmma_plan(const AttentionProblem& pr, AttentionOrder order = AttentionOrder::kRowMajor) {
  AttentionPlan p;
  p.kind = AttentionKernel::kBwdWgmma;
  p.head_dim_qk = pr.head_dim_qk;
  p.head_dim_v = pr.head_dim_v;
  p.block_m = wgmma_block_m(pr.head_dim_qk, pr.softcap);
  p.block_n = wgmma_block_n(pr.head_dim_qk);
  p.warps = kWgmmaWarps;
  p.stages = kWgmmaStages;
  p.splits = 1;
  p.order = order;
  return p;
}

// The paired schedule of the wgmma kernel (order=paired): a CTA takes key tiles t and T - 1 - t of
// its sequence (T key tiles; the middle one alone when T is odd) one after the other, so with a
// causal mask (key tile t: T - t query tiles at Sq = Sk and block_m = 128) every CTA takes about T + 1
// query-tile steps and the grid has ceil(T / 2) CTAs per (batch, kv head). Correct for every mask;
// not in the deterministic mode (the kernel's comment has why). The planner chooses it for causal
// calls without a window (windows give every key tile about the same work) when the grid model
// below finishes earlier with it; with KF_ATTN_BWD_PAIRED=1, or by default when kBwdPairedDefault is
// true (KF_ATTN_BWD_PAIRED=0 turns it off). Default off: no faster at the Llama shapes on the H200. It
// is a candidate plan either way, so the GPU tests run it.
constexpr bool kBwdPairedDefault = false;

// The grid model: CTAs dispatched in linear order (blockIdx.x fastest), each onto the SM that frees
// first, one CTA per SM (shared memory and registers allow one); a CTA takes its key tiles' steps
// (query heads x query tiles) plus kTileOverheadSteps per key tile (the K / V load before the first
// step, the dK / dV stores after the last). Pairing halves the CTAs, so it loses where the unpaired
// grid already fits one wave (the longest CTA then grows from T to T + 1 steps plus an overhead) and
// where many waves pack the unpaired grid's uneven CTAs well (its short CTAs fill the last wave);
// the model is run up to kPairedMaxWaves waves of the unpaired grid, above that the grid stays
// unpaired.
constexpr int64_t kTileOverheadSteps = 2;
constexpr int64_t kPairedMaxWaves = 4;

bool paired_enabled() { return env_switch("KF_ATTN_BWD_PAIRED", kBwdPairedDefault); }  // read per plan

// Steps of key tile t of a causal sequence (no window) with sq query and sk key rows: the query
// tiles from the one holding row key0 - (sk - sq) (the first row that sees key0) to the last.
int64_t causal_tile_steps(int64_t t, int64_t sq, int64_t sk, int block_m, int group) {
  const int64_t num_m = ceil_div(sq, int64_t(block_m));
  const int64_t first_row = t * kWgmmaBlockN - (sk - sq);
  if (first_row >= sq) return 0;
  return (num_m - (first_row > 0 ? first_row / block_m : 0)) * group;
}

// Makespan of CTAs of the given costs (in steps), repeated `copies` times in dispatch order, on
// `sms` SMs.
int64_t grid_makespan(const std::vector<int64_t>& cost, int64_t copies, int sms) {
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> free_at;
  for (int i = 0; i < sms; ++i) free_at.push(0);
  int64_t end = 0;
  for (int64_t c = 0; c < copies; ++c)
    for (const int64_t x : cost) {
      const int64_t t = free_at.top() + x;
      free_at.pop();
      free_at.push(t);
      end = t > end ? t : end;
    }
  return end;
}

// Whether the planner pairs: a causal call without a window, not deterministic, whose unpaired grid
// has at most kPairedMaxWaves waves and finishes later in the model than the paired one. varlen: the
// model takes every sequence at the mean lengths (the planner does not read cu_seqlens).
bool paired_preferred(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (!pr.causal || pr.window || pr.deterministic || pr.batch <= 0 || pr.heads_kv <= 0 || dev.sm_count <= 0 ||
      pr.head_dim_qk > 128)
    return false;
  const int64_t sq = pr.varlen ? pr.total_q / pr.batch : pr.seqlen_q;
  const int64_t sk = pr.varlen ? pr.total_k / pr.batch : pr.seqlen_k;
  const int64_t tiles = ceil_div(sk, int64_t(kWgmmaBlockN));
  const int64_t copies = pr.batch * pr.heads_kv;
  if (tiles < 2 || tiles * copies > kPairedMaxWaves * dev.sm_count) return false;
  const int block_m = wgmma_block_m(pr.head_dim_qk, pr.softcap);
  const int group = pr.heads_q / pr.heads_kv;
  std::vector<int64_t> unpaired, paired;
  for (int64_t t = 0; t < tiles; ++t)
    unpaired.push_back(causal_tile_steps(t, sq, sk, block_m, group) + kTileOverheadSteps);
  for (int64_t t = 0; 2 * t < tiles; ++t)
    paired.push_back(unpaired[size_t(t)] + (tiles - 1 - t != t ? unpaired[size_t(tiles - 1 - t)] : 0));
  return grid_makespan(paired, copies, dev.sm_count) < grid_makespan(unpaired, copies, dev.sm_count);
}

bool same_plan(const AttentionPlan& a, const AttentionPlan& b) {
  return a.kind == b.kind && a.head_dim_qk == b.head_dim_qk && a.head_dim_v == b.head_dim_v && a.block_m == b.block_m &&
         a.block_n == b.block_n && a.warps == b.warps && a.stages == b.stages && a.splits == b.splits &&
         a.order == b.order;
}

}  // namespace

AttentionPlan plan_attention_bwd(const AttentionProblem& pr, const DeviceInfo& dev) {
  if (wgmma_unsupported(pr, dev).empty())
    return bwd_wgmma_plan(
        pr, paired_enabled() && paired_preferred(pr, dev) ? AttentionOrder::kPaired : AttentionOrder::kRowMajor);
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
  add(bwd_wgmma_plan(pr, AttentionOrder::kPaired));  // every call but deterministic ones (check_bwd_plan)
  for (const AttnBwdTile& t : kAttnBwdTiles) add(bwd_plan(t));
  return plans;
}

Status check_bwd_plan(const AttentionPlan& plan, const AttentionProblem& pr, const DeviceInfo& dev) {
  const std::string what = "attention_backward: plan " + to_string(plan) + ": ";
  if (plan.kind == AttentionKernel::kBwdWgmma) {
    const std::string why = wgmma_unsupported(pr, dev);
    if (!why.empty()) return Status::NotSupported(what + "the wgmma backward kernel " + why);
    if (plan.order != AttentionOrder::kRowMajor && plan.order != AttentionOrder::kPaired)
      return Status::Invalid(what + "the wgmma backward kernel takes order=row or order=paired");
    if (!same_plan(plan, bwd_wgmma_plan(pr, plan.order)))
      return Status::Invalid(what + "not the wgmma backward configuration (" + to_string(bwd_wgmma_plan(pr)) + ")");
    if (plan.order == AttentionOrder::kPaired && pr.head_dim_qk > 128)
      return Status::Invalid(what +
                             "order=paired is for head dims 64 and 128 (the 256/256 and 192/128 kernel takes "
                             "order=row)");
    if (plan.order == AttentionOrder::kPaired && pr.deterministic)
      return Status::Invalid(what +
                             "order=paired is not for the deterministic mode (its additions to dQ follow one key "
                             "tile per CTA in increasing order)");
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
