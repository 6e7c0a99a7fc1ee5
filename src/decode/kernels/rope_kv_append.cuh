// rope_kv_append: the rotary embedding of the Lq new tokens of each sequence fused into kv_append
// (contract: include/kernelforge/decode.h). Token t of sequence b sits at pos = seq_lens[b] - Lq + t;
// with R = rot_dim, i < R / 2, c = cos[pos, i], s = sin[pos, i] (HF's rotate-half):
//   out[i] = x[i] c - x[i + R/2] s,   out[i + R/2] = x[i + R/2] c + x[i] s,   columns >= R copied.
// q's rotation goes to q_out, k's to its cache row, v is copied to its cache row unchanged.
//
// One row per (sequence, token, head) with the heads in the order q (Hq), k (Hkv), v (Hkv); D / kVec
// threads per row, kVec elements each (8: 16-byte accesses when every pointer and stride allows).
// A q / k thread whose columns start below R / 2 owns the pair vectors at c and c + R / 2 (both read,
// both written: no other thread touches them, so q_out may be q); threads at [R / 2, R) have no work;
// threads at >= R copy (in place: nothing to do). Why this split: every rotation reads its partner
// from the thread's own registers, and one grid serves q, k and v in a single launch.
// Bytes: 2 B Lq (Hq + 2 Hkv) D sizeof(T) + the tables' half rows; at decode sizes the launch and the
// seq_lens -> block_table -> store chain dominate (b64, 32 / 8 heads of 128, bf16: 0.8 MB, < 1 us of
// DRAM time on an H100).
// Out of range: a position outside [0, capacity) or a page outside [0, P) writes no cache row (as
// kv_append); the table row is clamp(pos, 0, max_pos - 1), so no read leaves the tables either.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "decode/decode_problem.h"
#include "decode/kernels/kv_append.cuh"

namespace kernelforge {
namespace decode {

// kVec table values (CS: float32 or the 16-bit T) at p as float32: float4 loads for float32 with
// kVec 8, float2 with kVec 2; one 16- or 4-byte load for 16-bit values.
template <typename CS, int kVec>
__device__ __forceinline__ void load_table(const CS* p, float (&f)[kVec]) {
  if constexpr (kVec == 1) {
    f[0] = to_float(p[0]);
  } else if constexpr (std::is_same<CS, float>::value) {
    if constexpr (kVec == 2) {
      const float2 v = *reinterpret_cast<const float2*>(p);
      f[0] = v.x, f[1] = v.y;
    } else {
#pragma unroll
      for (int k = 0; k < kVec / 4; ++k) {
        const float4 v = *reinterpret_cast<const float4*>(p + 4 * k);
        f[4 * k] = v.x, f[4 * k + 1] = v.y, f[4 * k + 2] = v.z, f[4 * k + 3] = v.w;
      }
    }
  } else {
    const Vec<CS, kVec> v = load_vec<CS, kVec>(p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = v.get(j);
  }
}

template <typename T, typename CS, int kVec>
__global__ void __launch_bounds__(kAppendThreads) rope_kv_append_kernel(RopeKvAppendParams p, bool trigger) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    using V = Vec<T, kVec>;
    using W = typename RawVec<int(sizeof(T)) * kVec>::type;
    const KvAppendParams& a = p.kv;
    const int per_row = a.head_dim / kVec;
    const int heads = p.heads_q + 2 * a.heads_kv;
    const int64_t idx = int64_t(blockIdx.x) * kAppendThreads + threadIdx.x;
    const int64_t rows = int64_t(a.batch) * a.q_len * heads;
    pdl_wait();  // every input, the cos / sin tables too, may be an earlier kernel's output
    if (trigger) pdl_trigger();
    if (idx >= rows * per_row) return;
    const int64_t row = idx / per_row;
    const int c = int(idx - row * per_row) * kVec;
    const int h = int(row % heads);
    const int64_t tok = row / heads;
    const int t = int(tok % a.q_len);
    const int b = int(tok / a.q_len);
    const int half = p.rot_dim / 2;
    const bool is_v = h >= p.heads_q + a.heads_kv;
    const bool rotate = !is_v && c < half;
    if (!is_v && c >= half && c < p.rot_dim) return;  // the second vector of a pair: its first one's thread
    const int32_t pos = a.seq_lens[b] - a.q_len + t;
    const T* src;
    T* dst;
    if (h < p.heads_q) {
      if (!rotate && p.q_inplace) return;  // passthrough columns of an in-place q
      src = static_cast<const T*>(p.q) + b * p.q_sb + t * p.q_st + h * p.q_sh;
      dst = static_cast<T*>(p.q_out) + b * p.qo_sb + t * p.qo_st + h * p.qo_sh;
    } else {
      if (pos < 0 || pos >= a.capacity) return;
      int32_t page = b, prow = pos;
      if (a.block_table != nullptr) {
        page = a.block_table[b * a.bt_sb + (pos >> a.page_shift)];
        prow = pos & (a.page_size - 1);
        if (page < 0 || page >= a.pages) return;
      }
      if (is_v) {
        const int hk = h - p.heads_q - a.heads_kv;
        src = static_cast<const T*>(a.v) + b * a.vn_sb + t * a.vn_st + hk * a.vn_sh;
        dst = static_cast<T*>(a.v_cache) + page * a.v_sp + prow * a.v_st + hk * a.v_sh;
      } else {
        const int hk = h - p.heads_q;
        src = static_cast<const T*>(a.k) + b * a.kn_sb + t * a.kn_st + hk * a.kn_sh;
        dst = static_cast<T*>(a.k_cache) + page * a.k_sp + prow * a.k_st + hk * a.k_sh;
      }
    }
    if (!rotate) {  // v, or a column >= R: copied bit for bit
      *reinterpret_cast<W*>(dst + c) = *reinterpret_cast<const W*>(src + c);
      return;
    }
    const int32_t r = pos < 0 ? 0 : (pos >= p.max_pos ? p.max_pos - 1 : pos);
    float cs[kVec], sn[kVec];
    load_table<CS, kVec>(static_cast<const CS*>(p.cos) + r * p.cos_sp + c, cs);
    load_table<CS, kVec>(static_cast<const CS*>(p.sin) + r * p.sin_sp + c, sn);
    const V x0 = load_vec<T, kVec>(src + c), x1 = load_vec<T, kVec>(src + c + half);
    float o0[kVec], o1[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {  // apply_rope's rotate-half arithmetic (rope/kernels/common.cuh)
      o0[j] = fmaf(x1.get(j), -sn[j], x0.get(j) * cs[j]);
      o1[j] = fmaf(x0.get(j), sn[j], x1.get(j) * cs[j]);
    }
    store_vec<T, kVec>(dst + c, V::from(o0));
    store_vec<T, kVec>(dst + c + half, V::from(o1));
  }
}

}  // namespace decode
}  // namespace kernelforge
