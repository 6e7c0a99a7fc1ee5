// The wgmma attention backward's launcher: pass 1, the main kernel (kernels/attention_bwd_wgmma.cuh
// for head dims 64 and 128: TMA maps of q, dout (64-row boxes; a query tile is one or two), k and v
// (128-row boxes) and the float32 dQ accumulator (32 x 64 boxes, for reduce-adds), one CTA per key
// tile and kv head, or per pair of key tiles with the plan's order=paired;
// kernels/attention_bwd_wgmma_cols.cuh for head dims 256/256 and 192/128: 64-row boxes everywhere, one
// CTA per 64-key tile and kv head) and pass 3
// (attention_bwd_passes.cuh), all on `stream` with programmatic dependent launch. Included by
// attention_bwd_wgmma_<dtype>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "attention/attention_bwd_passes.cuh"
#include "attention/attention_bwd_wgmma_launch.h"
#include "attention/attention_tma_map.h"
#include "attention/kernels/attention_bwd_wgmma.cuh"
#include "attention/kernels/attention_bwd_wgmma_cols.cuh"
#include "common/launch.cuh"
#include "common/math.h"
#include "common/occupancy.h"

namespace kernelforge {

namespace attn_bwd {

// The main kernel of head dims kDqk / kDv and its tile: attention_bwd_wgmma (64/64, 128/128) or
// attention_bwd_wgmma_cols (256/256, 192/128: dK, dV and dQ split by columns between the consumers).
template <int kDqk, int kDv, bool kSoftcap, bool kCols_ = kDqk >= 192>
struct BwdWgmmaTile {
  static_assert(kDqk == kDv, "attention_bwd_wgmma: equal head dims");
  static constexpr bool kCols = false;
  static constexpr int kBM = kBwdWgmmaBlockM<kDqk, kSoftcap>, kBN = kBwdWgmmaBlockN;
  static constexpr int kThreads = kBwdWgmmaThreads, kStages = kBwdWgmmaStages;
  static constexpr int kSmemBytes = BwdWgmmaSmem<kDqk, kBM>::kBytes;
};
template <int kDqk, int kDv, bool kSoftcap>
struct BwdWgmmaTile<kDqk, kDv, kSoftcap, true> {
  static constexpr bool kCols = true;
  static constexpr int kBM = kBwdColsBlockM, kBN = kBwdColsBlockN;
  static constexpr int kThreads = kBwdColsThreads, kStages = kBwdColsQStages;
  static constexpr int kSmemBytes = BwdColsSmem<kDqk, kDv>::kBytes;
};

// One instantiation: head dims kDqk / kDv, softcap or not (f.softcap > 0), and the tile that goes
// with them (BwdWgmmaTile: the planner's block_m x block_n).
template <typename T, int kDqk, int kDv, bool kSoftcap>
Status launch_wgmma_dims(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                         void* workspace, cudaStream_t stream) {
  using Tile = BwdWgmmaTile<kDqk, kDv, kSoftcap>;
  constexpr int kBM = Tile::kBM, kBN = Tile::kBN;
  const AttentionParams& f = p.f;
  if (plan.head_dim_qk != kDqk || plan.head_dim_v != kDv || f.head_dim_qk != kDqk || f.head_dim_v != kDv ||
      (f.softcap > 0.0f) != kSoftcap || plan.block_m != kBM || plan.block_n != kBN ||
      plan.warps != Tile::kThreads / 32 || plan.stages != Tile::kStages || plan.splits != 1 ||
      (plan.order != AttentionOrder::kRowMajor && (plan.order != AttentionOrder::kPaired || Tile::kCols)))
    return Status::Invalid(std::string(kName) + ": the wgmma backward kernel has no configuration " + to_string(plan) +
                           (kSoftcap ? " with a softcap" : " without a softcap"));
  // order=paired: a CTA per pair of key tiles t, T - 1 - t of a sequence (the kernel's `paired`); not in
  // the deterministic mode, whose order of dQ additions needs one key tile per CTA (check_bwd_plan
  // rejects the combination; the kernel's comment has why).
  const bool paired = plan.order == AttentionOrder::kPaired;
  if (paired && p.deterministic)
    return Status::Invalid(std::string(kName) + ": plan " + to_string(plan) + " is not for the deterministic mode");
  const void* kernel = nullptr;  // the other kernel of the pair is not instantiated for this head dim
  if constexpr (Tile::kCols)
    kernel = reinterpret_cast<const void*>(attention_bwd_wgmma_cols<T, kDqk, kDv, kSoftcap>);
  else
    kernel = reinterpret_cast<const void*>(attention_bwd_wgmma<T, kDqk, kBM, kSoftcap>);
  if (kernel_binary_version(kernel) != 90)
    return Status::NotSupported(std::string(kName) +
                                ": the wgmma backward kernel needs an sm_90 device and a build with 90a-real");

  const AttnBwdWs ws = workspace_regions(plan, p, workspace);
  Status st = launch_preprocess<T>(p, ws, plan.block_m, dev, stream);
  if (!st.ok()) return st;

  const int64_t k_tiles = ceil_div(f.seqlen_k, int64_t(kBN));
  if (k_tiles > 0 && f.heads_kv > 0 && f.batch > 0) {
    // varlen: one batch of all tokens; a tile's rows start at cu_seqlens[b] (rows past the end are masked).
    const int64_t batch = f.varlen ? 1 : f.batch;
    const int64_t rows_q = f.varlen ? f.total_q : f.seqlen_q, rows_k = f.varlen ? f.total_k : f.seqlen_k;
    CUtensorMap tq, tdo, tk, tv, tdq;
    st = encode_attention_map<T>(&tk, f.k, kDqk, rows_k, f.heads_kv, batch, f.k_ss, f.k_sh, f.k_sb, kBN, "k", kName);
    if (!st.ok()) return st;
    st = encode_attention_map<T>(&tv, f.v, kDv, rows_k, f.heads_kv, batch, f.v_ss, f.v_sh, f.v_sb, kBN, "v", kName);
    if (!st.ok()) return st;
    if (rows_q == 0) {
      // No query row: no Q / dO load or dQ reduce-add is issued (every key tile writes zeros); the maps
      // only need to be valid.
      tq = tk;
      tdo = tk;
      tdq = tk;
    } else {
      // The dQ accumulator's rows are numbered over the batch (attention_bwd_workspace.h).
      st = encode_dq_acc_map(&tdq, ws.dq_acc, kDqk, f.total_q, f.heads_q, kBwdWgmmaBoxRows, kName);
      if (!st.ok()) return st;
      st = encode_attention_map<T>(&tq, f.q, kDqk, rows_q, f.heads_q, batch, f.q_ss, f.q_sh, f.q_sb, kBwdWgmmaBoxRows,
                                   "q", kName);
      if (!st.ok()) return st;
      st = encode_attention_map<T>(&tdo, p.dout, kDv, rows_q, f.heads_q, batch, p.do_ss, p.do_sh, p.do_sb,
                                   kBwdWgmmaBoxRows, "dout", kName);
      if (!st.ok()) return st;
    }
    const int64_t grid_x = paired ? ceil_div(k_tiles, int64_t(2)) : k_tiles;
    Launch l(dim3(unsigned(grid_x), unsigned(f.heads_kv), unsigned(f.batch)), dim3(Tile::kThreads),
             size_t(Tile::kSmemBytes), stream, use_pdl(dev));
    st = cuda_status(ensure_smem_limit(kernel, size_t(Tile::kSmemBytes)), kName,
                     "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    if (!st.ok()) return st;
    if constexpr (Tile::kCols)
      st = launched(l(attention_bwd_wgmma_cols<T, kDqk, kDv, kSoftcap>, tq, tk, tv, tdo, tdq, p, ws), kName);
    else
      st = launched(l(attention_bwd_wgmma<T, kDqk, kBM, kSoftcap>, tq, tk, tv, tdo, tdq, p, ws, paired), kName);
    if (!st.ok()) return st;
  }
  return launch_dq_convert<T>(p, ws, dev, stream);
}

// The instantiation of head dims kDqk / kDv for the call's softcap (a template parameter of the kernels).
template <typename T, int kDqk, int kDv>
Status launch_wgmma_softcap(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                            void* workspace, cudaStream_t stream) {
  return p.f.softcap > 0.0f ? launch_wgmma_dims<T, kDqk, kDv, true>(plan, p, dev, workspace, stream)
                            : launch_wgmma_dims<T, kDqk, kDv, false>(plan, p, dev, workspace, stream);
}

}  // namespace attn_bwd

template <typename T>
Status launch_attention_bwd_wgmma(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                                  void* workspace, cudaStream_t stream) {
  const int dqk = plan.head_dim_qk, dv = plan.head_dim_v;
  if (dqk == 64 && dv == 64) return attn_bwd::launch_wgmma_softcap<T, 64, 64>(plan, p, dev, workspace, stream);
  if (dqk == 128 && dv == 128) return attn_bwd::launch_wgmma_softcap<T, 128, 128>(plan, p, dev, workspace, stream);
  if (dqk == 256 && dv == 256) return attn_bwd::launch_wgmma_softcap<T, 256, 256>(plan, p, dev, workspace, stream);
  if (dqk == 192 && dv == 128) return attn_bwd::launch_wgmma_softcap<T, 192, 128>(plan, p, dev, workspace, stream);
  return Status::Invalid(std::string(attn_bwd::kName) + ": the wgmma backward kernel has no head dims " +
                         std::to_string(plan.head_dim_qk) + "/" + std::to_string(plan.head_dim_v));
}

}  // namespace kernelforge
