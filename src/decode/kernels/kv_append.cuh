// kv_append: writes the new keys and values k, v [B, Lq, Hkv, D] into the caches at positions
// seq_lens[b] - Lq + t (layouts: include/kernelforge/decode.h). One (sequence, token, kv head) row
// per group of D / kVec threads, kVec elements per thread (8: 16-byte copies when every pointer and
// stride allows it). Rows whose position is outside [0, capacity) or whose page is out of range are
// skipped: nothing is written out of bounds. Bytes: 4 * B * Lq * Hkv * D * sizeof(T) (read + write).
// PDL (common/launch.cuh): everything it reads may be the previous kernel's output, so it waits first;
// `trigger` (the whole grid is resident, as at a decode step) lets the next kernel launch at once.
#pragma once

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "decode/decode_problem.h"

namespace kernelforge {
namespace decode {

constexpr int kAppendThreads = 256;

template <int kVec>
__global__ void __launch_bounds__(kAppendThreads) kv_append_kernel(KvAppendParams p, bool trigger) {
  using W = typename RawVec<2 * kVec>::type;  // kVec 16-bit elements in one word
  const int per_row = p.head_dim / kVec;
  const int64_t idx = int64_t(blockIdx.x) * kAppendThreads + threadIdx.x;
  const int64_t rows = int64_t(p.batch) * p.q_len * p.heads_kv;
  pdl_wait();
  if (trigger) pdl_trigger();
  if (idx >= rows * per_row) return;
  const int64_t row = idx / per_row;
  const int c = int(idx % per_row) * kVec;
  const int h = int(row % p.heads_kv);
  const int t = int((row / p.heads_kv) % p.q_len);
  const int b = int(row / (int64_t(p.heads_kv) * p.q_len));
  const int32_t pos = p.seq_lens[b] - p.q_len + t;
  if (pos < 0 || pos >= p.capacity) return;
  int32_t page = b, prow = pos;
  if (p.block_table != nullptr) {
    page = p.block_table[b * p.bt_sb + (pos >> p.page_shift)];
    prow = pos & (p.page_size - 1);
    if (page < 0 || page >= p.pages) return;
  }
  const uint16_t* ks = static_cast<const uint16_t*>(p.k) + b * p.kn_sb + t * p.kn_st + h * p.kn_sh + c;
  const uint16_t* vs = static_cast<const uint16_t*>(p.v) + b * p.vn_sb + t * p.vn_st + h * p.vn_sh + c;
  uint16_t* kd = static_cast<uint16_t*>(p.k_cache) + page * p.k_sp + prow * p.k_st + h * p.k_sh + c;
  uint16_t* vd = static_cast<uint16_t*>(p.v_cache) + page * p.v_sp + prow * p.v_st + h * p.v_sh + c;
  *reinterpret_cast<W*>(kd) = *reinterpret_cast<const W*>(ks);
  *reinterpret_cast<W*>(vd) = *reinterpret_cast<const W*>(vs);
}

}  // namespace decode
}  // namespace kernelforge
