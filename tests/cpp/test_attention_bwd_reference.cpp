// The float64 attention backward reference (kernelforge::ref::attention_backward) against central
// finite differences of the float64 forward reference: with L = sum(dout * out(q, k, v, sinks)),
// dq, dk, dv and dsinks are dL/dq, dL/dk, dL/dv and dL/dsinks. Every element of every gradient is
// checked on small shapes covering each feature: causal with Sq != Sk both ways (rows that see no
// key), windows, softcap, sinks, GQA 2 and 4, head dims 64, 128 and 192/128, bshd, bhsd and ragged
// varlen (a sequence without queries, one without keys) and Sk = 0. Then: rows that see no key give
// exact zeros (never NaN), 16-bit gradients are the float64 ones rounded once, and a strided view
// (slices of a fused dqkv buffer) gets the bits of the contiguous call.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
using kernelforge::AttentionGradTensors;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;
using kernelforge::AttentionTensors;

constexpr DType F64 = DType::kFloat64;
constexpr DType F32 = DType::kFloat32;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType I32 = DType::kInt32;
const double kInf = std::numeric_limits<double>::infinity();

// One call's host tensors, in the layout of `o` (contiguous).
struct Prob {
  AttentionOptions o;
  HostTensor q, k, v, out, lse, dout, sinks, cuq, cuk, dq, dk, dv, dsinks;
  bool has_sinks = false;

  AttentionTensors fwd_tensors(TensorView* views) const {
    views[0] = q.view(), views[1] = k.view(), views[2] = v.view(), views[3] = out.view(), views[4] = lse.view();
    views[5] = sinks.view(), views[6] = cuq.view(), views[7] = cuk.view();
    AttentionTensors t;
    t.q = &views[0], t.k = &views[1], t.v = &views[2], t.out = &views[3], t.lse = &views[4];
    t.sinks = has_sinks ? &views[5] : nullptr;
    const bool varlen = o.layout == AttentionLayout::kVarlen;
    t.cu_seqlens_q = varlen ? &views[6] : nullptr;
    t.cu_seqlens_k = varlen ? &views[7] : nullptr;
    return t;
  }
  Status forward() {
    TensorView views[8];
    return ref::attention_forward(fwd_tensors(views), o);
  }
  Status backward() {
    TensorView views[8];
    const TensorView dov = dout.view(), dqv = dq.view(), dkv = dk.view(), dvv = dv.view(), dsv = dsinks.view();
    AttentionGradTensors g;
    g.fwd = fwd_tensors(views);
    g.dout = &dov, g.dq = &dqv, g.dk = &dkv, g.dv = &dvv;
    g.dsinks = has_sinks ? &dsv : nullptr;
    return ref::attention_backward(g, o);
  }
  // L = sum(dout * out) after a fresh forward.
  double loss() {
    EXPECT_TRUE(forward().ok());
    double l = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) l += dout.get(i) * out.get(i);
    return l;
  }
};

// A problem with random q, k in [-2, 2), v, dout in [-1, 1), sinks in [-2, 2). Dense layouts use
// B, Sq, Sk; varlen uses the per-sequence lengths sq, sk.
Prob make(const std::string& seed, AttentionOptions o, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
          int64_t Dqk, int64_t Dv, bool sinks, std::vector<int64_t> sq = {}, std::vector<int64_t> sk = {},
          DType t = F64) {
  Prob p;
  p.o = o;
  p.has_sinks = sinks;
  const bool varlen = o.layout == AttentionLayout::kVarlen, bshd = o.layout == AttentionLayout::kBSHD;
  int64_t Tq = 0, Tk = 0;
  for (size_t b = 0; b < sq.size(); ++b) Tq += sq[b], Tk += sk[b];
  auto shape = [&](int64_t S, int64_t H, int64_t D) {
    if (varlen) return std::vector<int64_t>{S, H, D};
    return bshd ? std::vector<int64_t>{B, S, H, D} : std::vector<int64_t>{B, H, S, D};
  };
  const int64_t nq = varlen ? Tq : Sq, nk = varlen ? Tk : Sk;
  Rng rng(hash_str(seed));
  p.q = random_tensor(t, shape(nq, Hq, Dqk), rng, -2.0, 2.0);
  p.k = random_tensor(t, shape(nk, Hkv, Dqk), rng, -2.0, 2.0);
  p.v = random_tensor(t, shape(nk, Hkv, Dv), rng, -1.0, 1.0);
  p.dout = random_tensor(t, shape(nq, Hq, Dv), rng, -1.0, 1.0);
  p.sinks = random_tensor(F64, {Hq}, rng, -2.0, 2.0);
  p.out = HostTensor(t, shape(nq, Hq, Dv));
  p.lse = varlen ? HostTensor(F64, {Hq, Tq}) : HostTensor(F64, {B, Hq, Sq});
  p.dq = HostTensor(t, p.q.shape), p.dk = HostTensor(t, p.k.shape), p.dv = HostTensor(t, p.v.shape);
  p.dsinks = HostTensor(F64, {Hq});
  p.cuq = HostTensor(I32, {int64_t(sq.size()) + 1}), p.cuk = HostTensor(I32, {int64_t(sq.size()) + 1});
  p.cuq.set(0, 0), p.cuk.set(0, 0);
  for (size_t b = 0; b < sq.size(); ++b) p.cuq.set(b + 1, p.cuq.get(b) + sq[b]), p.cuk.set(b + 1, p.cuk.get(b) + sk[b]);
  return p;
}

// Every element of `grad` against (L(x + h) - L(x - h)) / 2h, perturbing `x` (a tensor of p).
// Central differences in float64 with h = 1e-5: truncation h^2 |L'''| / 6 and cancellation
// 1e-16 |L| / h stay below 1e-8 for these O(1)..O(10) losses; the tolerance is 1e-7 + 1e-6 |grad|.
::testing::AssertionResult check_fd(const char* what, Prob& p, HostTensor* x, const HostTensor& grad) {
  const double h = 1e-5;
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const double x0 = x->get(i);
    x->set(i, x0 + h);
    const double lp = p.loss();
    x->set(i, x0 - h);
    const double lm = p.loss();
    x->set(i, x0);
    const double fd = (lp - lm) / (2.0 * h), g = grad.get(i);
    if (std::isfinite(g) && std::fabs(g - fd) <= 1e-7 + 1e-6 * std::fabs(fd)) continue;
    if (bad++ < 6) first += "\n    [" + std::to_string(i) + "] got " + std::to_string(g) + " fd " + std::to_string(fd);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << x->numel() << " elements off" << first;
}

void expect_fd(Prob p, const char* name) {
  SCOPED_TRACE(name);
  KF_ASSERT_OK(p.forward());
  KF_ASSERT_OK(p.backward());
  EXPECT_TRUE(check_fd("dq", p, &p.q, p.dq));
  EXPECT_TRUE(check_fd("dk", p, &p.k, p.dk));
  EXPECT_TRUE(check_fd("dv", p, &p.v, p.dv));
  if (p.has_sinks) {
    EXPECT_TRUE(check_fd("dsinks", p, &p.sinks, p.dsinks));
  }
}

AttentionOptions opts(AttentionLayout l = AttentionLayout::kBSHD) {
  AttentionOptions o;
  o.layout = l;
  return o;
}

TEST(AttentionBwdReference, FiniteDifferencesDense) {
  expect_fd(make("plain", opts(), 2, 3, 4, 2, 2, 64, 64, false), "plain mha");
  AttentionOptions c = opts();
  c.causal = true;  // Sq > Sk: rows 0 and 1 see no key (lse = -inf); GQA 2
  expect_fd(make("causal_sq_gt_sk", c, 1, 5, 3, 2, 1, 64, 64, false), "causal sq > sk, gqa 2");
  AttentionOptions cb = opts(AttentionLayout::kBHSD);
  cb.causal = true;
  expect_fd(make("causal_sq_lt_sk", cb, 1, 3, 5, 4, 1, 128, 128, false), "causal sq < sk, gqa 4, bhsd, d128");
  AttentionOptions w = opts();
  w.window_left = 1, w.window_right = 1, w.softcap = 2.0f, w.scale = 0.3f;
  expect_fd(make("window_softcap", w, 1, 5, 5, 2, 1, 64, 64, false), "window 1/1, softcap, scale");
  expect_fd(make("sinks_causal", c, 2, 4, 2, 2, 1, 64, 64, true), "sinks, causal sq > sk (rows with only the sink)");
  AttentionOptions m = opts();
  m.causal = true, m.window_left = 2;
  expect_fd(make("mla", m, 1, 3, 6, 2, 2, 192, 128, true), "d192/128, causal, window left 2 (keys no row sees)");
  AttentionOptions s = opts();
  s.softcap = 1.5f;
  expect_fd(make("softcap_sinks_gqa4", s, 1, 3, 3, 4, 1, 64, 64, true), "softcap, sinks, gqa 4");
}

TEST(AttentionBwdReference, FiniteDifferencesVarlenAndEmptyKeys) {
  AttentionOptions v = opts(AttentionLayout::kVarlen);
  v.causal = true;
  // sequence 1 has keys but no query (dk = dv = 0), sequence 2 queries but no key (dq = 0)
  expect_fd(make("varlen", v, 4, 0, 0, 4, 2, 64, 64, true, {3, 0, 2, 4}, {5, 3, 0, 4}), "varlen ragged, causal, sinks");
  AttentionOptions w = opts(AttentionLayout::kVarlen);
  w.window_left = 1, w.softcap = 3.0f;
  expect_fd(make("varlen_window", w, 3, 0, 0, 2, 2, 64, 64, false, {2, 4, 1}, {4, 2, 3}), "varlen window, softcap");
  // Sk = 0: out = 0, so dq = 0 and dsinks = -sum p_sink D = 0
  Prob e = make("sk0", opts(), 1, 2, 0, 2, 1, 64, 64, true);
  expect_fd(e, "sk = 0 with sinks");
  KF_ASSERT_OK(e.forward());
  KF_ASSERT_OK(e.backward());
  for (int64_t i = 0; i < e.dq.numel(); ++i) ASSERT_EQ(e.dq.get(i), 0.0) << i;
  for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(e.dsinks.get(h), 0.0) << h;
}

// Rows that see no key and have no sink (lse = -inf) contribute nothing: their dq is exactly 0,
// and no gradient is NaN; keys no row sees get dk = dv = 0.
TEST(AttentionBwdReference, MaskedRowsGiveZeros) {
  AttentionOptions c = opts();
  c.causal = true;
  c.window_left = 0;  // Sq 6 > Sk 4, d = -2: rows 0, 1 see nothing, row i >= 2 sees only key i - 2
  Prob p = make("masked", c, 1, 6, 4, 2, 1, 64, 64, false);
  KF_ASSERT_OK(p.forward());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 2; ++i) ASSERT_EQ(p.lse.get(h * 6 + i), -kInf);
  KF_ASSERT_OK(p.backward());  // the gradients start as NaN (HostTensor's poison)
  for (const HostTensor* g : {&p.dq, &p.dk, &p.dv})
    for (int64_t i = 0; i < g->numel(); ++i) ASSERT_TRUE(std::isfinite(g->get(i))) << i;
  for (int64_t e = 0; e < 2 * 2 * 64; ++e) EXPECT_EQ(p.dq.get(e), 0.0) << "rows 0 and 1, element " << e;
  // one visible key per row: p = 1 and out = v, so ds = dout . v - dout . out = 0 and dq = 0
  for (int64_t i = 0; i < p.dq.numel(); ++i) EXPECT_NEAR(p.dq.get(i), 0.0, 1e-14) << i;
  expect_fd(p, "masked rows");

  AttentionOptions w = opts();
  w.window_left = 0, w.window_right = 0;  // Sq 2 < Sk 6, d = 4: rows see keys 4 and 5 only
  Prob u = make("unseen", w, 1, 2, 6, 2, 2, 64, 64, false);
  KF_ASSERT_OK(u.forward());
  KF_ASSERT_OK(u.backward());
  for (int64_t i = 0; i < 4 * 2 * 64; ++i) {
    EXPECT_EQ(u.dk.get(i), 0.0) << "keys 0..3 are seen by no row, element " << i;
    EXPECT_EQ(u.dv.get(i), 0.0) << "keys 0..3 are seen by no row, element " << i;
  }
}

// 16-bit gradients are the float64 gradients on the same (16-bit valued) inputs, rounded once.
TEST(AttentionBwdReference, RoundsOnce) {
  AttentionOptions o = opts();
  o.causal = true, o.softcap = 3.0f;
  Prob h = make("round", o, 1, 5, 7, 2, 1, 128, 128, true, {}, {}, BF16);
  KF_ASSERT_OK(h.forward());
  Prob d = h;
  for (HostTensor* x : {&d.q, &d.k, &d.v, &d.out, &d.dout, &d.dq, &d.dk, &d.dv}) {
    HostTensor y(F64, x->shape);
    for (int64_t i = 0; i < x->numel(); ++i) y.set(i, x->get(i));
    *x = y;
  }
  KF_ASSERT_OK(h.backward());
  KF_ASSERT_OK(d.backward());
  for (int64_t i = 0; i < h.dq.numel(); ++i) ASSERT_EQ(h.dq.get(i), round_to(BF16, d.dq.get(i))) << i;
  for (int64_t i = 0; i < h.dk.numel(); ++i) ASSERT_EQ(h.dk.get(i), round_to(BF16, d.dk.get(i))) << i;
  for (int64_t i = 0; i < h.dv.numel(); ++i) ASSERT_EQ(h.dv.get(i), round_to(BF16, d.dv.get(i))) << i;
  h.dsinks = HostTensor(F32, {2});
  KF_ASSERT_OK(h.backward());
  for (int64_t i = 0; i < 2; ++i) ASSERT_EQ(h.dsinks.get(i), round_to(F32, d.dsinks.get(i))) << i;
}

// dq, dk, dv as head slices of one fused [B, S, Hq + 2 Hkv, D] buffer, dout with padded rows: the
// bits of the contiguous call, and the padding is never written.
TEST(AttentionBwdReference, StridedViews) {
  const int64_t B = 2, S = 5, Hq = 4, Hkv = 2, D = 64, Ht = Hq + 2 * Hkv;
  AttentionOptions o = opts();
  o.causal = true;
  Prob c = make("strided", o, B, S, S, Hq, Hkv, D, D, true);
  KF_ASSERT_OK(c.forward());
  KF_ASSERT_OK(c.backward());
  HostTensor buf(F64, {B, S, Ht, D}), dobuf(F64, {B, S, Hq, D + 8});
  for (int64_t r = 0; r < B * S * Hq; ++r)
    for (int64_t e = 0; e < D; ++e) dobuf.set(r * (D + 8) + e, c.dout.get(r * D + e));
  TensorView views[8];
  const AttentionTensors ft = c.fwd_tensors(views);
  TensorView dq = buf.view(), dk = buf.view(), dv = buf.view(), dov = dobuf.view();
  const TensorView dsv = c.dsinks.view();
  auto heads = [&](TensorView* x, int64_t h0, int64_t H) {
    x->data = static_cast<double*>(x->data) + h0 * D;
    x->shape[2] = H;
  };
  heads(&dq, 0, Hq), heads(&dk, Hq, Hkv), heads(&dv, Hq + Hkv, Hkv);
  dov.shape[3] = D;
  AttentionGradTensors g;
  g.fwd = ft;
  g.dout = &dov, g.dq = &dq, g.dk = &dk, g.dv = &dv, g.dsinks = &dsv;
  KF_ASSERT_OK(ref::attention_backward(g, o));
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t h = 0; h < Ht; ++h)
      for (int64_t e = 0; e < D; ++e) {
        const double got = buf.get((r * Ht + h) * D + e);
        const double want = h < Hq         ? c.dq.get((r * Hq + h) * D + e)
                            : h < Hq + Hkv ? c.dk.get((r * Hkv + h - Hq) * D + e)
                                           : c.dv.get((r * Hkv + h - Hq - Hkv) * D + e);
        ASSERT_EQ(got, want) << "token " << r << " head " << h << " col " << e;
      }
}

// cu_seqlens are read on the host and checked by the backward reference too.
TEST(AttentionBwdReference, BadCuSeqlens) {
  Prob p = make("cu", opts(AttentionLayout::kVarlen), 2, 0, 0, 2, 1, 64, 64, false, {2, 3}, {3, 2});
  KF_ASSERT_OK(p.forward());
  KF_ASSERT_OK(p.backward());
  p.cuq.set(1, 4), p.cuq.set(2, 3);
  KF_EXPECT_INVALID(p.backward(), "attention_backward: cu_seqlens_q must be non-decreasing, got 4 then 3 at index 1");
}

}  // namespace
