// The float64 reference of fused_linear_rowsum (kernelforge::ref) on hand examples and against the
// definition it shortcuts: the row sums of the full product x Wᵀ + b, and its gradients from the
// full product's (dz[t, o] = dy[t]: dx = dz W, dW = dzᵀ x, db = sum_t dz), plus central finite
// differences of sum_t dy[t] y[t]. No GPU needed.
#include <cmath>
#include <vector>

#include "test_fused_linear_rowsum_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
constexpr DType F64 = DType::kFloat64;
constexpr DType F32 = DType::kFloat32;

TEST(FlrsReference, HandExample) {
  // x = [[1, 2], [3, -1]], W = [[1, 0], [2, 1], [-1, 1]], b = [0.5, -1, 2]: w_sum = [2, 2], b_sum = 1.5
  HostTensor x(F32, {2, 2}), w(F32, {3, 2}), b(F32, {3}), y(F32, {2}), ws(F32, {2});
  const double xv[] = {1, 2, 3, -1}, wv[] = {1, 0, 2, 1, -1, 1}, bv[] = {0.5, -1, 2};
  for (int i = 0; i < 4; ++i) x.set(i, xv[i]);
  for (int i = 0; i < 6; ++i) w.set(i, wv[i]);
  for (int i = 0; i < 3; ++i) b.set(i, bv[i]);
  const auto bview = b.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum(x.view(), w.view(), &bview, y.view(), ws.view()));
  EXPECT_EQ(ws.get(0), 2.0);
  EXPECT_EQ(ws.get(1), 2.0);
  EXPECT_EQ(y.get(0), 1 * 2 + 2 * 2 + 1.5);
  EXPECT_EQ(y.get(1), 3 * 2 - 1 * 2 + 1.5);
  // backward, dy = [1, -2]: dx = dy w_sum, dW rows = [1*1 - 2*3, 1*2 - 2*(-1)] = [-5, 4], db = -1
  HostTensor dy(F32, {2}), dx(F32, {2, 2}), dw(F32, {3, 2}), db(F32, {3});
  dy.set(0, 1), dy.set(1, -2);
  const auto dxv = dx.view(), dwv = dw.view(), dbv = db.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum_backward(dy.view(), x.view(), ws.view(), &dxv, &dwv, &dbv));
  const double want_dx[] = {2, 2, -4, -4};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dx.get(i), want_dx[i]);
  for (int o = 0; o < 3; ++o) {
    EXPECT_EQ(dw.get(o * 2), -5.0);
    EXPECT_EQ(dw.get(o * 2 + 1), 4.0);
    EXPECT_EQ(db.get(o), -1.0);
  }
}

TEST(FlrsReference, MatchesTheFullProduct) {
  Rng rng(11);
  const int64_t T = 6, K = 13, O = 9;
  const FlrsHost h = flrs_random(F64, T, K, O, true, rng);
  HostTensor y(F64, {T}), ws(F64, {K});
  const auto bv = h.b.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum(h.x.view(), h.w.view(), &bv, y.view(), ws.view()));
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int64_t o = 0; o < O; ++o) {
      double z = h.b.get(o);
      for (int64_t k = 0; k < K; ++k) z += h.x.get(t * K + k) * h.w.get(o * K + k);
      s += z;
    }
    EXPECT_NEAR(y.get(t), s, 1e-12 * (1 + std::fabs(s)));
  }
  HostTensor dx(F64, {T, K}), dw(F64, {O, K}), db(F64, {O});
  const auto dxv = dx.view(), dwv = dw.view(), dbv = db.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum_backward(h.dy.view(), h.x.view(), ws.view(), &dxv, &dwv, &dbv));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;  // (dz W)[t, k]
      for (int64_t o = 0; o < O; ++o) s += h.dy.get(t) * h.w.get(o * K + k);
      EXPECT_NEAR(dx.get(t * K + k), s, 1e-12 * (1 + std::fabs(s)));
    }
  for (int64_t o = 0; o < O; ++o) {
    double sb = 0;
    for (int64_t t = 0; t < T; ++t) sb += h.dy.get(t);
    EXPECT_NEAR(db.get(o), sb, 1e-12 * (1 + std::fabs(sb)));
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;  // (dzᵀ x)[o, k]
      for (int64_t t = 0; t < T; ++t) s += h.dy.get(t) * h.x.get(t * K + k);
      EXPECT_NEAR(dw.get(o * K + k), s, 1e-12 * (1 + std::fabs(s)));
    }
  }
}

// d/dp of L = sum_t dy[t] y[t] by central differences, for one element of x, W and b.
TEST(FlrsReference, FiniteDifferences) {
  Rng rng(12);
  const int64_t T = 4, K = 5, O = 3;
  FlrsHost h = flrs_random(F64, T, K, O, true, rng);
  auto loss = [&](const FlrsHost& q) {
    HostTensor y(F64, {T}), ws(F64, {K});
    const auto bv = q.b.view();
    EXPECT_TRUE(ref::fused_linear_rowsum(q.x.view(), q.w.view(), &bv, y.view(), ws.view()).ok());
    double l = 0;
    for (int64_t t = 0; t < T; ++t) l += q.dy.get(t) * y.get(t);
    return l;
  };
  HostTensor y(F64, {T}), ws(F64, {K}), dx(F64, {T, K}), dw(F64, {O, K}), db(F64, {O});
  const auto bv = h.b.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum(h.x.view(), h.w.view(), &bv, y.view(), ws.view()));
  const auto dxv = dx.view(), dwv = dw.view(), dbv = db.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum_backward(h.dy.view(), h.x.view(), ws.view(), &dxv, &dwv, &dbv));
  const double e = 1e-6;
  auto fd = [&](HostTensor& t, int64_t i) {
    const double v = t.get(i);
    t.set(i, v + e);
    const double up = loss(h);
    t.set(i, v - e);
    const double down = loss(h);
    t.set(i, v);
    return (up - down) / (2 * e);
  };
  EXPECT_NEAR(fd(h.x, 7), dx.get(7), 1e-6);
  EXPECT_NEAR(fd(h.w, 11), dw.get(11), 1e-6);
  EXPECT_NEAR(fd(h.b, 2), db.get(2), 1e-6);
}

TEST(FlrsReference, EmptySizes) {
  // K = 0: y = b_sum; O = 0: y = 0, w_sum = 0; T = 0 backward: dW = 0, db = 0
  HostTensor x(F32, {3, 0}), w(F32, {2, 0}), b(F32, {2}), y(F32, {3}), ws(F32, {0});
  b.set(0, 1.25), b.set(1, -0.5);
  const auto bv = b.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum(x.view(), w.view(), &bv, y.view(), ws.view()));
  for (int t = 0; t < 3; ++t) EXPECT_EQ(y.get(t), 0.75);
  HostTensor x2(F32, {2, 4}), w2(F32, {0, 4}), y2(F32, {2}), ws2(F32, {4});
  for (int i = 0; i < 8; ++i) x2.set(i, i);
  KF_ASSERT_OK(ref::fused_linear_rowsum(x2.view(), w2.view(), nullptr, y2.view(), ws2.view()));
  for (int t = 0; t < 2; ++t) EXPECT_EQ(y2.get(t), 0.0);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ws2.get(k), 0.0);
  HostTensor dy(F32, {0}), x3(F32, {0, 4}), dw(F32, {3, 4}), db(F32, {3});
  const auto dwv = dw.view(), dbv = db.view();
  KF_ASSERT_OK(ref::fused_linear_rowsum_backward(dy.view(), x3.view(), ws2.view(), nullptr, &dwv, &dbv));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(dw.get(i), 0.0);
  for (int o = 0; o < 3; ++o) EXPECT_EQ(db.get(o), 0.0);
}

TEST(FlrsReference, LeadingDimensionsAndRounding) {
  // x [2, 3, 4] bfloat16: y [2, 3], each the exact sum rounded once
  Rng rng(13);
  HostTensor x = random_tensor(DType::kBFloat16, {2, 3, 4}, rng), w = random_tensor(DType::kBFloat16, {5, 4}, rng);
  HostTensor y(DType::kBFloat16, {2, 3}), ws(F32, {4});
  KF_ASSERT_OK(ref::fused_linear_rowsum(x.view(), w.view(), nullptr, y.view(), ws.view()));
  for (int t = 0; t < 6; ++t) {
    double s = 0;
    for (int o = 0; o < 5; ++o)
      for (int k = 0; k < 4; ++k) s += x.get(t * 4 + k) * w.get(o * 4 + k);
    EXPECT_EQ(y.get(t), round_to(DType::kBFloat16, s));
  }
}

}  // namespace
