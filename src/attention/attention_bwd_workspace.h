// The workspace of the mma attention backward (kind kBwdMma): its regions, computed from the plan's
// query tile and the problem's shapes, used by the planner (bwd_workspace_bytes) and the launcher
// (attention_bwd_mma_launch.cuh) alike. Every region starts 256-byte aligned.
//
// Rows are numbered over the batch: query row r of sequence b is qrow = b * Sq + r (kBSHD, kBHSD)
// or cu_seqlens_q[b] + r (kVarlen); total_q rows in all.
//   dq_acc  float32 [Hq][total_q][Dqk]  dQ / scale, summed over the key tiles (zeroed by pass 1)
//   lse2    float32 [Hq][total_q]       lse * log2(e), +inf where lse = -inf (the row contributes 0)
//   dsum    float32 [Hq][total_q]       D = dout . out
//   sem     int32   [B][Hq][q_tiles]    deterministic only: key tiles that have added their dQ to
//                                       query tile (b, h, m); q_tiles = ceil(Sq / block_m)
//   sinks   float32 [Hq][B * pre_tiles] sinks only: pass 1's per-block partial sums of dsinks
//                                       (pre_tiles = ceil(Sq / kAttnBwdPreRows)), summed in order
#pragma once

#include <cstddef>
#include <cstdint>

namespace kernelforge {

// Query rows per block of the preprocessing and dq conversion passes.
constexpr int kAttnBwdPreRows = 64;

struct AttnBwdWorkspace {
  size_t dq_acc = 0;  // byte offsets
  size_t lse2 = 0;
  size_t dsum = 0;
  size_t sem = 0;         // valid when deterministic
  size_t sinks = 0;       // valid with sinks
  size_t bytes = 0;       // total
  int64_t q_tiles = 0;    // main kernel query tiles per sequence
  int64_t pre_tiles = 0;  // preprocessing blocks per sequence
};

inline size_t attn_bwd_align256(size_t n) { return (n + 255) / 256 * 256; }

// seqlen_q: every sequence's length, or the varlen upper bound.
inline AttnBwdWorkspace attn_bwd_workspace(int block_m, int64_t batch, int64_t heads_q, int64_t seqlen_q,
                                           int64_t total_q, int64_t head_dim_qk, bool deterministic, bool sinks) {
  AttnBwdWorkspace w;
  w.q_tiles = block_m > 0 ? (seqlen_q + block_m - 1) / block_m : 0;
  w.pre_tiles = (seqlen_q + kAttnBwdPreRows - 1) / kAttnBwdPreRows;
  size_t off = 0;
  auto region = [&](size_t bytes) {
    const size_t at = off;
    off += attn_bwd_align256(bytes);
    return at;
  };
  w.dq_acc = region(size_t(heads_q) * size_t(total_q) * size_t(head_dim_qk) * 4);
  w.lse2 = region(size_t(heads_q) * size_t(total_q) * 4);
  w.dsum = region(size_t(heads_q) * size_t(total_q) * 4);
  w.sem = region(deterministic ? size_t(batch) * size_t(heads_q) * size_t(w.q_tiles) * 4 : 0);
  w.sinks = region(sinks ? size_t(heads_q) * size_t(batch) * size_t(w.pre_tiles) * 4 : 0);
  w.bytes = off;
  return w;
}

// The regions as device pointers (kernel argument); sem / sinks are null when the call has none.
struct AttnBwdWs {
  float* dq_acc = nullptr;
  float* lse2 = nullptr;
  float* dsum = nullptr;
  int32_t* sem = nullptr;
  float* sinks = nullptr;
  int64_t q_tiles = 0;
  int64_t pre_tiles = 0;
};

}  // namespace kernelforge
