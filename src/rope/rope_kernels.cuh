// RoPE kernel: rotate the first R columns of every head of q and k (pairs (i, i + R/2) or
// (2i, 2i + 1)) by the token's cos/sin row, pass columns R..D-1 through; forward and backward
// (formulas in include/kernelforge/rope.h).
//
// Napkin math (H100 SXM 80 GB: ~3.0 TB/s device-to-device copy, 132 SMs, 50 MB L2):
//   bytes = read q, k + write q_out, k_out = 2 · B·S·(Hq + Hk)·D · sizeof(T)  (cos/sin: B·S·R or
//   S·R values, read once per token per thread column from L1/L2, not per head).
//   B=4, S=4096, Hq=32, Hk=8, D=128 bf16: 2 · 16384·40·128·2 B = 335.5 MB -> 112 µs at 3.0 TB/s,
//   124 µs at the 2.7 TB/s target. B=1, S=16384: the same bytes. In place (no passthrough
//   columns): identical traffic (each element is read and written once either way).
//   cos/sin float32 [S, R]: 4096·128·4·2 = 4 MB, L2-resident; the per-thread loads of one token's
//   cos/sin row are reused across all heads the thread handles (2 at the shapes above).
//   Arithmetic: 2 FMAs + 2 MULs per pair: nothing next to the bytes.
// Design: one block column per token (tz tokens per block when a token is small). blockDim =
// (tx, ty, tz): tx threads over the row's work units, ty over the Hq + Hk heads of the token (q's
// heads first, then k's: GQA in one launch), tz tokens. A rotation unit is kVec pairs: for rotate-
// half two kVec-vectors at columns c and c + R/2 (element j of one pairs with element j of the
// other), for the interleaved pairing one kVec-vector holding kVec/2 adjacent pairs (with kVec = 1:
// two single elements 2i, 2i + 1). A passthrough unit is one kVec-vector of columns >= R (copied,
// skipped when the tensor is rotated in place). A thread loads its unit's cos/sin once per token
// (float32 registers), then walks its heads two at a time (loads of both first: 2-4 × 16 B in
// flight per thread, ~50 KB per SM at 5 blocks of 160 threads; Little's law asks ~14 KB).
//   B=4 S=4096 Hq=32 Hk=8 D=128 bf16 rotate-half: 8 units (8 pairs of 16 B vectors), ty = 20 (2
//   heads each), block 160 threads, grid 16384 blocks.
// Vector width, once per launch: 16 B when every q/k/out base pointer is 16-byte aligned, every
// (batch, seq, head) stride a multiple of 16 B, the cos/sin pointers and row strides too, and
// R/2 (rotate-half) or R (interleaved) a multiple of the vector; otherwise one element per access.
// A head_dim that is not a multiple of the vector ends with a partial passthrough vector done
// element by element. Offsets are 64-bit.
// Math: float32; out = fmaf(x_partner, ±sin, x · cos), rounded once to T.
// Position ids out of range: cos/sin are not read; the token's rotated columns become NaN.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "rope/rope_problem.h"

namespace kernelforge {
namespace rope_detail {

// ---- tuning (first guesses from the napkin math above; to be measured, see notes/rope.md) ------
constexpr int kThreads = 256;    // threads per block at most
#ifndef KF_ROPE_HEADS_IN_FLIGHT  // build-time switch for sweeps (-DKF_ROPE_HEADS_IN_FLIGHT=4 via KF_CMAKE_ARGS)
#define KF_ROPE_HEADS_IN_FLIGHT 4
#endif
constexpr int kHeadsInFlight = KF_ROPE_HEADS_IN_FLIGHT;  // heads a thread loads before it computes
constexpr int64_t kMaxGrid = 1 << 30;                    // blocks; more tokens loop
constexpr int kMaxBlockZ = 64;                           // CUDA's limit for blockDim.z
// plan(): heads per thread (KF_TUNE rope_hpt), in rounds of kHeadsInFlight. Measured (H100, bf16,
// 40 heads of 128, 16384 tokens, notes/rope.md): 1 (160-thread blocks of one token) 2610 GB/s, 4
// 2763, 8 with 4 in flight 2762 (interleaved 2741): more bytes per thread and several tokens per
// block. Under kFewTokens tokens (decode) a thread takes as few heads as fit, for latency.
constexpr int kMinHeadsPerThread = 8;
constexpr int64_t kFewTokens = 1024;

// kVec values of cos/sin (dtype CS) at p as float32. CS = float with kVec >= 4: 16-byte loads;
// CS = T (16-bit) with kVec = 8: one 16-byte load.
template <typename CS, int kVec>
__device__ __forceinline__ void load_cs(const CS* p, float (&f)[kVec]) {
  if constexpr (kVec == 1) {
    f[0] = to_float(p[0]);
  } else if constexpr (std::is_same<CS, float>::value) {
    static_assert(kVec % 4 == 0, "float32 cos/sin: whole float4 vectors");
#pragma unroll
    for (int k = 0; k < kVec / 4; ++k) {
      const float4 v = *reinterpret_cast<const float4*>(p + 4 * k);
      f[4 * k] = v.x, f[4 * k + 1] = v.y, f[4 * k + 2] = v.z, f[4 * k + 3] = v.w;
    }
  } else {
    const Vec<CS, kVec> v = load_vec<CS, kVec>(p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = v.get(j);
  }
}

// Input and output of head h (q's heads first, then k's) of token (b, s). Selects, not an indexed
// parameter array (which the compiler would copy to local memory).
template <typename T>
struct HeadPtrs {
  const T* in;
  T* out;
  bool inplace;
};
template <typename T>
__device__ __forceinline__ HeadPtrs<T> head_ptrs(const RopeParams& p, int h, int64_t b, int64_t s) {
  const bool isk = h >= p.t[0].heads;
  const int64_t hh = isk ? h - p.t[0].heads : h;
  const RopeHeads& a = p.t[0];
  const RopeHeads& k = p.t[1];
  const T* in = static_cast<const T*>(isk ? k.in : a.in) + b * (isk ? k.in_sb : a.in_sb) +
                s * (isk ? k.in_ss : a.in_ss) + hh * (isk ? k.in_sh : a.in_sh);
  T* out = static_cast<T*>(isk ? k.out : a.out) + b * (isk ? k.out_sb : a.out_sb) + s * (isk ? k.out_ss : a.out_ss) +
           hh * (isk ? k.out_sh : a.out_sh);
  return {in, out, isk ? k.inplace : a.inplace};
}

// ---- kernel ------------------------------------------------------------------------------------
// For each pair (a, b) with cos c and "effective sin" e (forward: e_a = -sin_a, e_b = sin_b;
// backward: e_a = sin_b, e_b = -sin_a):  out_a = x_a c_a + x_b e_a,  out_b = x_b c_b + x_a e_b.
template <typename T, typename CS, bool kInterleaved, int kVec>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeParams p, const int units_rot, const int units) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    constexpr bool kPacked = kInterleaved && kVec > 1;  // the pairs lie inside one vector
    using V = Vec<T, kVec>;
    const int heads = p.t[0].heads + p.t[1].heads;
    const int R = p.rot_dim, D = p.head_dim;
    const int64_t tokens = p.batch * p.seq;
    const int ty = int(blockDim.y);
    const CS* cos_base = static_cast<const CS*>(p.cos);
    const CS* sin_base = static_cast<const CS*>(p.sin);
    for (int64_t tok = int64_t(blockIdx.x) * blockDim.z + threadIdx.z; tok < tokens;
         tok += int64_t(gridDim.x) * blockDim.z) {
      // 32-bit division where it fits (the 64-bit one is a ~100-instruction subroutine per token)
      const int64_t b = tokens <= UINT32_MAX ? int64_t(uint32_t(tok) / uint32_t(p.seq)) : tok / p.seq;
      const int64_t s = tok - b * p.seq;
      bool bad = false;
      const CS *cosr, *sinr;
      if (p.pos != nullptr) {
        const int64_t v = p.pos[b * p.pos_sb + s * p.pos_ss];
        bad = v < 0 || v >= p.max_pos;
        const int64_t row = bad ? 0 : v;
        cosr = cos_base + row * p.cos_ss;
        sinr = sin_base + row * p.sin_ss;
      } else {
        cosr = cos_base + b * p.cos_sb + s * p.cos_ss;
        sinr = sin_base + b * p.sin_sb + s * p.sin_ss;
      }
      for (int u = threadIdx.x; u < units; u += blockDim.x) {
        if (u < units_rot) {
          // columns of the unit: vector a at ca, vector b at cb (cb == ca when packed)
          const int ca = kPacked ? u * kVec : (kInterleaved ? 2 * u : u * kVec);
          const int cb = kPacked ? ca : (kInterleaved ? ca + 1 : ca + R / 2);
          float ca_[kVec], cb_[kVec], ea[kVec], eb[kVec];
          if (bad) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) ca_[j] = cb_[j] = ea[j] = eb[j] = __int_as_float(0x7fffffff);
          } else if constexpr (kPacked) {
            float sv[kVec];
            load_cs<CS, kVec>(cosr + ca, ca_);
            load_cs<CS, kVec>(sinr + ca, sv);
#pragma unroll
            for (int j = 0; j < kVec; j += 2) {  // pair (j, j + 1): ea/eb hold e of the first/second member
              ea[j] = p.backward ? sv[j + 1] : -sv[j];
              eb[j] = p.backward ? -sv[j] : sv[j + 1];
              cb_[j] = ca_[j + 1];
              ea[j + 1] = eb[j + 1] = cb_[j + 1] = 0.f;  // unused
            }
          } else {
            float sa[kVec], sb[kVec];
            load_cs<CS, kVec>(cosr + ca, ca_);
            load_cs<CS, kVec>(cosr + cb, cb_);
            load_cs<CS, kVec>(sinr + ca, sa);
            load_cs<CS, kVec>(sinr + cb, sb);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              ea[j] = p.backward ? sb[j] : -sa[j];
              eb[j] = p.backward ? -sa[j] : sb[j];
            }
          }
          for (int h0 = threadIdx.y; h0 < heads; h0 += kHeadsInFlight * ty) {
            V xa[kHeadsInFlight], xb[kHeadsInFlight];
            HeadPtrs<T> hp[kHeadsInFlight];
#pragma unroll
            for (int i = 0; i < kHeadsInFlight; ++i) {  // loads of every head first
              const int h = h0 + i * ty;
              xa[i] = V::zero();
              xb[i] = V::zero();
              if (h < heads) {
                hp[i] = head_ptrs<T>(p, h, b, s);
                xa[i] = load_vec<T, kVec>(hp[i].in + ca);
                if constexpr (!kPacked) xb[i] = load_vec<T, kVec>(hp[i].in + cb);
              }
            }
#pragma unroll
            for (int i = 0; i < kHeadsInFlight; ++i) {
              if (h0 + i * ty >= heads) break;
              if constexpr (kPacked) {
                float o[kVec];
#pragma unroll
                for (int j = 0; j < kVec; j += 2) {
                  const float x0 = xa[i].get(j), x1 = xa[i].get(j + 1);
                  o[j] = fmaf(x1, ea[j], x0 * ca_[j]);
                  o[j + 1] = fmaf(x0, eb[j], x1 * cb_[j]);
                }
                store_vec<T, kVec>(hp[i].out + ca, V::from(o));
              } else {
                float oa[kVec], ob[kVec];
#pragma unroll
                for (int j = 0; j < kVec; ++j) {
                  const float x0 = xa[i].get(j), x1 = xb[i].get(j);
                  oa[j] = fmaf(x1, ea[j], x0 * ca_[j]);
                  ob[j] = fmaf(x0, eb[j], x1 * cb_[j]);
                }
                store_vec<T, kVec>(hp[i].out + ca, V::from(oa));
                store_vec<T, kVec>(hp[i].out + cb, V::from(ob));
              }
            }
          }
        } else {  // passthrough columns R..D-1
          const int c = R + (u - units_rot) * kVec;
          for (int h = threadIdx.y; h < heads; h += ty) {
            const HeadPtrs<T> hp = head_ptrs<T>(p, h, b, s);
            if (hp.inplace) continue;
            if (c + kVec <= D) {
              store_vec<T, kVec>(hp.out + c, load_vec<T, kVec>(hp.in + c));
            } else {
              for (int k = c; k < D; ++k) hp.out[k] = hp.in[k];
            }
          }
        }
      }
    }
  }
}

// ---- launch ------------------------------------------------------------------------------------
// True when 16-byte vectors of T (kVec = 16 / sizeof(T)) fit every pointer, stride and the pairing.
template <typename T, typename CS>
bool can_vectorize(const RopeParams& p) {
  constexpr int64_t kVec = 16 / int64_t(sizeof(T));
  const int64_t half = p.rot_dim / 2;
  if ((p.interleaved ? p.rot_dim : half) % kVec != 0) return false;
  uintptr_t bits = reinterpret_cast<uintptr_t>(p.cos) | reinterpret_cast<uintptr_t>(p.sin);
  int64_t strides = p.cos_sb | p.cos_ss | p.sin_sb | p.sin_ss;  // in CS elements: kVec of them >= 16 B
  for (int i = 0; i < 2; ++i) {
    const RopeHeads& h = p.t[i];
    if (h.heads == 0) continue;
    bits |= reinterpret_cast<uintptr_t>(h.in) | reinterpret_cast<uintptr_t>(h.out);
    strides |= h.in_sb | h.in_ss | h.in_sh | h.out_sb | h.out_ss | h.out_sh;
  }
  return bits % 16 == 0 && strides % kVec == 0;
}

struct Plan {
  dim3 grid, block;
  int units_rot, units;
};

inline Plan plan(const RopeParams& p, int vec) {
  const int R = p.rot_dim, D = p.head_dim;
  const bool split_scalar = p.interleaved && vec == 1;
  const int units_rot = p.interleaved ? (split_scalar ? R / 2 : R / vec) : (R / 2) / vec;
  const bool all_inplace = p.t[0].inplace && (p.t[1].heads == 0 || p.t[1].inplace);
  const int units_pass = all_inplace ? 0 : int(ceil_div(D - R, vec));
  const int units = units_rot + units_pass;
  const int heads = p.t[0].heads + p.t[1].heads;
  const int tx = std::min(units, kThreads);
  const int max_ty = std::max(1, kThreads / tx);
  // heads per thread, balanced: at least what fits the block, at least kMinHeadsPerThread
  const int64_t tokens = p.batch * p.seq;
  const int hpt = tokens < kFewTokens ? 1 : tune("rope_hpt", kMinHeadsPerThread);
  const int64_t per_thread = std::max<int64_t>(ceil_div(heads, max_ty), hpt);
  const int ty = int(ceil_div(heads, per_thread));
  const int tz = std::min({kMaxBlockZ, tune("rope_tz", kMaxBlockZ), std::max(1, kThreads / (tx * ty))});  // tokens
  const int64_t blocks = std::min<int64_t>(ceil_div(tokens, tz), kMaxGrid);
  return {dim3(unsigned(blocks)), dim3(unsigned(tx), unsigned(ty), unsigned(tz)), units_rot, units};
}

template <typename T, typename CS, bool kInterleaved, int kVec>
Status launch(const RopeParams& p, cudaStream_t stream) {
  const Plan g = plan(p, kVec);
  DeviceInfo dev;
  dev.capability = p.capability;
  const bool pdl = use_pdl(dev);
  RopeParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && int64_t(g.grid.x) <= p.sm_count;
  Launch l(g.grid, g.block, 0, stream, pdl);
  return launched(l(rope_kernel<T, CS, kInterleaved, kVec>, q, g.units_rot, g.units),
                  p.backward ? "apply_rope_backward" : "apply_rope");
}

template <typename T, typename CS>
Status with_vec(const RopeParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / int(sizeof(T));
  if (can_vectorize<T, CS>(p))
    return p.interleaved ? launch<T, CS, true, kVec>(p, stream) : launch<T, CS, false, kVec>(p, stream);
  return p.interleaved ? launch<T, CS, true, 1>(p, stream) : launch<T, CS, false, 1>(p, stream);
}

template <typename T>
Status dispatch(const RopeParams& p, bool cs_float, cudaStream_t stream) {
  if (p.batch * p.seq == 0 || p.t[0].heads + p.t[1].heads == 0) return Status::Ok();
  if constexpr (std::is_same<T, float>::value) {
    (void)cs_float;
    return with_vec<float, float>(p, stream);
  } else {
    return cs_float ? with_vec<T, float>(p, stream) : with_vec<T, T>(p, stream);
  }
}

}  // namespace rope_detail

// One definition per dtype, instantiated in rope_<dtype>.cu.
#define KF_ROPE_DEFINE(T)                                                          \
  template <>                                                                      \
  Status launch_rope<T>(const RopeParams& p, bool cs_float, cudaStream_t stream) { \
    return rope_detail::dispatch<T>(p, cs_float, stream);                          \
  }

}  // namespace kernelforge
