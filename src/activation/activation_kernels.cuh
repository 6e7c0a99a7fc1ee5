// Activation kernels: y = act(a) * b (gated: SwiGLU, GeGLU) or y = act(a) (GELU), forward and
// backward, elementwise over rows (formulas in include/kernelforge/activation.h).
//
// Napkin math (H100 SXM 80 GB: ~3.0 TB/s device-to-device copy, 132 SMs, 50 MB L2):
//   gated forward:  read a, b, write y           3·M·I·sizeof(T) B; M=16384, I=4096 bf16 -> 403 MB
//                   -> 134 µs at 3.0 TB/s, 141 µs at the 2.85 TB/s target.
//   gated backward: read a, b, dy, write da, db  5·M·I·sizeof(T) B; fwd+bwd 8·M·I·sizeof(T).
//   gelu:           forward 2·M·N·sizeof(T) B (read x, write y); backward 3·M·N (read x, dy, write dx).
//   Arithmetic per element: ~10–30 float ops and 2 MUFU (ex2, rcp); at 3 TB/s a bf16 gated forward
//   moves 5·10^11 elements/s while the SMs issue ~3·10^13 float ops/s and ~3.8·10^12 MUFU ops/s,
//   i.e. ~60 ops and ~7 MUFU of budget per element: memory-bound with room to spare.
// Design: no shared memory, no reductions. A 2-D grid: blockDim = (tx, ty), tx threads (a power of
// two, 32..256) along a row and ty rows per block; grid = (column chunks, row groups), rows looped
// when there are more than 65535 row groups. Each thread first loads kVecs vectors of kVec elements
// of every input (column vectors v = chunk·tx·kVecs + u·tx + threadIdx.x: coalesced for each u),
// then computes and stores them: with 16-byte vectors and kVecs = 4 a forward thread has 128 B in
// flight, and a resident SM (~1000+ threads) over 100 KB, several times what Little's law asks for
// (~3 TB/s × ~0.6 µs / 132 SMs ≈ 14 KB per SM).
// Vector width: one per launch, the widest of 16 B / 4 B / one element that divides every base
// pointer and (with more than one row) every row stride in bytes; a row whose length is not a
// multiple of it ends with one partial vector done element by element. Row offsets are 64-bit.
// Math: float32, __expf-based sigmoid (relative error ~1e-6 for |a| < 80, far inside the float32
// tolerance of 1e-5), erff for the exact GELU; the result is rounded once to T.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "activation/activation_problem.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {
namespace act_detail {

// ---- tuning (first guesses from the napkin math above; to be measured, see notes/activation.md) --
constexpr int kThreads = 256;     // threads per block (tx · ty)
constexpr int kMaxGridY = 65535;  // CUDA's limit for gridDim.y: more row groups loop
struct ActTuning {
  int vecs_16B;     // vectors per thread per input on the 16-byte path
  int vecs_narrow;  // ... on the 4-byte and one-element paths (fewer bytes per access: more of them)
};
// Forward: one 16-byte vector per input per thread (2 loads in flight, 8 blocks of 256 threads per
// SM: 64 KB per SM). Measured (H100, bf16, 16384 x I = 2048 / 4096 / 8192, silu_and_mul, L2 flushed,
// µs): 4 vectors 72.3 / 137.4 / 268.9, 1 vector 71.5 / 136.1 / 266.9 (scripts/prof_act.py,
// notes/activation.md): the shorter blocks fill the last wave better.
#ifndef KF_ACT_FWD_VECS  // build-time switches for sweeps (-DKF_ACT_FWD_VECS=2 ...)
#define KF_ACT_FWD_VECS 1
#endif
#ifndef KF_ACT_BWD_VECS
#define KF_ACT_BWD_VECS 2
#endif
constexpr ActTuning kFwdTuning = {KF_ACT_FWD_VECS, 8};
constexpr ActTuning kBwdTuning = {KF_ACT_BWD_VECS, 4};  // 3 inputs: 6 × 16 B loads in flight per thread

template <bool kBwd, int kBytes>
constexpr int vecs_per_thread() {
  constexpr ActTuning t = kBwd ? kBwdTuning : kFwdTuning;
  return kBytes >= 16 ? t.vecs_16B : t.vecs_narrow;
}

// ---- the elementwise functions (float32) ---------------------------------------------------------
constexpr float kSqrt1_2 = 0.70710678118654752440f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)
constexpr float kTanh2K = 1.59576912160573071176f;      // 2 sqrt(2 / pi)
constexpr float kTanh2KC = kTanh2K * 0.044715f;         // 2 sqrt(2 / pi) · 0.044715

// sigmoid(z) = 1 / (1 + exp(-z)): ex2 + rcp (MUFU). z = -inf or z < -88: exp overflows to inf and
// the reciprocal gives 0 (the limit); z = NaN gives NaN.
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.f, 1.f + __expf(-z)); }

// act(a), and act(a) with act'(a) for the backward.
template <ActFn F>
struct Act;

// silu(a) = a · s, s = sigmoid(a);  silu'(a) = s (1 + a (1 - s)).
// a = -inf: a · 0 = NaN, as PyTorch's x / (1 + exp(-x)); a = +inf: forward inf, gradient NaN (inf · 0).
template <>
struct Act<ActFn::kSilu> {
  static __device__ __forceinline__ float fwd(float a) { return a * sigmoid(a); }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float s = sigmoid(a);
    f = a * s;
    df = s * fmaf(a, 1.f - s, 1.f);
  }
};

// gelu(a) = 0.5 a (1 + erf(a / sqrt 2)) = a · Phi(a);  gelu'(a) = Phi(a) + a · phi(a),
// phi(a) = exp(-a^2 / 2) / sqrt(2 pi). Same formula as PyTorch (erf, not erfc: for a < -5 the result
// is below 1.5e-6 in absolute value, where the cancellation in 1 + erf costs nothing that matters).
template <>
struct Act<ActFn::kGeluErf> {
  static __device__ __forceinline__ float fwd(float a) { return 0.5f * a * (1.f + erff(a * kSqrt1_2)); }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float cdf = 0.5f * (1.f + erff(a * kSqrt1_2));
    f = a * cdf;
    df = fmaf(a * kInvSqrt2Pi, __expf(-0.5f * a * a), cdf);
  }
};

// gelu_tanh(a) = 0.5 a (1 + tanh(u)), u = k (a + 0.044715 a^3), k = sqrt(2 / pi).
// With 0.5 (1 + tanh(u)) = sigmoid(2u): gelu_tanh(a) = a · s, s = sigmoid(z), z = 2u = a (2k + 2k·0.044715 a^2);
// gelu_tanh'(a) = s + a · s (1 - s) · z', z' = 2k (1 + 3 · 0.044715 a^2)
// (= 0.5 (1 + t) + 0.5 a (1 - t^2) u' since 1 - t^2 = 4 s (1 - s)). a^2 is capped at 1e6: beyond
// |a| = 1000, s is exactly 0 or 1 in float32 so the second term is 0, where an a^2 of inf would turn
// it into 0 · inf = NaN (the float64 reference gives 0 up to |a| ~ 1e100).
template <>
struct Act<ActFn::kGeluTanh> {
  static __device__ __forceinline__ float fwd(float a) {
    const float a2 = fminf(a * a, 1e6f);
    return a * sigmoid(a * fmaf(kTanh2KC, a2, kTanh2K));
  }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float a2 = fminf(a * a, 1e6f);
    const float s = sigmoid(a * fmaf(kTanh2KC, a2, kTanh2K));
    f = a * s;
    df = fmaf(f * (1.f - s), fmaf(3.f * kTanh2KC, a2, kTanh2K), s);
  }
};

// ---- kernels -----------------------------------------------------------------------------------
// Forward: y[r, c] = T(act(a[r, c]) · b[r, c]) (or T(act(a[r, c]))).
template <typename T, ActFn kFn, bool kGated, int kVec, int kVecs>
__global__ void __launch_bounds__(kThreads) act_fwd(const ActParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int64_t n = p.n;
    const int64_t col0 = (int64_t(blockIdx.x) * blockDim.x * kVecs + threadIdx.x) * kVec;
    const int64_t step = int64_t(blockDim.x) * kVec;  // columns between one thread's vectors
    const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows; r += row_step) {
      const T* a = static_cast<const T*>(p.a) + r * p.a_stride;
      const T* b = kGated ? static_cast<const T*>(p.b) + r * p.b_stride : nullptr;
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      V va[kVecs], vb[kVecs];
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {  // all loads first: kVecs (x2) accesses in flight
        const int64_t c = col0 + u * step;
        va[u] = V::zero();
        vb[u] = V::zero();
        if (c + kVec <= n) {
          va[u] = load_vec<T, kVec>(a + c);
          if constexpr (kGated) vb[u] = load_vec<T, kVec>(b + c);
        }
      }
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int64_t c = col0 + u * step;
        if (c + kVec <= n) {
          float out[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float f = Act<kFn>::fwd(va[u].get(j));
            out[j] = kGated ? f * vb[u].get(j) : f;
          }
          store_vec<T, kVec>(y + c, V::from(out));
        } else if (c < n) {  // the row's last, partial vector (n not a multiple of kVec)
          for (int64_t k = c; k < n; ++k) {
            const float f = Act<kFn>::fwd(to_float(a[k]));
            y[k] = from_float<T>(kGated ? f * to_float(b[k]) : f);
          }
        }
      }
    }
  }
}

// Backward: da = T(g · b · act'(a)), db = T(g · act(a)) (gated); da = T(g · act'(a)) (gelu).
template <typename T, ActFn kFn, bool kGated, int kVec, int kVecs>
__global__ void __launch_bounds__(kThreads) act_bwd(const ActParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int64_t n = p.n;
    const int64_t col0 = (int64_t(blockIdx.x) * blockDim.x * kVecs + threadIdx.x) * kVec;
    const int64_t step = int64_t(blockDim.x) * kVec;
    const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows; r += row_step) {
      const T* a = static_cast<const T*>(p.a) + r * p.a_stride;
      const T* b = kGated ? static_cast<const T*>(p.b) + r * p.b_stride : nullptr;
      const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
      T* da = static_cast<T*>(p.da) + r * p.da_stride;
      T* db = kGated ? static_cast<T*>(p.db) + r * p.db_stride : nullptr;
      V va[kVecs], vb[kVecs], vg[kVecs];
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int64_t c = col0 + u * step;
        va[u] = V::zero();
        vb[u] = V::zero();
        vg[u] = V::zero();
        if (c + kVec <= n) {
          va[u] = load_vec<T, kVec>(a + c);
          if constexpr (kGated) vb[u] = load_vec<T, kVec>(b + c);
          vg[u] = load_vec<T, kVec>(dy + c);
        }
      }
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int64_t c = col0 + u * step;
        if (c + kVec <= n) {
          float ga[kVec], gb[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            float f, df;
            Act<kFn>::both(va[u].get(j), f, df);
            const float g = vg[u].get(j);
            if constexpr (kGated) {
              ga[j] = g * vb[u].get(j) * df;
              gb[j] = g * f;
            } else {
              ga[j] = g * df;
              gb[j] = 0.f;
            }
          }
          store_vec<T, kVec>(da + c, V::from(ga));
          if constexpr (kGated) store_vec<T, kVec>(db + c, V::from(gb));
        } else if (c < n) {  // partial last vector, element by element
          for (int64_t k = c; k < n; ++k) {
            float f, df;
            Act<kFn>::both(to_float(a[k]), f, df);
            const float g = to_float(dy[k]);
            if constexpr (kGated) {
              da[k] = from_float<T>(g * to_float(b[k]) * df);
              db[k] = from_float<T>(g * f);
            } else {
              da[k] = from_float<T>(g * df);
            }
          }
        }
      }
    }
  }
}

// ---- launch ------------------------------------------------------------------------------------
inline int pow2_at_least(int64_t v, int cap) {  // smallest power of two >= v, at most cap
  int p = 1;
  while (p < v && p < cap) p <<= 1;
  return p;
}

// Widest access (bytes) that every base pointer and row stride allows: 16, 4 (16-bit types) or
// sizeof(T). Null pointers (absent tensors) and zero strides do not constrain it; with one row the
// strides are never used.
template <typename T>
int vector_bytes(const ActParams& p, bool bwd) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(p.a) | reinterpret_cast<uintptr_t>(p.b);
  int64_t strides = p.a_stride | p.b_stride;
  if (bwd) {
    bits |= reinterpret_cast<uintptr_t>(p.dy) | reinterpret_cast<uintptr_t>(p.da) | reinterpret_cast<uintptr_t>(p.db);
    strides |= p.dy_stride | p.da_stride | p.db_stride;
  } else {
    bits |= reinterpret_cast<uintptr_t>(p.y);
    strides |= p.y_stride;
  }
  if (p.rows > 1) bits |= static_cast<uintptr_t>(strides) * sizeof(T);
  if (bits % 16 == 0) return 16;
  if (sizeof(T) < 4 && bits % 4 == 0) return 4;
  return int(sizeof(T));
}

struct Grid {
  dim3 grid, block;
};
// tx covers a row's vectors in kVecs passes (32..kThreads threads), ty = kThreads / tx rows per
// block (fewer when there are fewer rows), one block column per tx·kVecs vectors of a row.
inline Grid plan(int64_t rows, int64_t n, int vec, int vecs) {
  const int64_t nv = ceil_div(n, vec);
  const int tx = std::max(32, pow2_at_least(ceil_div(nv, vecs), kThreads));
  const int ty = std::min(kThreads / tx, pow2_at_least(rows, kThreads));
  const int64_t chunks = ceil_div(nv, int64_t(tx) * vecs);
  const int64_t groups = std::min<int64_t>(ceil_div(rows, ty), kMaxGridY);
  return {dim3(unsigned(chunks), unsigned(groups)), dim3(unsigned(tx), unsigned(ty))};
}

template <typename T, ActFn kFn, bool kGated, bool kBwd, int kVec, int kVecs>
Status launch_vecs(const ActParams& p, const Grid& g, cudaStream_t stream) {
  DeviceInfo dev;
  dev.capability = p.capability;
  const bool pdl = use_pdl(dev);
  ActParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && int64_t(g.grid.x) * g.grid.y <= p.sm_count;
  Launch l(g.grid, g.block, 0, stream, pdl);
  if constexpr (kBwd) {
    return launched(l(act_bwd<T, kFn, kGated, kVec, kVecs>, q), "activation backward");
  } else {
    return launched(l(act_fwd<T, kFn, kGated, kVec, kVecs>, q), "activation forward");
  }
}

// A problem smaller than one wave of blocks (decode rows: 1x4096 is 1 block of 128 threads with 4
// vectors each) is latency-bound: the per-thread chain of kVecs activations is the kernel's time, so
// the 16-byte path takes one vector per thread there (1x4096: 2 blocks of 256 threads).
template <typename T, ActFn kFn, bool kGated, bool kBwd, int kVec>
Status launch(const ActParams& p, cudaStream_t stream) {
  constexpr int kVecs = vecs_per_thread<kBwd, kVec* int(sizeof(T))>();
  const Grid g = plan(p.rows, p.n, kVec, kVecs);
  if constexpr (kVecs > 1 && kVec * sizeof(T) == 16) {
    // KF_TUNE act_one_vec=1: one vector per thread at every size (sweeps)
    if ((int64_t(g.grid.x) * g.grid.y < p.sm_count && tune("act_small", 1) != 0) || tune("act_one_vec", 0) != 0)
      return launch_vecs<T, kFn, kGated, kBwd, kVec, 1>(p, plan(p.rows, p.n, kVec, 1), stream);
  }
  return launch_vecs<T, kFn, kGated, kBwd, kVec, kVecs>(p, g, stream);
}

template <typename T, ActFn kFn, bool kGated, bool kBwd>
Status with_vec(const ActParams& p, cudaStream_t stream) {
  const int bytes = vector_bytes<T>(p, kBwd);
  if (bytes == 16) return launch<T, kFn, kGated, kBwd, 16 / int(sizeof(T))>(p, stream);
  if constexpr (sizeof(T) == 2) {
    if (bytes == 4) return launch<T, kFn, kGated, kBwd, 2>(p, stream);
  }
  return launch<T, kFn, kGated, kBwd, 1>(p, stream);
}

template <typename T, bool kBwd>
Status dispatch(ActFn fn, bool gated, const ActParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.n == 0) return Status::Ok();
  switch (fn) {
    case ActFn::kSilu:
      if (gated) return with_vec<T, ActFn::kSilu, true, kBwd>(p, stream);
      break;  // silu alone is not an op
    case ActFn::kGeluErf:
      return gated ? with_vec<T, ActFn::kGeluErf, true, kBwd>(p, stream)
                   : with_vec<T, ActFn::kGeluErf, false, kBwd>(p, stream);
    case ActFn::kGeluTanh:
      return gated ? with_vec<T, ActFn::kGeluTanh, true, kBwd>(p, stream)
                   : with_vec<T, ActFn::kGeluTanh, false, kBwd>(p, stream);
  }
  return Status::Invalid("activation: unknown function");
}

}  // namespace act_detail

// One definition per dtype, instantiated in activation_<dtype>.cu.
#define KF_ACT_DEFINE(T)                                                                    \
  template <>                                                                               \
  Status launch_act_fwd<T>(ActFn fn, bool gated, const ActParams& p, cudaStream_t stream) { \
    return act_detail::dispatch<T, false>(fn, gated, p, stream);                            \
  }                                                                                         \
  template <>                                                                               \
  Status launch_act_bwd<T>(ActFn fn, bool gated, const ActParams& p, cudaStream_t stream) { \
    return act_detail::dispatch<T, true>(fn, gated, p, stream);                             \
  }

}  // namespace kernelforge
