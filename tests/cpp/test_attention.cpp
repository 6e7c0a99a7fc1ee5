// The CUDA attention kernels against the float64 reference (kernelforge::ref::attention_forward), on
// the GPU.
//
// Every case draws random q, k in [-2, 2) and v in [-1, 1) (logits of standard deviation about 1.3:
// softmax rows neither flat nor one-hot), computes the reference in float64 on float64 copies of
// the 16-bit inputs, and runs the public entry (the default plan) and then every candidate plan of
// the call through launch_with_plan, each on outputs poisoned with NaN, comparing every element of
// out and lse and checking that bytes outside the out / lse views (row padding, guard) stay
// untouched. Cases cover seqlens 1, 7, 127, 1000 and 4097, Sq != Sk with the bottom-right causal
// mask both ways (rows that see no key), GQA ratios 1, 4, 8 and 16, every head-dim pair, the bshd,
// bhsd and varlen layouts (ragged, with empty sequences), slices of a fused qkv buffer, padded rows,
// windows (left, left + right, right, with causal), softcap, sinks (float32 and q's dtype), lse on
// and off, Sk = 0 and an empty batch. Tests skip without a GPU (and below sm_80), and fail instead
// when KF_REQUIRE_GPU=1.
//
// Tolerance, from the error of the kernels' arithmetic (u: the unit roundoff of the dtype, 2^-8
// for bfloat16, 2^-11 for float16; vmax = max |v|):
//   out_i = sum_j p_ij v_j is a convex combination. P is rounded to the 16-bit dtype before P V:
//   each p_ij (1 + d_j) with |d_j| <= u, normalized by a sum of either rounded or float32 P,
//   moves out_i by at most 2 u vmax. A logit error |e| <= eps reweights p_ij by at most e^(2 eps),
//   moving out_i by at most 2 eps vmax: eps is float32 q.k accumulation (2^-14 covers Dqk = 256
//   with |s| <= 16) plus, with a softcap c, c * 2^-10 for tanh.approx.f32 (relative error below
//   2^-10.9). float16 flushes P below 2^-24 (subnormal steps of 2^-24): at most Sk * 2^-25 vmax.
//   The kernel rounds out once: u |out_i| (rtol 2 u leaves a factor of 2).
//   lse_i = m_i + log(l_i) in float32: |err| <= eps + 1e-3 (l_i summed in float32 over <= 4097
//   keys: relative error below 4097 * 2^-24 = 2.4e-4).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;
using kernelforge::AttentionPlan;
using kernelforge::AttentionTensors;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr DType I32 = DType::kInt32;

enum class Sinks { kNone, kFloat32, kSameDtype };
enum class Mem {
  kContiguous,  // every tensor contiguous
  kPadded,      // q, k, v, out rows padded by 8 elements (16 bytes: still aligned), lse rows by 3
  kFused,       // q, k, v: head slices of one [B, S, Hq + 2 Hkv, D] (or [T, Hq + 2 Hkv, D]) buffer
  kOddStride,   // q, k, v, out rows padded by 1 element: rows at every 2-byte alignment
};

// One case: shapes (varlen: the per-sequence lengths), mask, features, memory layout.
struct AttnCase {
  std::string name;
  AttentionLayout layout = AttentionLayout::kBSHD;
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, Dqk = 64, Dv = 64;
  std::vector<int64_t> seq_q, seq_k;  // kVarlen only
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.0f;
  Sinks sinks = Sinks::kNone;
  bool lse = true;
  bool max_seqlen = false;  // kVarlen: pass the max lengths (else 0: the totals)
  Mem mem = Mem::kContiguous;

  AttnCase with_causal() const {
    AttnCase c = *this;
    c.causal = true;
    return c;
  }
  AttnCase window(int64_t l, int64_t r) const {
    AttnCase c = *this;
    c.wl = l, c.wr = r;
    return c;
  }
  AttnCase cap(float s) const {
    AttnCase c = *this;
    c.softcap = s;
    return c;
  }
  AttnCase sink(Sinks s) const {
    AttnCase c = *this;
    c.sinks = s;
    return c;
  }
  AttnCase no_lse() const {
    AttnCase c = *this;
    c.lse = false;
    return c;
  }
  AttnCase memory(Mem m) const {
    AttnCase c = *this;
    c.mem = m;
    return c;
  }
  AttnCase bounds() const {
    AttnCase c = *this;
    c.max_seqlen = true;
    return c;
  }
};

AttnCase dense(const char* name, AttentionLayout l, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
               int64_t Dqk, int64_t Dv = 0) {
  AttnCase c;
  c.name = name, c.layout = l, c.B = B, c.Sq = Sq, c.Sk = Sk, c.Hq = Hq, c.Hkv = Hkv, c.Dqk = Dqk;
  c.Dv = Dv ? Dv : Dqk;
  return c;
}
AttnCase bshd(const char* n, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv = 0) {
  return dense(n, AttentionLayout::kBSHD, B, Sq, Sk, Hq, Hkv, Dqk, Dv);
}
AttnCase bhsd(const char* n, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv = 0) {
  return dense(n, AttentionLayout::kBHSD, B, Sq, Sk, Hq, Hkv, Dqk, Dv);
}
AttnCase varlen(const char* n, std::vector<int64_t> sq, std::vector<int64_t> sk, int64_t Hq, int64_t Hkv, int64_t Dqk,
                int64_t Dv = 0) {
  AttnCase c = dense(n, AttentionLayout::kVarlen, int64_t(sq.size()), 0, 0, Hq, Hkv, Dqk, Dv);
  c.seq_q = std::move(sq), c.seq_k = std::move(sk);
  return c;
}

// The case table. Reference cost (float64 multiply-adds, visible pairs only) is about
// sum over (b, h) of visible(Sq_b, Sk_b) * (Dqk + Dv): the largest case, 4097 x 4097 causal at
// D 64, is 1.1e9; the whole table about 3.5e9 per dtype.
const std::vector<AttnCase>& cases() {
  static const std::vector<AttnCase> kCases = {
      // seqlens 1, 7, 127, 1000, 4097
      bshd("q1_k1", 1, 1, 1, 1, 1, 64),
      bshd("q7_k7_mha", 2, 7, 7, 4, 4, 128),
      bshd("q127_k127_gqa4_causal", 2, 127, 127, 8, 2, 128).with_causal(),
      bshd("q1000_k1000", 1, 1000, 1000, 2, 2, 128).no_lse(),
      bshd("q1000_k1000_gqa8_causal", 1, 1000, 1000, 8, 1, 64).with_causal(),
      bshd("q4097_k4097_causal_1head", 1, 4097, 4097, 1, 1, 64).with_causal(),
      bshd("q127_k4097_chunked_prefill", 1, 127, 4097, 2, 1, 128).with_causal(),
      bshd("q4097_k1_causal", 1, 4097, 1, 1, 1, 64).with_causal(),  // only the last row sees the key
      // Sq != Sk, causal both ways; decode
      bshd("q1_k1000_gqa16_decode", 3, 1, 1000, 16, 1, 128).with_causal(),
      bshd("q7_k127_causal", 2, 7, 127, 4, 2, 96).with_causal(),
      bshd("q127_k7_causal", 2, 127, 7, 4, 4, 64).with_causal(),  // the top 120 rows see no key
      bshd("q1000_k127_causal_sinks", 1, 1000, 127, 4, 1, 128).with_causal().sink(Sinks::kFloat32),
      // every head-dim pair (130: not a multiple of any tile)
      bshd("d64", 2, 130, 130, 4, 2, 64).no_lse(),
      bshd("d96_causal", 2, 130, 130, 4, 2, 96).with_causal(),
      bhsd("d128_bhsd", 2, 130, 200, 4, 2, 128),
      bshd("d192_128_window", 2, 130, 130, 4, 1, 192, 128).window(32, -1),
      bshd("d256_softcap", 2, 130, 130, 4, 4, 256).cap(2.0f),
      bshd("d192_128_mla_causal", 2, 130, 130, 4, 4, 192, 128).with_causal(),
      bhsd("d192_128_bhsd_gqa", 1, 64, 300, 4, 1, 192, 128),
      bshd("d256_causal_sinks_same", 1, 300, 300, 2, 1, 256).with_causal().sink(Sinks::kSameDtype),
      // layouts
      bhsd("bhsd_causal_q200_k100", 2, 200, 100, 8, 2, 128).with_causal(),
      varlen("varlen_ragged_causal", {7, 0, 127, 1, 300}, {7, 5, 127, 0, 300}, 4, 2, 128).with_causal(),
      varlen("varlen_sq_ne_sk", {100, 1, 33, 0}, {50, 400, 33, 17}, 8, 1, 64).bounds(),
      varlen("varlen_causal_window_sinks", {200, 31}, {300, 31}, 4, 4, 96)
          .with_causal()
          .window(64, 0)
          .sink(Sinks::kFloat32),
      varlen("varlen_gqa16_d256", {65, 129}, {65, 129}, 16, 1, 256).with_causal().bounds().no_lse(),
      varlen("varlen_mla", {40, 90}, {90, 40}, 4, 4, 192, 128).with_causal(),
      // strided views
      bshd("fused_qkv_bshd", 2, 127, 127, 8, 2, 128).with_causal().memory(Mem::kFused),
      varlen("fused_qkv_varlen", {33, 100, 1}, {33, 100, 1}, 4, 2, 64).with_causal().memory(Mem::kFused),
      bshd("padded_rows", 2, 127, 127, 4, 2, 128).memory(Mem::kPadded).sink(Sinks::kFloat32),
      bhsd("padded_rows_bhsd", 1, 127, 64, 4, 1, 96).with_causal().memory(Mem::kPadded),
      // windows
      bshd("window_left", 1, 1000, 1000, 2, 1, 64).window(128, -1),
      bshd("window_left_right", 2, 300, 300, 4, 2, 128).window(64, 32),
      bshd("window_causal_q200_k500", 1, 200, 500, 4, 1, 128).with_causal().window(100, -1),
      bshd("window_right_only", 1, 127, 127, 2, 2, 64).window(-1, 16),
      bshd("window_q300_k100_left", 1, 300, 100, 2, 1, 64).window(8, 0),  // most rows see nothing
      // softcap, sinks
      bshd("softcap_causal_gqa4", 2, 127, 300, 8, 2, 128).with_causal().cap(2.0f),
      bshd("sinks_f32", 2, 127, 127, 8, 8, 64).sink(Sinks::kFloat32),
      bshd("sinks_same_window", 1, 200, 200, 4, 2, 128).window(16, 0).sink(Sinks::kSameDtype),
      // Sk = 0 (every row sees no key) and an empty batch
      bshd("sk0", 2, 5, 0, 4, 2, 128),
      bhsd("sk0_sinks", 1, 3, 0, 2, 1, 64).sink(Sinks::kFloat32),
      bshd("empty_batch", 0, 16, 16, 2, 1, 64),
  };
  return kCases;
}

// ---- comparison -------------------------------------------------------------------------------
struct AttnTol {
  double out_atol, out_rtol, lse_atol;
};

AttnTol attention_tolerance(DType t, double vmax, float softcap, int64_t max_sk) {
  const double u = t == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double eps = std::ldexp(1.0, -14) + (softcap > 0.0f ? softcap * std::ldexp(1.0, -10) : 0.0);
  const double flush = t == DType::kFloat16 ? double(max_sk) * std::ldexp(1.0, -25) : 0.0;
  return AttnTol{(2.0 * u + 2.0 * eps + flush) * vmax, 2.0 * u, 1e-3 + eps};
}

::testing::AssertionResult compare_out(const std::string& what, const HostTensor& got, const HostTensor& want,
                                       const AttnTol& tol) {
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i), err = std::fabs(g - w);
    if (std::isfinite(g) && err <= tol.out_atol + tol.out_rtol * std::fabs(w)) continue;
    if (bad < 8) first << "\n    [" << i << "] got " << g << " want " << w;
    worst = std::isfinite(g) ? std::fmax(worst, err) : std::nan("");
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " out " << shape_str(got.shape) << ": " << bad << " of "
                                       << got.numel() << " elements off (atol " << tol.out_atol << ", rtol "
                                       << tol.out_rtol << ", worst |err| " << worst << "); first:" << first.str();
}

// lse: a row that sees no key must be exactly -inf (or the sink, within tolerance).
::testing::AssertionResult compare_lse(const std::string& what, const HostTensor& got, const HostTensor& want,
                                       const AttnTol& tol) {
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const bool ok = std::isinf(w) ? g == w : (std::isfinite(g) && std::fabs(g - w) <= tol.lse_atol);
    if (ok) continue;
    if (bad < 8) first << "\n    [" << i << "] got " << g << " want " << w;
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " lse " << shape_str(got.shape) << ": " << bad << " of "
                                       << got.numel() << " elements off (atol " << tol.lse_atol
                                       << "); first:" << first.str();
}

HostTensor to_f64(const HostTensor& h) {
  HostTensor d(F64, h.shape);
  for (int64_t i = 0; i < h.numel(); ++i) d.set(i, h.get(i));
  return d;
}

// A view of heads [h0, h0 + H) of a buffer view whose head dimension is `hd`.
TensorView heads_of(TensorView v, int hd, int64_t h0, int64_t H) {
  v.data = static_cast<char*>(v.data) + h0 * v.strides[hd] * int64_t(kf::dtype_size(v.dtype));
  v.shape[hd] = H;
  return v;
}

// The device buffer of a workspace (at least 256 bytes, so that a call can always pass a non-null
// pointer: with nullptr the one-call entry only reports the size).
struct Workspace {
  void* p = nullptr;
  explicit Workspace(size_t bytes) {
    if (cudaMalloc(&p, bytes < 256 ? 256 : bytes) != cudaSuccess) p = nullptr;
  }
  ~Workspace() {
    if (p) cudaFree(p);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

// Bytes a plan needs for a call (the planner's own count, on the call's problem).
size_t plan_workspace(const AttentionPlan& plan, const kf::AttentionCall& call) {
  kf::AttentionParams p;
  DType t;
  if (!kf::validate_attention(call, &p, &t).ok()) return 0;
  kf::AttentionProblem pr = kf::make_attention_problem(p, t);
  if (p.varlen) pr.total_q = call.t.q->shape[0];
  return kf::workspace_bytes(plan, pr);
}

using Param = std::tuple<DType, int>;  // (dtype, case index)

class AttentionGpu : public ::testing::TestWithParam<Param> {
 protected:
  cudaStream_t stream_ = nullptr;
  void SetUp() override {
    KF_NEED_GPU();
    if (gpu_capability() < 80) GTEST_SKIP() << "attention needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  ::testing::AssertionResult finish(const Status& st, const std::string& plan) {
    if (!st.ok()) return ::testing::AssertionFailure() << plan << ": " << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << plan << ": kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  void run_case(const AttnCase& c);
};

void AttentionGpu::run_case(const AttnCase& c) {
  const DType t = dtype();
  Rng rng(hash_str(c.name + dtype_name(t)));
  const bool varlen = c.layout == AttentionLayout::kVarlen, bshd_l = c.layout == AttentionLayout::kBSHD;
  const bool fused = c.mem == Mem::kFused;
  ASSERT_TRUE(!fused || (c.Dqk == c.Dv && (varlen ? c.seq_q == c.seq_k : c.Sq == c.Sk && bshd_l)))
      << "a fused qkv case needs Dqk = Dv, Sq = Sk and layout bshd or varlen";

  // Sequence lengths and logical shapes.
  std::vector<int64_t> sq = c.seq_q, sk = c.seq_k;
  if (!varlen) sq.assign(size_t(c.B), c.Sq), sk.assign(size_t(c.B), c.Sk);
  int64_t Tq = 0, Tk = 0, max_sq = 0, max_sk = 0;
  for (size_t b = 0; b < sq.size(); ++b)
    Tq += sq[b], Tk += sk[b], max_sq = std::max(max_sq, sq[b]), max_sk = std::max(max_sk, sk[b]);
  auto shape = [&](int64_t S, int64_t H, int64_t D) {
    if (varlen) return std::vector<int64_t>{S, H, D};
    return bshd_l ? std::vector<int64_t>{c.B, S, H, D} : std::vector<int64_t>{c.B, H, S, D};
  };
  const int hd = varlen ? 1 : bshd_l ? 2 : 1;  // head dimension of the layout
  const std::vector<int64_t> qs = shape(varlen ? Tq : c.Sq, c.Hq, c.Dqk), ks = shape(varlen ? Tk : c.Sk, c.Hkv, c.Dqk),
                             vs = shape(varlen ? Tk : c.Sk, c.Hkv, c.Dv), os = shape(varlen ? Tq : c.Sq, c.Hq, c.Dv);
  const std::vector<int64_t> ls = varlen ? std::vector<int64_t>{c.Hq, Tq} : std::vector<int64_t>{c.B, c.Hq, c.Sq};

  HostTensor q = random_tensor(t, qs, rng, -2.0, 2.0), k = random_tensor(t, ks, rng, -2.0, 2.0),
             v = random_tensor(t, vs, rng, -1.0, 1.0);
  const DType sink_t = c.sinks == Sinks::kFloat32 ? F32 : t;
  HostTensor sinks = c.sinks != Sinks::kNone ? random_tensor(sink_t, {c.Hq}, rng, -2.0, 2.0) : HostTensor();
  HostTensor cuq(I32, {int64_t(sq.size()) + 1}), cuk(I32, {int64_t(sq.size()) + 1});
  cuq.set(0, 0), cuk.set(0, 0);
  for (size_t b = 0; b < sq.size(); ++b) cuq.set(b + 1, cuq.get(b) + sq[b]), cuk.set(b + 1, cuk.get(b) + sk[b]);
  double vmax = 0.0;
  for (int64_t i = 0; i < v.numel(); ++i) vmax = std::fmax(vmax, std::fabs(v.get(i)));

  AttentionOptions o;
  o.layout = c.layout;
  o.causal = c.causal;
  o.window_left = c.wl, o.window_right = c.wr;
  o.softcap = c.softcap;
  if (c.max_seqlen) o.max_seqlen_q = max_sq, o.max_seqlen_k = max_sk;

  // The float64 reference on float64 copies of the inputs (contiguous, the case's layout).
  HostTensor want(F64, os), want_lse(F64, ls);
  {
    const HostTensor q64 = to_f64(q), k64 = to_f64(k), v64 = to_f64(v);
    const HostTensor s64 = c.sinks != Sinks::kNone ? to_f64(sinks) : HostTensor(F64, {0});
    const TensorView qv = q64.view(), kv = k64.view(), vv = v64.view(), ov = want.view(), lv = want_lse.view(),
                     sv = s64.view(), cqv = cuq.view(), ckv = cuk.view();
    AttentionTensors rt;
    rt.q = &qv, rt.k = &kv, rt.v = &vv, rt.out = &ov, rt.lse = &lv;
    rt.sinks = c.sinks != Sinks::kNone ? &sv : nullptr;
    rt.cu_seqlens_q = varlen ? &cqv : nullptr;
    rt.cu_seqlens_k = varlen ? &ckv : nullptr;
    KF_ASSERT_OK(ref::attention_forward(rt, o));
  }
  const AttnTol tol = attention_tolerance(t, vmax, c.softcap, max_sk);

  // Device tensors in the case's memory layout.
  const Layout io = c.mem == Mem::kPadded ? Layout{8, 0} : c.mem == Mem::kOddStride ? Layout{1, 0} : Layout{};
  const Layout lse_mem = c.mem == Mem::kPadded ? Layout{3, 0} : Layout{};
  DeviceTensor dq, dk, dv, dqkv;
  TensorView qv, kv, vv;
  HostTensor qkv;
  if (fused) {
    const int64_t Ht = c.Hq + 2 * c.Hkv;
    qkv = HostTensor(t, shape(varlen ? Tq : c.Sq, Ht, c.Dqk));
    const int64_t rows = qkv.numel() / (Ht * c.Dqk);  // tokens
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < c.Dqk; ++e) {
        for (int64_t h = 0; h < c.Hq; ++h) qkv.set((r * Ht + h) * c.Dqk + e, q.get((r * c.Hq + h) * c.Dqk + e));
        for (int64_t h = 0; h < c.Hkv; ++h) {
          qkv.set((r * Ht + c.Hq + h) * c.Dqk + e, k.get((r * c.Hkv + h) * c.Dqk + e));
          qkv.set((r * Ht + c.Hq + c.Hkv + h) * c.Dqk + e, v.get((r * c.Hkv + h) * c.Dqk + e));
        }
      }
    dqkv = DeviceTensor(t, qkv.shape, io);
    dqkv.upload(qkv);
    qv = heads_of(dqkv.view(), hd, 0, c.Hq);
    kv = heads_of(dqkv.view(), hd, c.Hq, c.Hkv);
    vv = heads_of(dqkv.view(), hd, c.Hq + c.Hkv, c.Hkv);
  } else {
    dq = DeviceTensor(t, qs, io), dk = DeviceTensor(t, ks, io), dv = DeviceTensor(t, vs, io);
    dq.upload(q), dk.upload(k), dv.upload(v);
    qv = dq.view(), kv = dk.view(), vv = dv.view();
  }
  DeviceTensor dout(t, os, io), dlse(F32, ls, lse_mem);
  DeviceTensor dsinks = c.sinks != Sinks::kNone ? DeviceTensor(sink_t, {c.Hq}) : DeviceTensor();
  if (c.sinks != Sinks::kNone) dsinks.upload(sinks);
  DeviceTensor dcuq(I32, cuq.shape), dcuk(I32, cuk.shape);
  dcuq.upload(cuq), dcuk.upload(cuk);
  const TensorView ov = dout.view(), lv = dlse.view(), sv = dsinks.view(), cqv = dcuq.view(), ckv = dcuk.view();
  AttentionTensors dt;
  dt.q = &qv, dt.k = &kv, dt.v = &vv, dt.out = &ov;
  dt.lse = c.lse ? &lv : nullptr;
  dt.sinks = c.sinks != Sinks::kNone ? &sv : nullptr;
  dt.cu_seqlens_q = varlen ? &cqv : nullptr;
  dt.cu_seqlens_k = varlen ? &ckv : nullptr;
  kf::AttentionCall call;
  call.t = dt;
  call.opts = o;

  // Run 0: the public one-call entry (size query, then the run). Then every candidate plan.
  std::vector<AttentionPlan> plans;
  KF_ASSERT_OK(kf::attention_candidate_plans(call, &plans));
  const bool empty = Tq == 0 || c.Hq == 0;
  EXPECT_EQ(plans.empty(), empty) << plans.size() << " candidate plans";
  for (size_t run = 0; run <= plans.size(); ++run) {
    const std::string plan = run == 0 ? std::string("default plan") : kf::to_string(plans[run - 1]);
    SCOPED_TRACE(plan);
    dout.poison();
    dlse.poison();
    if (run == 0) {
      size_t bytes = 0;
      KF_ASSERT_OK(kf::attention_forward(dt, o, nullptr, &bytes, stream_));
      Workspace ws(bytes);
      ASSERT_NE(ws.p, nullptr);
      ASSERT_TRUE(finish(kf::attention_forward(dt, o, ws.p, &bytes, stream_), plan));
    } else {
      const size_t bytes = plan_workspace(plans[run - 1], call);
      Workspace ws(bytes);
      ASSERT_NE(ws.p, nullptr);
      ASSERT_TRUE(finish(kf::launch_with_plan(plans[run - 1], call, ws.p, bytes, stream_), plan));
    }
    EXPECT_TRUE(compare_out(plan, dout.download(), want, tol));
    EXPECT_TRUE(dout.check_untouched("out"));
    if (c.lse) {
      EXPECT_TRUE(compare_lse(plan, dlse.download(), want_lse, tol));
      EXPECT_TRUE(dlse.check_untouched("lse"));
    } else {
      EXPECT_TRUE(bit_equal("lse is not written without lse", dlse.download(), HostTensor(F32, ls)));
    }
    if (HasFatalFailure()) return;
  }
  // the inputs are read only
  if (fused) {
    EXPECT_TRUE(bit_equal("qkv is not written", dqkv.download(), qkv));
  } else {
    EXPECT_TRUE(bit_equal("q is not written", dq.download(), q));
    EXPECT_TRUE(bit_equal("k is not written", dk.download(), k));
    EXPECT_TRUE(bit_equal("v is not written", dv.download(), v));
  }
}

TEST_P(AttentionGpu, Case) { run_case(cases()[size_t(std::get<1>(GetParam()))]); }

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const DType t = std::get<0>(info.param);
  return std::string(t == DType::kBFloat16 ? "bf16_" : "fp16_") + cases()[size_t(std::get<1>(info.param))].name;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpu,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Range(0, int(cases().size()))),
                         param_name);

// Rows at every 2-byte alignment (row strides of Dqk + 1 elements): the contract allows any strides
// with a unit last stride, so the planner must pick a kernel that does not need 16-byte rows.
class AttentionGpuUnaligned : public AttentionGpu {};

TEST_P(AttentionGpuUnaligned, OddRowStride) {
  run_case(bshd("odd_stride_bshd", 2, 127, 127, 4, 2, 128).with_causal().memory(Mem::kOddStride));
  if (HasFatalFailure()) return;
  run_case(varlen("odd_stride_varlen", {5, 64}, {70, 64}, 2, 1, 64).memory(Mem::kOddStride));
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpuUnaligned,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16), ::testing::Values(0)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::get<0>(info.param) == DType::kBFloat16 ? "bf16" : "fp16");
                         });

// The plan-then-run entries: attention_plan's plan and workspace size run through
// attention_forward(plan, ...) and give the bits of the one-call entry; two runs are bit-identical
// (every output element has one writer); a workspace smaller than the plan needs, and a plan for
// other head dims, are rejected before any launch.
class AttentionGpuEntries : public AttentionGpu {};

TEST_P(AttentionGpuEntries, PlanThenRun) {
  const DType t = dtype();
  Rng rng(hash_str(std::string("entries") + dtype_name(t)));
  const int64_t B = 2, S = 300, Hq = 8, Hkv = 2, D = 128;
  HostTensor q = random_tensor(t, {B, S, Hq, D}, rng), k = random_tensor(t, {B, S, Hkv, D}, rng),
             v = random_tensor(t, {B, S, Hkv, D}, rng, -1.0, 1.0);
  DeviceTensor dq(t, q.shape), dk(t, k.shape), dv(t, v.shape), o1(t, q.shape), o2(t, q.shape), o3(t, q.shape);
  DeviceTensor l1(F32, {B, Hq, S}), l2(F32, {B, Hq, S}), l3(F32, {B, Hq, S});
  dq.upload(q), dk.upload(k), dv.upload(v);
  const TensorView qv = dq.view(), kv = dk.view(), vv = dv.view();
  AttentionOptions o;
  o.causal = true;
  auto tensors = [&](const DeviceTensor& out, const DeviceTensor& lse, TensorView* ov, TensorView* lv) {
    *ov = out.view(), *lv = lse.view();
    AttentionTensors at;
    at.q = &qv, at.k = &kv, at.v = &vv, at.out = ov, at.lse = lv;
    return at;
  };
  TensorView ov1, lv1, ov2, lv2, ov3, lv3;
  const AttentionTensors t1 = tensors(o1, l1, &ov1, &lv1), t2 = tensors(o2, l2, &ov2, &lv2),
                         t3 = tensors(o3, l3, &ov3, &lv3);

  AttentionPlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::attention_plan(t1, o, &plan, &bytes));
  const std::string ps = kf::to_string(plan);
  SCOPED_TRACE(ps);
  Workspace ws(bytes);
  ASSERT_TRUE(finish(kf::attention_forward(plan, t1, o, ws.p, bytes, stream_), ps));
  size_t bytes2 = 0;
  KF_ASSERT_OK(kf::attention_forward(t2, o, nullptr, &bytes2, stream_));
  EXPECT_EQ(bytes2, bytes);
  ASSERT_TRUE(finish(kf::attention_forward(t2, o, ws.p, &bytes2, stream_), ps));
  ASSERT_TRUE(finish(kf::attention_forward(plan, t3, o, ws.p, bytes, stream_), ps));
  EXPECT_TRUE(bit_equal("out: plan-then-run vs one call", o1.download(), o2.download()));
  EXPECT_TRUE(bit_equal("lse: plan-then-run vs one call", l1.download(), l2.download()));
  EXPECT_TRUE(bit_equal("out: two runs", o1.download(), o3.download()));
  EXPECT_TRUE(bit_equal("lse: two runs", l1.download(), l3.download()));

  if (bytes > 0) {
    KF_EXPECT_INVALID(kf::attention_forward(plan, t1, o, ws.p, bytes - 1, stream_), "workspace_bytes must be at least");
    KF_EXPECT_INVALID(kf::attention_forward(plan, t1, o, nullptr, bytes, stream_), "workspace must not be null");
  }
  AttentionPlan other = plan;
  other.head_dim_qk = other.head_dim_v = 64;
  const Status st = kf::attention_forward(other, t1, o, ws.p, bytes, stream_);
  EXPECT_FALSE(st.ok()) << "a plan for head dims 64/64 ran a problem of head dims 128/128";
  KF_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpuEntries,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16), ::testing::Values(0)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::get<0>(info.param) == DType::kBFloat16 ? "bf16" : "fp16");
                         });

}  // namespace
