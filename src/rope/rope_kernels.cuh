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
// Decode steps (at most kFlatMaxTokens tokens) take the flat kernel instead: a block per token (and
// group of heads), a thread per (head, unit), its x loads and cos/sin loads issued together: one
// memory round trip per call where the token kernel takes two (it loads cos/sin before its head loop).
//
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
// Up to kFlatMaxTokens tokens (decode steps) the flat kernel runs instead: a block per token, a
// thread per (head, unit), every load issued before the first use (KF_TUNE rope_flat_max overrides).
// Measured (H100, bf16, 32/8 heads of 128, CUDA-graph replay, µs per call, flat / token kernel): 1
// token 1.43 / 1.93, 64: 1.65 / 2.06, 256: 2.70 / 2.77, 512: 3.58 / 4.54, 1024: 5.86 / 6.68, 4096:
// 32.0 / 32.3 (notes/rope.md).
constexpr int64_t kFlatMaxTokens = 1024;

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

// Columns of rotation unit u: vector a at *ca, vector b at *cb (cb == ca when the pairs lie inside
// one vector).
template <bool kInterleaved, int kVec>
__device__ __forceinline__ void unit_cols(int u, int R, int* ca, int* cb) {
  constexpr bool kPacked = kInterleaved && kVec > 1;
  *ca = kPacked ? u * kVec : (kInterleaved ? 2 * u : u * kVec);
  *cb = kPacked ? *ca : (kInterleaved ? *ca + 1 : *ca + R / 2);
}

// The cos c and "effective sin" e of a unit's pairs (formula at the kernel), float32; NaN when the
// token's position is out of range (`bad`: cos/sin are not read).
template <typename CS, bool kInterleaved, int kVec>
struct UnitCS {
  float ca[kVec], cb[kVec], ea[kVec], eb[kVec];
  __device__ __forceinline__ void load(const CS* cosr, const CS* sinr, int a, int b, bool backward, bool bad) {
    constexpr bool kPacked = kInterleaved && kVec > 1;
    if (bad) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) ca[j] = cb[j] = ea[j] = eb[j] = __int_as_float(0x7fffffff);
    } else if constexpr (kPacked) {
      float sv[kVec];
      load_cs<CS, kVec>(cosr + a, ca);
      load_cs<CS, kVec>(sinr + a, sv);
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {  // pair (j, j + 1): ea/eb hold e of the first/second member
        ea[j] = backward ? sv[j + 1] : -sv[j];
        eb[j] = backward ? -sv[j] : sv[j + 1];
        cb[j] = ca[j + 1];
        ea[j + 1] = eb[j + 1] = cb[j + 1] = 0.f;  // unused
      }
    } else {
      float sa[kVec], sb[kVec];
      load_cs<CS, kVec>(cosr + a, ca);
      load_cs<CS, kVec>(cosr + b, cb);
      load_cs<CS, kVec>(sinr + a, sa);
      load_cs<CS, kVec>(sinr + b, sb);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        ea[j] = backward ? sb[j] : -sa[j];
        eb[j] = backward ? -sa[j] : sb[j];
      }
    }
  }
};

// out_a = x_a c_a + x_b e_a, out_b = x_b c_b + x_a e_b for the unit's pairs, rounded once to T and
// stored at out + ca (and out + cb).
template <typename T, typename CS, bool kInterleaved, int kVec>
__device__ __forceinline__ void rotate_store(const Vec<T, kVec>& xa, const Vec<T, kVec>& xb,
                                             const UnitCS<CS, kInterleaved, kVec>& c, T* out, int ca, int cb) {
  using V = Vec<T, kVec>;
  if constexpr (kInterleaved && kVec > 1) {
    float o[kVec];
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      const float x0 = xa.get(j), x1 = xa.get(j + 1);
      o[j] = fmaf(x1, c.ea[j], x0 * c.ca[j]);
      o[j + 1] = fmaf(x0, c.eb[j], x1 * c.cb[j]);
    }
    store_vec<T, kVec>(out + ca, V::from(o));
  } else {
    float oa[kVec], ob[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float x0 = xa.get(j), x1 = xb.get(j);
      oa[j] = fmaf(x1, c.ea[j], x0 * c.ca[j]);
      ob[j] = fmaf(x0, c.eb[j], x1 * c.cb[j]);
    }
    store_vec<T, kVec>(out + ca, V::from(oa));
    store_vec<T, kVec>(out + cb, V::from(ob));
  }
}

// The cos/sin rows of token (b, s) (through the position ids when given); *bad when the position is
// out of range (the rows then point at row 0 and must not be read).
template <typename CS>
__device__ __forceinline__ void token_cs(const RopeParams& p, int64_t b, int64_t s, const CS** cosr, const CS** sinr,
                                         bool* bad) {
  const CS* cos_base = static_cast<const CS*>(p.cos);
  const CS* sin_base = static_cast<const CS*>(p.sin);
  *bad = false;
  if (p.pos != nullptr) {
    const int64_t v = p.pos[b * p.pos_sb + s * p.pos_ss];
    *bad = v < 0 || v >= p.max_pos;
    const int64_t row = *bad ? 0 : v;
    *cosr = cos_base + row * p.cos_ss;
    *sinr = sin_base + row * p.sin_ss;
  } else {
    *cosr = cos_base + b * p.cos_sb + s * p.cos_ss;
    *sinr = sin_base + b * p.sin_sb + s * p.sin_ss;
  }
}

// Passthrough unit at column c (>= R) of one head: copied unless rotated in place.
template <typename T, int kVec>
__device__ __forceinline__ void pass_unit(const HeadPtrs<T>& hp, int c, int D) {
  if (hp.inplace) return;
  if (c + kVec <= D) {
    store_vec<T, kVec>(hp.out + c, load_vec<T, kVec>(hp.in + c));
  } else {
    for (int k = c; k < D; ++k) hp.out[k] = hp.in[k];
  }
}

// ---- kernels -----------------------------------------------------------------------------------
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
    for (int64_t tok = int64_t(blockIdx.x) * blockDim.z + threadIdx.z; tok < tokens;
         tok += int64_t(gridDim.x) * blockDim.z) {
      // 32-bit division where it fits (the 64-bit one is a ~100-instruction subroutine per token)
      const int64_t b = tokens <= UINT32_MAX ? int64_t(uint32_t(tok) / uint32_t(p.seq)) : tok / p.seq;
      const int64_t s = tok - b * p.seq;
      bool bad;
      const CS *cosr, *sinr;
      token_cs<CS>(p, b, s, &cosr, &sinr, &bad);
      for (int u = threadIdx.x; u < units; u += blockDim.x) {
        if (u < units_rot) {
          int ca, cb;
          unit_cols<kInterleaved, kVec>(u, R, &ca, &cb);
          UnitCS<CS, kInterleaved, kVec> c;
          // rotate-half: cos/sin are loaded after the first round's x loads, so both are in flight
          // together (loaded before the head loop: 0.5 % slower at 16384 tokens, 5 % at 512 with L2-hot
          // inputs, notes/rope.md). Interleaved keeps the early load: the late one takes 80 registers
          // instead of 64 there (3 blocks per SM instead of 4; not measured).
          bool need_cs = !kInterleaved;
          if constexpr (kInterleaved) c.load(cosr, sinr, ca, cb, p.backward, bad);
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
            if (need_cs) c.load(cosr, sinr, ca, cb, p.backward, bad), need_cs = false;
#pragma unroll
            for (int i = 0; i < kHeadsInFlight; ++i) {
              if (h0 + i * ty >= heads) break;
              rotate_store<T, CS, kInterleaved, kVec>(xa[i], xb[i], c, hp[i].out, ca, cb);
            }
          }
        } else {  // passthrough columns R..D-1
          const int c = R + (u - units_rot) * kVec;
          for (int h = threadIdx.y; h < heads; h += ty) pass_unit<T, kVec>(head_ptrs<T>(p, h, b, s), c, D);
        }
      }
    }
  }
}

// Decode steps (at most kFlatMaxTokens tokens): block (x, y) = (token, group of blockDim.y heads),
// thread (x, y) = (unit, head in the group); no integer division but the token's b = tok / seq. The
// token kernel above loads a token's cos/sin before its head loop, so its x loads wait for them: two
// memory round trips. Here the x loads are issued first and the cos/sin loads right after, with
// nothing between: one round trip (plus the position id's when given). Same arithmetic and rounding.
template <typename T, typename CS, bool kInterleaved, int kVec>
__global__ void __launch_bounds__(kThreads) rope_flat_kernel(const RopeParams p, const int units_rot, const int units) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if (p.trigger) pdl_trigger();
    constexpr bool kPacked = kInterleaved && kVec > 1;
    using V = Vec<T, kVec>;
    const int h = int(blockIdx.y * blockDim.y + threadIdx.y);
    if (h >= p.t[0].heads + p.t[1].heads) return;
    const uint32_t tok = blockIdx.x;
    const int64_t b = tok / uint32_t(p.seq), s = tok - b * p.seq;
    const HeadPtrs<T> hp = head_ptrs<T>(p, h, b, s);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      if (u >= units_rot) {
        pass_unit<T, kVec>(hp, p.rot_dim + (u - units_rot) * kVec, p.head_dim);
        continue;
      }
      int ca, cb;
      unit_cols<kInterleaved, kVec>(u, p.rot_dim, &ca, &cb);
      const V xa = load_vec<T, kVec>(hp.in + ca);
      const V xb = kPacked ? xa : load_vec<T, kVec>(hp.in + cb);
      bool bad;
      const CS *cosr, *sinr;
      token_cs<CS>(p, b, s, &cosr, &sinr, &bad);
      UnitCS<CS, kInterleaved, kVec> c;
      c.load(cosr, sinr, ca, cb, p.backward, bad);
      rotate_store<T, CS, kInterleaved, kVec>(xa, xb, c, hp.out, ca, cb);
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

// The flat kernel's launch for a call of at most kFlatMaxTokens tokens (KF_TUNE rope_flat_max):
// grid (tokens, head groups), block (units, heads per group), at most kThreads threads, the heads
// split evenly over the groups. grid.x == 0: the token kernel runs.
inline Plan flat_plan(const RopeParams& p, int units_rot, int units) {
  const int64_t tokens = p.batch * p.seq;
  if (tokens > tune("rope_flat_max", int(kFlatMaxTokens))) return {dim3(0), dim3(0), units_rot, units};
  const int heads = p.t[0].heads + p.t[1].heads;
  const int tx = std::min(units, kThreads);
  const int groups = int(ceil_div(heads, std::max(1, kThreads / tx)));
  const int hpg = int(ceil_div(heads, groups));                                   // <= kThreads / tx
  if (ceil_div(heads, hpg) > 65535) return {dim3(0), dim3(0), units_rot, units};  // gridDim.y's limit
  return {dim3(unsigned(tokens), unsigned(ceil_div(heads, hpg))), dim3(unsigned(tx), unsigned(hpg)), units_rot, units};
}

template <typename T, typename CS, bool kInterleaved, int kVec>
Status launch(const RopeParams& p, cudaStream_t stream) {
  const Plan g = plan(p, kVec);
  DeviceInfo dev;
  dev.capability = p.capability;
  const bool pdl = use_pdl(dev);
  const char* what = p.backward ? "apply_rope_backward" : "apply_rope";
  RopeParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  const Plan f = flat_plan(p, g.units_rot, g.units);
  if (f.grid.x > 0) {
    q.trigger = pdl && int64_t(f.grid.x) * f.grid.y <= p.sm_count;
    Launch l(f.grid, f.block, 0, stream, pdl);
    return launched(l(rope_flat_kernel<T, CS, kInterleaved, kVec>, q, f.units_rot, f.units), what);
  }
  q.trigger = pdl && int64_t(g.grid.x) <= p.sm_count;
  Launch l(g.grid, g.block, 0, stream, pdl);
  return launched(l(rope_kernel<T, CS, kInterleaved, kVec>, q, g.units_rot, g.units), what);
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
