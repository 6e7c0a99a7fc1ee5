// The CUDA attention backward against the float64 reference (kernelforge::ref::attention_backward),
// on the GPU.
//
// Every case draws random q, k in [-2, 2), v and dout in [-1, 1) (and float32 sinks), runs the GPU
// forward for out and lse, computes the reference gradients in float64 from float64 copies of the
// 16-bit inputs and of that out and lse (the backward recomputes p from the given lse, so both
// sides start from the same numbers), and runs the one-call entry (with CUB's size query), the
// plan-then-run entries and then every candidate plan through launch_bwd_with_plan, each on
// gradients poisoned with NaN, comparing every element of dq, dk, dv and dsinks and checking that
// bytes outside the gradient views stay untouched. Deterministic mode runs twice and must give the
// same bits. Cases: seqlens 1, 7, 127, 200 (not multiples of any tile), Sq != Sk causal both ways
// (rows that see no key), GQA 1, 2, 4, head dims 64, 96, 128, 192/128, 256, windows, softcap, sinks,
// bshd, bhsd, ragged varlen (a sequence without queries, one without keys), slices of fused qkv /
// dqkv buffers, odd row strides (rows at every 2-byte alignment), Sk = 0, Sq = 0 (dk = dv = 0,
// dsinks = 0) and an empty batch; causal over 5 and 8 key tiles of 128 keys (d64 and d128, GQA,
// varlen sequences of 5, 2, 3 and 1 key tiles) for the wgmma kernel's paired schedule (order=paired,
// a candidate plan of every non-deterministic call on sm_90: key tiles t and T - 1 - t in one CTA,
// the middle tile alone when T is odd). Tests skip without a GPU (and below sm_80), and fail instead
// when KF_REQUIRE_GPU=1.
//
// Tolerance (u: the unit roundoff of the dtype, 2^-8 bfloat16, 2^-11 float16; eps: the kernels'
// logit error, 2^-14 for float32 q.k plus softcap * 2^-10 for tanh.approx, as in the forward's test):
//   dv_j = sum_i p_ij dout_i, dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i are float32
//   sums of products whose P or dS operand is rounded to the 16-bit dtype (relative error <= u) and
//   whose p carries the logit error (relative <= 2 eps). The rounding errors are independent, so a
//   sum's error concentrates around (u + 2 eps) sqrt(sum of squared terms), which for softmax-
//   weighted sums stays below the largest gradient of the tensor: atol = (4 u + 8 eps) max|want|,
//   plus the final rounding rtol = 2 u. float16 also flushes dS below 2^-24: Sk 2^-24 max|q|, |k|.
//   dsinks_h = -sum_i p_sink_i D_i stays float32 (no 16-bit operand): p_sink carries eps, D_i a
//   float32 dot product (relative 2^-16 of sum |dout out|), the row sum 1000 * 2^-24: atol =
//   (2 eps + 2^-13) sum_i p_sink_i |D_i|, computed from the same out and dout.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
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
using kernelforge::AttentionGradTensors;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;
using kernelforge::AttentionPlan;
using kernelforge::AttentionTensors;

constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr DType I32 = DType::kInt32;

enum class Mem {
  kContiguous,  // every tensor contiguous
  kFused,       // q, k, v and dq, dk, dv: head slices of one [.., Hq + 2 Hkv, D] buffer each
  kOddStride,   // q, k, v, out, dout, dq, dk, dv rows padded by 1 element: every 2-byte alignment
};

struct BwdCase {
  std::string name;
  AttentionLayout layout = AttentionLayout::kBSHD;
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, Dqk = 64, Dv = 64;
  std::vector<int64_t> seq_q, seq_k;  // kVarlen only
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.0f;
  bool sinks = false;
  Mem mem = Mem::kContiguous;

  BwdCase with_causal() const {
    BwdCase c = *this;
    c.causal = true;
    return c;
  }
  BwdCase window(int64_t l, int64_t r) const {
    BwdCase c = *this;
    c.wl = l, c.wr = r;
    return c;
  }
  BwdCase cap(float s) const {
    BwdCase c = *this;
    c.softcap = s;
    return c;
  }
  BwdCase sink() const {
    BwdCase c = *this;
    c.sinks = true;
    return c;
  }
  BwdCase memory(Mem m) const {
    BwdCase c = *this;
    c.mem = m;
    return c;
  }
};

BwdCase dense(const char* name, AttentionLayout l, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
              int64_t Dqk, int64_t Dv = 0) {
  BwdCase c;
  c.name = name, c.layout = l, c.B = B, c.Sq = Sq, c.Sk = Sk, c.Hq = Hq, c.Hkv = Hkv, c.Dqk = Dqk;
  c.Dv = Dv ? Dv : Dqk;
  return c;
}
BwdCase bshd(const char* n, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv = 0) {
  return dense(n, AttentionLayout::kBSHD, B, Sq, Sk, Hq, Hkv, Dqk, Dv);
}
BwdCase bhsd(const char* n, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t Dqk, int64_t Dv = 0) {
  return dense(n, AttentionLayout::kBHSD, B, Sq, Sk, Hq, Hkv, Dqk, Dv);
}
BwdCase varlen(const char* n, std::vector<int64_t> sq, std::vector<int64_t> sk, int64_t Hq, int64_t Hkv, int64_t Dqk,
               int64_t Dv = 0) {
  BwdCase c = dense(n, AttentionLayout::kVarlen, int64_t(sq.size()), 0, 0, Hq, Hkv, Dqk, Dv);
  c.seq_q = std::move(sq), c.seq_k = std::move(sk);
  return c;
}

// The case table. Reference cost: about 3 * visible pairs * (Dqk + Dv) multiply-adds per query head;
// the whole table is below 2.5e9 per dtype.
const std::vector<BwdCase>& cases() {
  static const std::vector<BwdCase> kCases = {
      bshd("q1_k1", 1, 1, 1, 1, 1, 64),
      bshd("q7_k7_mha", 2, 7, 7, 4, 4, 128),
      bshd("q127_k127_gqa4_causal", 1, 127, 127, 8, 2, 128).with_causal(),
      bshd("q200_k127_causal", 1, 200, 127, 4, 1, 64).with_causal(),  // the top 73 rows see no key
      bshd("q127_k200_causal_d96", 1, 127, 200, 4, 4, 96).with_causal(),
      bhsd("d256_softcap_bhsd", 1, 127, 127, 2, 1, 256).cap(2.0f),
      bshd("d192_128_causal_window", 1, 127, 200, 4, 4, 192, 128).with_causal().window(32, -1),
      bhsd("d192_128_bhsd_gqa2", 1, 64, 127, 4, 2, 192, 128),
      bshd("window_left_right", 1, 200, 200, 2, 1, 64).window(16, 8),
      bshd("sinks_gqa2", 2, 127, 127, 4, 2, 128).sink(),
      bshd("sinks_causal_q200_k7", 1, 200, 7, 2, 1, 64).with_causal().sink(),  // rows with only the sink
      varlen("varlen_ragged_causal_sinks", {7, 0, 127, 1, 200}, {7, 5, 127, 0, 200}, 4, 2, 128).with_causal().sink(),
      varlen("varlen_sq_ne_sk_softcap", {1, 127, 33}, {200, 7, 33}, 8, 2, 64).cap(5.0f),
      bshd("fused_qkv_bshd", 2, 127, 127, 8, 2, 128).with_causal().memory(Mem::kFused),
      varlen("fused_qkv_varlen", {33, 100, 1}, {33, 100, 1}, 4, 2, 64).with_causal().memory(Mem::kFused),
      bshd("odd_stride_bshd", 1, 127, 127, 4, 2, 128).with_causal().memory(Mem::kOddStride),
      varlen("odd_stride_varlen", {5, 64}, {70, 64}, 2, 1, 64).memory(Mem::kOddStride).sink(),
      // d128 over several 128-key and 64-query tiles (the wgmma kernel's tiles on sm_90): every feature.
      bshd("d128_causal_window_softcap_q200_k300", 1, 200, 300, 8, 2, 128).with_causal().window(70, -1).cap(5.0f),
      bhsd("d128_softcap_bhsd_q300", 1, 300, 300, 2, 1, 128).cap(2.0f),
      bshd("d128_window_left_right_q333", 2, 333, 333, 2, 2, 128).window(100, 40),
      bshd("d128_causal_q300_k200_sinks", 1, 300, 200, 4, 1, 128).with_causal().sink(),  // the top 100 rows see none
      varlen("d128_varlen_ragged", {1, 300, 0, 129}, {260, 129, 5, 129}, 8, 2, 128).with_causal(),
      bshd("d64_gqa4_causal_q300_sinks", 1, 300, 300, 8, 2, 64).with_causal().sink(),
      // d64 with a softcap (the wgmma kernel's 64-query step, dQ split by columns between its
      // consumers) and without (128-query step, split by rows), and d128, over several key tiles: the
      // deterministic mode's reruns order 4 or 5 key tiles per query tile, causal and not, with GQA.
      bshd("d64_softcap_gqa2_q300_k400", 1, 300, 400, 4, 2, 64).cap(5.0f),
      bshd("d64_causal_softcap_gqa2_q333", 1, 333, 333, 4, 2, 64).with_causal().cap(2.0f),
      bshd("d64_gqa2_q200_k400", 1, 200, 400, 4, 2, 64),
      bshd("d128_gqa2_q200_k400", 1, 200, 400, 4, 2, 128),
      // Causal over an even and an odd number of key tiles (8: 1000 keys, the last tile partial; 5:
      // 600 keys), d64 (128-query steps) and d128, GQA: the paired schedule's pairs (0, 7) .. (3, 4)
      // and (0, 4), (1, 3), (2). Varlen: pairs per sequence, 5, 2, 3 (Sq 250 < Sk 300) and 1 key
      // tiles, the last without queries (its CTA writes dk = dv = 0).
      bshd("d64_causal_gqa2_q1000_8ktiles", 1, 1000, 1000, 2, 1, 64).with_causal(),
      bshd("d128_causal_gqa2_q600_5ktiles", 1, 600, 600, 2, 1, 128).with_causal(),
      varlen("d64_varlen_causal_gqa2_ktiles_5_2_3_1", {520, 130, 250, 0}, {520, 130, 300, 7}, 2, 1, 64).with_causal(),
      // d256 (the column-split wgmma kernel on sm_90: 64 x 64 tiles): several key and query tiles,
      // causal with sinks and GQA, a two-sided window with Sq != Sk, ragged varlen, softcap.
      bshd("d256_causal_gqa2_q300_sinks", 1, 300, 300, 4, 2, 256).with_causal().sink(),
      bshd("d256_window_q200_k333", 1, 200, 333, 2, 1, 256).window(50, 20),
      varlen("d256_varlen_ragged_causal", {1, 200, 0, 129}, {130, 129, 5, 129}, 4, 2, 256).with_causal(),
      bshd("d256_softcap_gqa2_q130_k200", 2, 130, 200, 4, 2, 256).cap(5.0f),
      // 192/128 (the same kernel, dK / dQ tiles split two and one): several tiles, every feature.
      bshd("d192_128_causal_gqa2_q300_sinks", 1, 300, 300, 4, 2, 192, 128).with_causal().sink(),
      varlen("d192_128_varlen_softcap", {130, 1, 77}, {200, 65, 77}, 4, 2, 192, 128).cap(5.0f),
      bshd("sk0_sinks", 2, 5, 0, 4, 2, 128).sink(),  // dq = 0, dsinks = 0
      bshd("sq0_d128", 1, 0, 130, 2, 1, 128),        // no query: dk = dv = 0
      bshd("sq0_sinks", 1, 0, 7, 2, 1, 64).sink(),   // no query: dk = dv = 0, dsinks = 0
      bshd("empty_batch", 0, 16, 16, 2, 1, 64).sink(),
  };
  return kCases;
}

HostTensor to_f64(const HostTensor& h) {
  HostTensor d(F64, h.shape);
  for (int64_t i = 0; i < h.numel(); ++i) d.set(i, h.get(i));
  return d;
}

double max_abs(const HostTensor& h) {
  double m = 0.0;
  for (int64_t i = 0; i < h.numel(); ++i) m = std::fmax(m, std::fabs(h.get(i)));
  return m;
}

::testing::AssertionResult compare(const std::string& what, const HostTensor& got, const HostTensor& want, double atol,
                                   double rtol) {
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i), err = std::fabs(g - w);
    if (std::isfinite(g) && err <= atol + rtol * std::fabs(w)) continue;
    if (bad < 8) first << "\n    [" << i << "] got " << g << " want " << w;
    worst = std::isfinite(g) ? std::fmax(worst, err) : std::nan("");
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << shape_str(got.shape) << ": " << bad << " of " << got.numel()
                                       << " elements off (atol " << atol << ", rtol " << rtol << ", worst |err| "
                                       << worst << "); first:" << first.str();
}

// A view of heads [h0, h0 + H) of a buffer view whose head dimension is `hd`.
TensorView heads_of(TensorView v, int hd, int64_t h0, int64_t H) {
  v.data = static_cast<char*>(v.data) + h0 * v.strides[hd] * int64_t(kf::dtype_size(v.dtype));
  v.shape[hd] = H;
  return v;
}

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

size_t plan_workspace(const AttentionPlan& plan, const kf::AttentionGradCall& call) {
  kf::AttentionGradParams p;
  DType t;
  if (!kf::validate_attention_backward(call, &p, &t).ok()) return 0;
  return kf::bwd_workspace_bytes(plan, kf::make_attention_bwd_problem(p, t));
}

// A q / k / v-shaped tensor on the device: either its own allocation or a head slice of a fused one.
struct Qkv {
  DeviceTensor q, k, v, fused;
  TensorView qv, kv, vv;
};

using Param = std::tuple<DType, int>;  // (dtype, case index)

class AttentionBwdGpu : public ::testing::TestWithParam<Param> {
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
  ::testing::AssertionResult finish(const Status& st, const std::string& plan) {
    if (!st.ok()) return ::testing::AssertionFailure() << plan << ": " << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << plan << ": kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  void run_case(const BwdCase& c);
};

void AttentionBwdGpu::run_case(const BwdCase& c) {
  const DType t = std::get<0>(GetParam());
  Rng rng(hash_str("bwd" + c.name + dtype_name(t)));
  const bool varlen = c.layout == AttentionLayout::kVarlen, bshd_l = c.layout == AttentionLayout::kBSHD;
  const bool fused = c.mem == Mem::kFused;
  ASSERT_TRUE(!fused || (c.Dqk == c.Dv && (varlen ? c.seq_q == c.seq_k : c.Sq == c.Sk && bshd_l)))
      << "a fused case needs Dqk = Dv, Sq = Sk and layout bshd or varlen";

  std::vector<int64_t> sq = c.seq_q, sk = c.seq_k;
  if (!varlen) sq.assign(size_t(c.B), c.Sq), sk.assign(size_t(c.B), c.Sk);
  int64_t Tq = 0, Tk = 0, max_sk = 0;
  for (size_t b = 0; b < sq.size(); ++b) Tq += sq[b], Tk += sk[b], max_sk = std::max(max_sk, sk[b]);
  auto shape = [&](int64_t S, int64_t H, int64_t D) {
    if (varlen) return std::vector<int64_t>{S, H, D};
    return bshd_l ? std::vector<int64_t>{c.B, S, H, D} : std::vector<int64_t>{c.B, H, S, D};
  };
  const int hd = varlen ? 1 : bshd_l ? 2 : 1;
  const int64_t nq = varlen ? Tq : c.Sq, nk = varlen ? Tk : c.Sk;
  const std::vector<int64_t> qs = shape(nq, c.Hq, c.Dqk), ks = shape(nk, c.Hkv, c.Dqk), vs = shape(nk, c.Hkv, c.Dv),
                             os = shape(nq, c.Hq, c.Dv);
  const std::vector<int64_t> ls = varlen ? std::vector<int64_t>{c.Hq, Tq} : std::vector<int64_t>{c.B, c.Hq, c.Sq};

  const HostTensor q = random_tensor(t, qs, rng, -2.0, 2.0), k = random_tensor(t, ks, rng, -2.0, 2.0),
                   v = random_tensor(t, vs, rng, -1.0, 1.0), dout = random_tensor(t, os, rng, -1.0, 1.0);
  const HostTensor sinks = random_tensor(F32, {c.Hq}, rng, -2.0, 2.0);
  HostTensor cuq(I32, {int64_t(sq.size()) + 1}), cuk(I32, {int64_t(sq.size()) + 1});
  cuq.set(0, 0), cuk.set(0, 0);
  for (size_t b = 0; b < sq.size(); ++b) cuq.set(b + 1, cuq.get(b) + sq[b]), cuk.set(b + 1, cuk.get(b) + sk[b]);

  AttentionOptions o;
  o.layout = c.layout;
  o.causal = c.causal;
  o.window_left = c.wl, o.window_right = c.wr;
  o.softcap = c.softcap;

  // ---- device tensors --------------------------------------------------------------------------
  const Layout io = c.mem == Mem::kOddStride ? Layout{1, 0} : Layout{};
  const int64_t Ht = c.Hq + 2 * c.Hkv;
  auto make_qkv = [&](Qkv* x, const HostTensor* hq, const HostTensor* hk, const HostTensor* hv) {
    if (fused) {
      x->fused = DeviceTensor(t, shape(nq, Ht, c.Dqk), io);
      if (hq) {
        HostTensor buf(t, shape(nq, Ht, c.Dqk));
        const int64_t rows = buf.numel() / (Ht * c.Dqk);  // tokens
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t e = 0; e < c.Dqk; ++e) {
            for (int64_t h = 0; h < c.Hq; ++h) buf.set((r * Ht + h) * c.Dqk + e, hq->get((r * c.Hq + h) * c.Dqk + e));
            for (int64_t h = 0; h < c.Hkv; ++h) {
              buf.set((r * Ht + c.Hq + h) * c.Dqk + e, hk->get((r * c.Hkv + h) * c.Dqk + e));
              buf.set((r * Ht + c.Hq + c.Hkv + h) * c.Dqk + e, hv->get((r * c.Hkv + h) * c.Dqk + e));
            }
          }
        x->fused.upload(buf);
      }
      x->qv = heads_of(x->fused.view(), hd, 0, c.Hq);
      x->kv = heads_of(x->fused.view(), hd, c.Hq, c.Hkv);
      x->vv = heads_of(x->fused.view(), hd, c.Hq + c.Hkv, c.Hkv);
    } else {
      x->q = DeviceTensor(t, qs, io), x->k = DeviceTensor(t, ks, io), x->v = DeviceTensor(t, vs, io);
      if (hq) x->q.upload(*hq), x->k.upload(*hk), x->v.upload(*hv);
      x->qv = x->q.view(), x->kv = x->k.view(), x->vv = x->v.view();
    }
  };
  Qkv in, grad;
  make_qkv(&in, &q, &k, &v);
  make_qkv(&grad, nullptr, nullptr, nullptr);
  DeviceTensor d_out(t, os, io), d_lse(F32, ls), d_dout(t, os, io), d_sinks(F32, {c.Hq}), d_dsinks(F32, {c.Hq});
  d_dout.upload(dout), d_sinks.upload(sinks);
  DeviceTensor dcuq(I32, cuq.shape), dcuk(I32, cuk.shape);
  dcuq.upload(cuq), dcuk.upload(cuk);
  const TensorView ov = d_out.view(), lv = d_lse.view(), dov = d_dout.view(), sv = d_sinks.view(),
                   dsv = d_dsinks.view(), cqv = dcuq.view(), ckv = dcuk.view();
  AttentionGradTensors gt;
  gt.fwd.q = &in.qv, gt.fwd.k = &in.kv, gt.fwd.v = &in.vv, gt.fwd.out = &ov, gt.fwd.lse = &lv;
  gt.fwd.sinks = c.sinks ? &sv : nullptr;
  gt.fwd.cu_seqlens_q = varlen ? &cqv : nullptr;
  gt.fwd.cu_seqlens_k = varlen ? &ckv : nullptr;
  gt.dout = &dov, gt.dq = &grad.qv, gt.dk = &grad.kv, gt.dv = &grad.vv;
  gt.dsinks = c.sinks ? &dsv : nullptr;

  // ---- the GPU forward: out and lse ------------------------------------------------------------
  {
    size_t bytes = 0;
    KF_ASSERT_OK(kf::attention_forward(gt.fwd, o, nullptr, &bytes, stream_));
    Workspace ws(bytes);
    ASSERT_TRUE(finish(kf::attention_forward(gt.fwd, o, ws.p, &bytes, stream_), "forward"));
  }
  const HostTensor out = d_out.download(), lse = d_lse.download();

  // ---- the float64 reference ------------------------------------------------------------------
  HostTensor want_dq(F64, qs), want_dk(F64, ks), want_dv(F64, vs), want_ds(F64, {c.Hq});
  {
    const HostTensor q64 = to_f64(q), k64 = to_f64(k), v64 = to_f64(v), o64 = to_f64(out), do64 = to_f64(dout);
    const TensorView qv = q64.view(), kv = k64.view(), vv = v64.view(), rov = o64.view(), rlv = lse.view(),
                     rsv = sinks.view(), rcq = cuq.view(), rck = cuk.view(), rdo = do64.view(), rdq = want_dq.view(),
                     rdk = want_dk.view(), rdv = want_dv.view(), rds = want_ds.view();
    AttentionGradTensors rt;
    rt.fwd.q = &qv, rt.fwd.k = &kv, rt.fwd.v = &vv, rt.fwd.out = &rov, rt.fwd.lse = &rlv;
    rt.fwd.sinks = c.sinks ? &rsv : nullptr;
    rt.fwd.cu_seqlens_q = varlen ? &rcq : nullptr;
    rt.fwd.cu_seqlens_k = varlen ? &rck : nullptr;
    rt.dout = &rdo, rt.dq = &rdq, rt.dk = &rdk, rt.dv = &rdv;
    rt.dsinks = c.sinks ? &rds : nullptr;
    KF_ASSERT_OK(ref::attention_backward(rt, o));
  }

  // ---- tolerances (see the top of the file) ----------------------------------------------------
  const double u = t == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double eps = std::ldexp(1.0, -14) + (c.softcap > 0.0f ? c.softcap * std::ldexp(1.0, -10) : 0.0);
  const double flush = t == DType::kFloat16 ? double(std::max(max_sk, Tq)) * std::ldexp(1.0, -24) * 2.0 : 0.0;
  const double rtol = 2.0 * u;
  auto atol = [&](const HostTensor& w) { return (4.0 * u + 8.0 * eps) * max_abs(w) + flush + 1e-7; };
  // dsinks: (2 eps + 2^-13) sum_i p_sink_i |D_i| per head; the dense layouts index like varlen with
  // B = 1 when varlen (out [T, H, Dv] = bshd [1, T, H, Dv], lse [H, T] = [1, H, T]).
  std::vector<double> sink_mag(size_t(c.Hq), 0.0);
  if (c.sinks) {
    const int64_t Bn = varlen ? 1 : c.B, S = varlen ? Tq : c.Sq;
    for (int64_t b = 0; b < Bn; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t row = (bshd_l || varlen) ? ((b * S + i) * c.Hq + h) : ((b * c.Hq + h) * S + i);
          double D = 0.0;
          for (int64_t e = 0; e < c.Dv; ++e) D += dout.get(row * c.Dv + e) * out.get(row * c.Dv + e);
          sink_mag[size_t(h)] += std::exp(sinks.get(h) - lse.get((b * c.Hq + h) * S + i)) * std::fabs(D);
        }
  }
  auto check = [&](const std::string& what) {
    const HostTensor dq = fused ? HostTensor() : grad.q.download();
    if (fused) {  // unpack the fused gradient buffer
      const HostTensor buf = grad.fused.download();
      HostTensor gq(t, qs), gk(t, ks), gv(t, vs);
      const int64_t rows = buf.numel() / (Ht * c.Dqk);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t e = 0; e < c.Dqk; ++e) {
          for (int64_t h = 0; h < c.Hq; ++h) gq.set((r * c.Hq + h) * c.Dqk + e, buf.get((r * Ht + h) * c.Dqk + e));
          for (int64_t h = 0; h < c.Hkv; ++h) {
            gk.set((r * c.Hkv + h) * c.Dqk + e, buf.get((r * Ht + c.Hq + h) * c.Dqk + e));
            gv.set((r * c.Hkv + h) * c.Dqk + e, buf.get((r * Ht + c.Hq + c.Hkv + h) * c.Dqk + e));
          }
        }
      EXPECT_TRUE(compare(what + " dq", gq, want_dq, atol(want_dq), rtol));
      EXPECT_TRUE(compare(what + " dk", gk, want_dk, atol(want_dk), rtol));
      EXPECT_TRUE(compare(what + " dv", gv, want_dv, atol(want_dv), rtol));
      EXPECT_TRUE(grad.fused.check_untouched("dqkv"));
    } else {
      EXPECT_TRUE(compare(what + " dq", dq, want_dq, atol(want_dq), rtol));
      EXPECT_TRUE(compare(what + " dk", grad.k.download(), want_dk, atol(want_dk), rtol));
      EXPECT_TRUE(compare(what + " dv", grad.v.download(), want_dv, atol(want_dv), rtol));
      EXPECT_TRUE(grad.q.check_untouched("dq"));
      EXPECT_TRUE(grad.k.check_untouched("dk"));
      EXPECT_TRUE(grad.v.check_untouched("dv"));
    }
    if (c.sinks) {
      const HostTensor ds = d_dsinks.download();
      for (int64_t h = 0; h < c.Hq; ++h) {
        const double tol = (2.0 * eps + std::ldexp(1.0, -13)) * sink_mag[size_t(h)] + 1e-6;
        EXPECT_LE(std::fabs(ds.get(h) - want_ds.get(h)), tol)
            << what << " dsinks[" << h << "] got " << ds.get(h) << " want " << want_ds.get(h);
      }
    }
  };
  auto poison = [&]() {
    if (fused) {
      grad.fused.poison();
    } else {
      grad.q.poison(), grad.k.poison(), grad.v.poison();
    }
    d_dsinks.poison();
  };
  auto download_all = [&]() {
    std::vector<HostTensor> r;
    if (fused) {
      r.push_back(grad.fused.download());
    } else {
      r.push_back(grad.q.download()), r.push_back(grad.k.download()), r.push_back(grad.v.download());
    }
    r.push_back(d_dsinks.download());
    return r;
  };

  kf::AttentionGradCall call;
  call.t = gt;
  call.opts = o;
  std::vector<AttentionPlan> plans;
  KF_ASSERT_OK(kf::attention_candidate_bwd_plans(call, &plans));
  const bool empty = Tq == 0 || c.Hq == 0;
  EXPECT_EQ(plans.empty(), empty) << plans.size() << " candidate plans";
  // Wherever the wgmma kernel of head dims 64 and 128 runs the call, its paired schedule is a
  // candidate too (the default mode is not deterministic), so the loop below checks it; the
  // 256/256 and 192/128 kernel does not pair.
  {
    bool wgmma = false, paired = false;
    for (const AttentionPlan& pl : plans) {
      wgmma = wgmma || (pl.kind == kf::AttentionKernel::kBwdWgmma && pl.head_dim_qk <= 128);
      paired = paired || pl.order == kf::AttentionOrder::kPaired;
    }
    EXPECT_EQ(paired, wgmma) << "a wgmma plan without its paired candidate, or the reverse";
  }

  // Run 0: the one-call entry (size query, then the run); run 1: plan then run; then every candidate.
  for (size_t run = 0; run < plans.size() + 2; ++run) {
    const std::string name = run == 0   ? std::string("one-call entry")
                             : run == 1 ? std::string("plan-then-run")
                                        : kf::to_string(plans[run - 2]);
    SCOPED_TRACE(name);
    poison();
    if (run == 0) {
      size_t bytes = 0;
      KF_ASSERT_OK(kf::attention_backward(gt, o, nullptr, &bytes, stream_));
      Workspace ws(bytes);
      ASSERT_NE(ws.p, nullptr);
      ASSERT_TRUE(finish(kf::attention_backward(gt, o, ws.p, &bytes, stream_), name));
    } else if (run == 1) {
      AttentionPlan plan;
      size_t bytes = 0;
      KF_ASSERT_OK(kf::attention_backward_plan(gt, o, &plan, &bytes));
      Workspace ws(bytes);
      ASSERT_TRUE(finish(kf::attention_backward(plan, gt, o, ws.p, bytes, stream_), name));
      if (bytes > 0) {
        KF_EXPECT_INVALID(kf::attention_backward(plan, gt, o, ws.p, bytes - 1, stream_),
                          "workspace_bytes must be at least");
        KF_EXPECT_INVALID(kf::attention_backward(plan, gt, o, nullptr, bytes, stream_), "workspace must not be null");
      }
    } else {
      const size_t bytes = plan_workspace(plans[run - 2], call);
      Workspace ws(bytes);
      ASSERT_NE(ws.p, nullptr);
      ASSERT_TRUE(finish(kf::launch_bwd_with_plan(plans[run - 2], call, ws.p, bytes, stream_), name));
    }
    check(name);
    if (HasFatalFailure()) return;
  }

  // Deterministic mode: correct, and two runs give the same bits.
  AttentionOptions det = o;
  det.deterministic = true;
  std::vector<HostTensor> first;
  for (int rep = 0; rep < 2; ++rep) {
    poison();
    size_t bytes = 0;
    KF_ASSERT_OK(kf::attention_backward(gt, det, nullptr, &bytes, stream_));
    Workspace ws(bytes);
    ASSERT_TRUE(finish(kf::attention_backward(gt, det, ws.p, &bytes, stream_), "deterministic"));
    if (rep == 0) {
      check("deterministic");
      first = download_all();
    } else {
      const std::vector<HostTensor> second = download_all();
      for (size_t i = 0; i < first.size(); ++i)
        EXPECT_TRUE(bit_equal("deterministic gradients", first[i], second[i])) << "tensor " << i;
    }
  }

  // the inputs are read only
  if (fused) {
    EXPECT_TRUE(in.fused.check_untouched("qkv"));
  } else {
    EXPECT_TRUE(bit_equal("q is not written", in.q.download(), q));
    EXPECT_TRUE(bit_equal("k is not written", in.k.download(), k));
    EXPECT_TRUE(bit_equal("v is not written", in.v.download(), v));
  }
  EXPECT_TRUE(bit_equal("dout is not written", d_dout.download(), dout));
  EXPECT_TRUE(bit_equal("out is not written", d_out.download(), out));
  EXPECT_TRUE(bit_equal("lse is not written", d_lse.download(), lse));
}

TEST_P(AttentionBwdGpu, Case) { run_case(cases()[size_t(std::get<1>(GetParam()))]); }

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const DType t = std::get<0>(info.param);
  return std::string(t == DType::kBFloat16 ? "bf16_" : "fp16_") + cases()[size_t(std::get<1>(info.param))].name;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionBwdGpu,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Range(0, int(cases().size()))),
                         param_name);

}  // namespace
