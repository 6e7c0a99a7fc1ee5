// The float64 attention reference (kernelforge::ref::attention_forward) on hand-computed cases: the
// softmax of one and two keys, the bottom-right causal mask with Sq != Sk (rows that see no key),
// sliding windows, softcap, sinks, the GQA head mapping, varlen against per-sequence dense calls,
// layouts and strided views against contiguous bshd, the single rounding of 16-bit outputs, and the
// cu_seqlens checks only the reference can make (it reads them on the host).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::AttentionLayout;
using kernelforge::AttentionOptions;
using kernelforge::AttentionTensors;
using kernelforge::StatusCode;

constexpr DType F64 = DType::kFloat64;
constexpr DType F32 = DType::kFloat32;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType I32 = DType::kInt32;
const double kInf = std::numeric_limits<double>::infinity();

// The tensors of one reference call (host memory).
struct Call {
  HostTensor q, k, v, out, lse, sinks, cuq, cuk;
  bool has_lse = true, has_sinks = false;
  AttentionOptions o;

  Status run() {
    const TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = out.view(), lv = lse.view(), sv = sinks.view(),
                     cqv = cuq.view(), ckv = cuk.view();
    AttentionTensors t;
    t.q = &qv, t.k = &kv, t.v = &vv, t.out = &ov;
    t.lse = has_lse ? &lv : nullptr;
    t.sinks = has_sinks ? &sv : nullptr;
    const bool varlen = o.layout == AttentionLayout::kVarlen;
    t.cu_seqlens_q = varlen ? &cqv : nullptr;
    t.cu_seqlens_k = varlen ? &ckv : nullptr;
    return ref::attention_forward(t, o);
  }
};

// A dense bshd call: q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D], every value `fill` (or 0).
Call dense(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, DType t = F64) {
  Call c;
  c.q = HostTensor(t, {B, Sq, Hq, D});
  c.k = HostTensor(t, {B, Sk, Hkv, D});
  c.v = HostTensor(t, {B, Sk, Hkv, D});
  c.out = HostTensor(t, {B, Sq, Hq, D});
  c.lse = HostTensor(F64, {B, Hq, Sq});
  for (HostTensor* x : {&c.q, &c.k, &c.v})
    for (int64_t i = 0; i < x->numel(); ++i) x->set(i, 0.0);
  return c;
}

void fill_random(HostTensor* x, Rng& rng, double lo = -2.0, double hi = 2.0) {
  for (int64_t i = 0; i < x->numel(); ++i) x->set(i, rng.uniform(lo, hi));
}

// Element (b, s, h, e) of a contiguous bshd tensor.
int64_t at(const HostTensor& x, int64_t b, int64_t s, int64_t h, int64_t e) {
  return ((b * x.shape[1] + s) * x.shape[2] + h) * x.shape[3] + e;
}

TEST(AttentionReference, OneQueryOneKey) {
  Call c = dense(1, 1, 1, 1, 1, 64);
  for (int64_t e = 0; e < 64; ++e) c.q.set(e, 0.5), c.k.set(e, 0.5), c.v.set(e, 0.25 * e - 3.0);
  KF_ASSERT_OK(c.run());  // s = (1 / sqrt(64)) * 64 * 0.25 = 2; softmax of one key is 1
  for (int64_t e = 0; e < 64; ++e) EXPECT_EQ(c.out.get(e), 0.25 * e - 3.0) << e;
  EXPECT_EQ(c.lse.get(0), 2.0);
  c.o.scale = 0.5f;  // s = 0.5 * 16 = 8
  KF_ASSERT_OK(c.run());
  EXPECT_EQ(c.lse.get(0), 8.0);
}

TEST(AttentionReference, TwoByTwoSoftmax) {
  Call c = dense(1, 2, 2, 1, 1, 64);
  c.o.scale = 1.0f;
  // q0 = e0, q1 = e1; k0 = e0 + 2 e1, k1 = -e1: s = [[1, 0], [2, -1]]
  c.q.set(at(c.q, 0, 0, 0, 0), 1.0), c.q.set(at(c.q, 0, 1, 0, 1), 1.0);
  c.k.set(at(c.k, 0, 0, 0, 0), 1.0), c.k.set(at(c.k, 0, 0, 0, 1), 2.0), c.k.set(at(c.k, 0, 1, 0, 1), -1.0);
  for (int64_t e = 0; e < 64; ++e) c.v.set(at(c.v, 0, 0, 0, e), e), c.v.set(at(c.v, 0, 1, 0, e), -2.0 * e);
  KF_ASSERT_OK(c.run());
  const double s[2][2] = {{1, 0}, {2, -1}};
  for (int i = 0; i < 2; ++i) {
    const double l = std::exp(s[i][0]) + std::exp(s[i][1]);
    const double p0 = std::exp(s[i][0]) / l, p1 = std::exp(s[i][1]) / l;
    EXPECT_NEAR(c.lse.get(i), std::log(l), 1e-14) << "row " << i;
    for (int64_t e = 0; e < 64; ++e)
      EXPECT_NEAR(c.out.get(at(c.out, 0, i, 0, e)), p0 * e + p1 * (-2.0 * e), 1e-12) << "row " << i << " col " << e;
  }
}

// With q = 0 every score is 0: out_i is the mean of the visible v_j and lse_i = log(#visible).
// `visible[i]` lists row i's keys by hand; v_j[e] = j + 1 + e / 64.
void expect_visible(int64_t Sq, int64_t Sk, AttentionOptions o, const std::vector<std::vector<int>>& visible,
                    const char* what) {
  SCOPED_TRACE(what);
  Call c = dense(1, Sq, Sk, 1, 1, 64);
  c.o = o;
  for (int64_t j = 0; j < Sk; ++j)
    for (int64_t e = 0; e < 64; ++e) c.v.set(at(c.v, 0, j, 0, e), j + 1 + e / 64.0);
  KF_ASSERT_OK(c.run());
  for (int64_t i = 0; i < Sq; ++i) {
    const std::vector<int>& vis = visible[i];
    if (vis.empty()) {
      EXPECT_EQ(c.lse.get(i), -kInf) << "row " << i << " sees no key";
      for (int64_t e = 0; e < 64; ++e) EXPECT_EQ(c.out.get(at(c.out, 0, i, 0, e)), 0.0) << "row " << i;
      continue;
    }
    EXPECT_NEAR(c.lse.get(i), std::log(double(vis.size())), 1e-14) << "row " << i;
    for (int64_t e = 0; e < 64; ++e) {
      double mean = 0;
      for (int j : vis) mean += (j + 1 + e / 64.0) / vis.size();
      EXPECT_NEAR(c.out.get(at(c.out, 0, i, 0, e)), mean, 1e-13) << "row " << i << " col " << e;
    }
  }
}

TEST(AttentionReference, CausalBottomRight) {
  AttentionOptions o;
  o.causal = true;
  expect_visible(3, 3, o, {{0}, {0, 1}, {0, 1, 2}}, "square");
  // Sq > Sk: d = -2, row i sees j <= i - 2; the top two rows see nothing
  expect_visible(4, 2, o, {{}, {}, {0}, {0, 1}}, "sq > sk");
  expect_visible(3, 1, o, {{}, {}, {0}}, "sq 3 sk 1");
  // Sq < Sk: d = 2, row i sees j <= i + 2
  expect_visible(2, 4, o, {{0, 1, 2}, {0, 1, 2, 3}}, "sq < sk");
  expect_visible(1, 5, o, {{0, 1, 2, 3, 4}}, "decode");
  AttentionOptions w;
  w.window_right = 0;  // the same mask without the flag
  expect_visible(4, 2, w, {{}, {}, {0}, {0, 1}}, "window_right 0");
}

TEST(AttentionReference, Window) {
  AttentionOptions o;
  o.window_left = 2;
  expect_visible(4, 4, o, {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {1, 2, 3}}, "left 2");
  o.window_right = 1;
  o.window_left = 1;
  expect_visible(4, 4, o, {{0, 1}, {0, 1, 2}, {1, 2, 3}, {2, 3}}, "left 1 right 1");
  o.window_left = 0;
  o.window_right = 0;
  expect_visible(3, 3, o, {{0}, {1}, {2}}, "left 0 right 0: the diagonal");
  AttentionOptions c;
  c.causal = true;
  c.window_left = 1;  // d = 2: row i sees i + 1 <= j <= i + 2
  expect_visible(3, 5, c, {{1, 2}, {2, 3}, {3, 4}}, "causal left 1, sq < sk");
  c.window_left = 0;  // d = -1: row i sees only j = i - 1
  expect_visible(3, 2, c, {{}, {0}, {1}}, "causal left 0, sq > sk");
  AttentionOptions r;
  r.window_right = 1;  // d = 0, no left bound
  expect_visible(3, 3, r, {{0, 1}, {0, 1, 2}, {0, 1, 2}}, "right 1");
}

TEST(AttentionReference, Softcap) {
  Call c = dense(1, 1, 2, 1, 1, 64);
  c.o.scale = 1.0f;
  c.o.softcap = 5.0f;
  c.q.set(0, 1.0);
  c.k.set(at(c.k, 0, 0, 0, 0), 10.0);  // s0 = 10 -> 5 tanh(2); s1 = 0 -> 0
  for (int64_t e = 0; e < 64; ++e) c.v.set(at(c.v, 0, 0, 0, e), 1.0), c.v.set(at(c.v, 0, 1, 0, e), -1.0);
  KF_ASSERT_OK(c.run());
  const double s0 = 5.0 * std::tanh(2.0), l = std::exp(s0) + 1.0;
  EXPECT_NEAR(c.lse.get(0), std::log(l), 1e-14);
  for (int64_t e = 0; e < 64; ++e) EXPECT_NEAR(c.out.get(e), (std::exp(s0) - 1.0) / l, 1e-14);
}

TEST(AttentionReference, Sinks) {
  // One key with s = 0 and a sink logit of 1: l = e + 1 over m = 1, out = v / (1 + e), lse = log(1 + e).
  Call c = dense(1, 1, 1, 2, 1, 64);
  c.has_sinks = true;
  c.sinks = HostTensor(F32, {2});
  c.sinks.set(0, 1.0), c.sinks.set(1, -kInf);  // head 1: a sink of -inf is no sink
  for (int64_t e = 0; e < 64; ++e) c.v.set(e, e + 1.0);
  KF_ASSERT_OK(c.run());
  EXPECT_NEAR(c.lse.get(0), std::log(1.0 + std::exp(1.0)), 1e-14);
  EXPECT_EQ(c.lse.get(1), 0.0);
  for (int64_t e = 0; e < 64; ++e) {
    EXPECT_NEAR(c.out.get(at(c.out, 0, 0, 0, e)), (e + 1.0) / (1.0 + std::exp(1.0)), 1e-13);
    EXPECT_EQ(c.out.get(at(c.out, 0, 0, 1, e)), e + 1.0);
  }
  // A fully masked row (causal, Sq 2 > Sk 1: row 0 sees nothing): out = 0, lse = the sink.
  Call m = dense(1, 2, 1, 1, 1, 64);
  m.o.causal = true;
  m.has_sinks = true;
  m.sinks = HostTensor(F64, {1});
  m.sinks.set(0, 0.75);
  for (int64_t e = 0; e < 64; ++e) m.v.set(e, 3.0);
  KF_ASSERT_OK(m.run());
  EXPECT_EQ(m.lse.get(0), 0.75);
  EXPECT_NEAR(m.lse.get(1), std::log(std::exp(0.75) + 1.0), 1e-14);
  for (int64_t e = 0; e < 64; ++e) {
    EXPECT_EQ(m.out.get(at(m.out, 0, 0, 0, e)), 0.0);
    EXPECT_NEAR(m.out.get(at(m.out, 0, 1, 0, e)), 3.0 / (std::exp(0.75) + 1.0), 1e-14);
  }
}

TEST(AttentionReference, EmptyKeys) {
  // Sk = 0: every row sees no key: out = 0, lse = -inf (or the sink).
  Call c = dense(2, 3, 0, 2, 1, 128);
  KF_ASSERT_OK(c.run());
  for (int64_t i = 0; i < c.out.numel(); ++i) ASSERT_EQ(c.out.get(i), 0.0);
  for (int64_t i = 0; i < c.lse.numel(); ++i) ASSERT_EQ(c.lse.get(i), -kInf);
  c.has_sinks = true;
  c.sinks = HostTensor(F64, {2});
  c.sinks.set(0, -0.5), c.sinks.set(1, 2.0);
  KF_ASSERT_OK(c.run());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(c.lse.get((b * 2 + 1) * 3 + i), 2.0);
  for (int64_t i = 0; i < c.out.numel(); ++i) ASSERT_EQ(c.out.get(i), 0.0);
  // An empty batch writes nothing
  Call e = dense(0, 3, 4, 2, 1, 64);
  KF_ASSERT_OK(e.run());
}

TEST(AttentionReference, GqaHeadMapping) {
  // q = 0: out of query head h is the mean of the values of kv head h / 4; kv head g holds g + 1.
  Call c = dense(1, 3, 5, 8, 2, 64);
  for (int64_t j = 0; j < 5; ++j)
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t e = 0; e < 64; ++e) c.v.set(at(c.v, 0, j, g, e), g + 1.0);
  KF_ASSERT_OK(c.run());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t h = 0; h < 8; ++h) EXPECT_NEAR(c.out.get(at(c.out, 0, i, h, 7)), h / 4 + 1.0, 1e-15) << "head " << h;
  // random q / k / v: equal to multi-head attention on k, v with every kv head repeated 4 times
  Rng rng(hash_str("gqa"));
  Call g = dense(2, 6, 9, 8, 2, 96);
  fill_random(&g.q, rng), fill_random(&g.k, rng), fill_random(&g.v, rng);
  g.o.causal = true;
  Call m = dense(2, 6, 9, 8, 8, 96);
  m.q = g.q;
  m.o = g.o;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 9; ++j)
      for (int64_t h = 0; h < 8; ++h)
        for (int64_t e = 0; e < 96; ++e) {
          m.k.set(at(m.k, b, j, h, e), g.k.get(at(g.k, b, j, h / 4, e)));
          m.v.set(at(m.v, b, j, h, e), g.v.get(at(g.v, b, j, h / 4, e)));
        }
  KF_ASSERT_OK(g.run());
  KF_ASSERT_OK(m.run());
  EXPECT_TRUE(bit_equal("out", g.out, m.out));
  EXPECT_TRUE(bit_equal("lse", g.lse, m.lse));
}

// Varlen equals one dense call per sequence (the same arithmetic: bit-equal), with empty sequences
// on either side, under plain, causal and windowed masks.
TEST(AttentionReference, VarlenEqualsDense) {
  const std::vector<int64_t> sq = {3, 0, 5, 2, 4}, sk = {4, 2, 6, 0, 4};
  const int64_t Hq = 4, Hkv = 2, Dqk = 192, Dv = 128, B = int64_t(sq.size());
  int64_t Tq = 0, Tk = 0;
  for (int64_t b = 0; b < B; ++b) Tq += sq[b], Tk += sk[b];
  Rng rng(hash_str("varlen"));
  Call c;
  c.o.layout = AttentionLayout::kVarlen;
  c.q = HostTensor(F64, {Tq, Hq, Dqk});
  c.k = HostTensor(F64, {Tk, Hkv, Dqk});
  c.v = HostTensor(F64, {Tk, Hkv, Dv});
  c.out = HostTensor(F64, {Tq, Hq, Dv});
  c.lse = HostTensor(F32, {Hq, Tq});
  c.has_sinks = true;
  c.sinks = HostTensor(F64, {Hq});
  fill_random(&c.q, rng), fill_random(&c.k, rng), fill_random(&c.v, rng), fill_random(&c.sinks, rng);
  c.cuq = HostTensor(I32, {B + 1});
  c.cuk = HostTensor(I32, {B + 1});
  c.cuq.set(0, 0), c.cuk.set(0, 0);
  for (int64_t b = 0; b < B; ++b) c.cuq.set(b + 1, c.cuq.get(b) + sq[b]), c.cuk.set(b + 1, c.cuk.get(b) + sk[b]);

  for (int mask = 0; mask < 3; ++mask) {
    SCOPED_TRACE(mask == 0 ? "no mask" : mask == 1 ? "causal" : "window 1, 0");
    c.o.causal = mask == 1;
    c.o.window_left = mask == 2 ? 1 : -1;
    c.o.window_right = mask == 2 ? 0 : -1;
    c.o.max_seqlen_q = mask == 1 ? 5 : 0;  // a bound that holds changes nothing
    KF_ASSERT_OK(c.run());
    for (int64_t b = 0, q0 = 0, k0 = 0; b < B; q0 += sq[b], k0 += sk[b], ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      Call d;
      d.q = HostTensor(F64, {1, sq[b], Hq, Dqk});
      d.k = HostTensor(F64, {1, sk[b], Hkv, Dqk});
      d.v = HostTensor(F64, {1, sk[b], Hkv, Dv});
      d.out = HostTensor(F64, {1, sq[b], Hq, Dv});
      d.lse = HostTensor(F32, {1, Hq, sq[b]});
      d.has_sinks = true;
      d.sinks = c.sinks;
      d.o = c.o;
      d.o.layout = AttentionLayout::kBSHD;
      d.o.max_seqlen_q = 0;
      for (int64_t i = 0; i < sq[b] * Hq * Dqk; ++i) d.q.set(i, c.q.get(q0 * Hq * Dqk + i));
      for (int64_t i = 0; i < sk[b] * Hkv * Dqk; ++i) d.k.set(i, c.k.get(k0 * Hkv * Dqk + i));
      for (int64_t i = 0; i < sk[b] * Hkv * Dv; ++i) d.v.set(i, c.v.get(k0 * Hkv * Dv + i));
      KF_ASSERT_OK(d.run());
      for (int64_t i = 0; i < sq[b] * Hq * Dv; ++i)
        ASSERT_EQ(d.out.get(i), c.out.get(q0 * Hq * Dv + i)) << "out element " << i;
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < sq[b]; ++i)
          ASSERT_EQ(d.lse.get(h * sq[b] + i), c.lse.get(h * Tq + q0 + i)) << "lse head " << h << " row " << i;
    }
  }
}

// bhsd and a strided bshd view (the q / k / v heads of one fused [B, S, Hq + 2 Hkv, D] buffer, out
// and lse in padded buffers) give the bits of the contiguous bshd call.
TEST(AttentionReference, LayoutsAndStridedViews) {
  const int64_t B = 2, S = 7, Hq = 6, Hkv = 3, D = 64, Ht = Hq + 2 * Hkv;
  Rng rng(hash_str("layouts"));
  Call c = dense(B, S, S, Hq, Hkv, D);
  fill_random(&c.q, rng), fill_random(&c.k, rng), fill_random(&c.v, rng);
  c.o.window_left = 3;
  KF_ASSERT_OK(c.run());

  // bhsd: transposed copies
  Call t;
  t.o = c.o;
  t.o.layout = AttentionLayout::kBHSD;
  auto transpose = [](const HostTensor& x) {  // [B, S, H, D] -> [B, H, S, D]
    HostTensor y(x.dtype, {x.shape[0], x.shape[2], x.shape[1], x.shape[3]});
    for (int64_t b = 0; b < x.shape[0]; ++b)
      for (int64_t s = 0; s < x.shape[1]; ++s)
        for (int64_t h = 0; h < x.shape[2]; ++h)
          for (int64_t e = 0; e < x.shape[3]; ++e)
            y.set(((b * x.shape[2] + h) * x.shape[1] + s) * x.shape[3] + e, x.get(at(x, b, s, h, e)));
    return y;
  };
  t.q = transpose(c.q), t.k = transpose(c.k), t.v = transpose(c.v);
  t.out = HostTensor(F64, {B, Hq, S, D});
  t.lse = HostTensor(F64, {B, Hq, S});
  KF_ASSERT_OK(t.run());
  EXPECT_TRUE(bit_equal("bhsd out", transpose(t.out), c.out));
  EXPECT_TRUE(bit_equal("bhsd lse", t.lse, c.lse));

  // fused qkv, padded out rows, padded lse rows
  HostTensor qkv(F64, {B, S, Ht, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t e = 0; e < D; ++e) {
        for (int64_t h = 0; h < Hq; ++h) qkv.set(at(qkv, b, s, h, e), c.q.get(at(c.q, b, s, h, e)));
        for (int64_t h = 0; h < Hkv; ++h) {
          qkv.set(at(qkv, b, s, Hq + h, e), c.k.get(at(c.k, b, s, h, e)));
          qkv.set(at(qkv, b, s, Hq + Hkv + h, e), c.v.get(at(c.v, b, s, h, e)));
        }
      }
  HostTensor outbuf(F64, {B, S, Hq, D + 8}), lsebuf(F64, {B, Hq, S + 3});
  TensorView qv = qkv.view(), kv = qkv.view(), vv = qkv.view(), ov = outbuf.view(), lv = lsebuf.view();
  auto heads = [&](TensorView* x, int64_t h0, int64_t H) {
    x->data = static_cast<double*>(x->data) + h0 * D;
    x->shape[2] = H;
  };
  heads(&qv, 0, Hq), heads(&kv, Hq, Hkv), heads(&vv, Hq + Hkv, Hkv);
  ov.shape[3] = D;
  lv.shape[2] = S;
  AttentionTensors views;
  views.q = &qv, views.k = &kv, views.v = &vv, views.out = &ov, views.lse = &lv;
  KF_ASSERT_OK(ref::attention_forward(views, c.o));
  for (int64_t r = 0; r < B * S * Hq; ++r)
    for (int64_t e = 0; e < D + 8; ++e) {
      const double got = outbuf.get(r * (D + 8) + e);
      if (e < D)
        ASSERT_EQ(got, c.out.get(r * D + e)) << "out row " << r << " col " << e;
      else
        ASSERT_TRUE(std::isnan(got)) << "padding of out row " << r << " was written";
    }
  for (int64_t r = 0; r < B * Hq; ++r)
    for (int64_t i = 0; i < S + 3; ++i) {
      const double got = lsebuf.get(r * (S + 3) + i);
      if (i < S)
        ASSERT_EQ(got, c.lse.get(r * S + i)) << "lse row " << r << " col " << i;
      else
        ASSERT_TRUE(std::isnan(got)) << "padding of lse row " << r << " was written";
    }
}

// 16-bit inputs are read exactly and the output is rounded once: bfloat16 out equals the float64
// result on the same (bfloat16-valued) inputs rounded to bfloat16; lse is float32.
TEST(AttentionReference, RoundsOnce) {
  Rng rng(hash_str("round"));
  Call h = dense(1, 5, 9, 2, 1, 128, BF16);
  h.lse = HostTensor(F32, {1, 2, 5});
  fill_random(&h.q, rng), fill_random(&h.k, rng), fill_random(&h.v, rng);
  h.o.softcap = 3.0f;
  Call d = dense(1, 5, 9, 2, 1, 128, F64);
  d.o = h.o;
  for (int64_t i = 0; i < h.q.numel(); ++i) d.q.set(i, h.q.get(i));
  for (int64_t i = 0; i < h.k.numel(); ++i) d.k.set(i, h.k.get(i)), d.v.set(i, h.v.get(i));
  KF_ASSERT_OK(h.run());
  KF_ASSERT_OK(d.run());
  for (int64_t i = 0; i < h.out.numel(); ++i) ASSERT_EQ(h.out.get(i), round_to(BF16, d.out.get(i))) << i;
  for (int64_t i = 0; i < h.lse.numel(); ++i) ASSERT_EQ(h.lse.get(i), round_to(F32, d.lse.get(i))) << i;
}

// cu_seqlens are read on the host by the reference and checked; the CUDA kernels cannot check them.
TEST(AttentionReference, BadCuSeqlens) {
  Call c;
  c.o.layout = AttentionLayout::kVarlen;
  c.q = HostTensor(F64, {6, 2, 64});
  c.k = HostTensor(F64, {5, 1, 64});
  c.v = HostTensor(F64, {5, 1, 64});
  c.out = HostTensor(F64, {6, 2, 64});
  c.has_lse = false;
  for (HostTensor* x : {&c.q, &c.k, &c.v})
    for (int64_t i = 0; i < x->numel(); ++i) x->set(i, 0.0);
  c.cuq = HostTensor(I32, {3});
  c.cuk = HostTensor(I32, {3});
  auto set = [](HostTensor& cu, std::vector<int> v) {
    for (size_t i = 0; i < v.size(); ++i) cu.set(int64_t(i), v[i]);
  };
  set(c.cuq, {0, 2, 6}), set(c.cuk, {0, 3, 5});
  KF_ASSERT_OK(c.run());
  set(c.cuq, {0, 4, 3});
  KF_EXPECT_INVALID(c.run(), "attention_forward: cu_seqlens_q must be non-decreasing, got 4 then 3 at index 1");
  set(c.cuq, {1, 2, 6});
  KF_EXPECT_INVALID(c.run(), "cu_seqlens_q must start at 0, got 1");
  set(c.cuq, {0, 2, 6}), set(c.cuk, {0, 3, 4});
  KF_EXPECT_INVALID(c.run(), "cu_seqlens_k must end at the token count 5, got 4");
  set(c.cuk, {0, 3, 5});
  c.o.max_seqlen_q = 3;
  KF_EXPECT_INVALID(c.run(), "cu_seqlens_q holds a sequence of 4 tokens (index 1), more than max_seqlen_q = 3");
  c.o.max_seqlen_q = 4;
  c.o.max_seqlen_k = 3;
  KF_ASSERT_OK(c.run());
}

}  // namespace
