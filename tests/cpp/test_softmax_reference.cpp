// The float64 CPU reference of the softmax family (kernelforge::ref) checked on its own, without a
// GPU: hand-computed values, special values (NaN / +inf / all -inf rows as torch.softmax), shift
// invariance, rounding (one rounding of the float64 result), row-strided views, in place, and the
// backward against central finite differences of the forward. These run on CI, so the oracle the
// GPU tests trust is itself tested.
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
constexpr DType F64 = DType::kFloat64;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

::testing::AssertionResult near(const char* what, const HostTensor& got, std::vector<double> want, double tol = 1e-15) {
  HostTensor w = make(F64, got.shape, std::move(want));
  HostTensor g(F64, got.shape);
  for (int64_t i = 0; i < got.numel(); ++i) g.set(i, got.get(i));
  return all_close(what, g, w, Tol{tol, tol});
}

TEST(SoftmaxReference, HandValues) {
  // [1, 2, 3]: e^k / (e + e^2 + e^3) and k - log(e + e^2 + e^3) (= k - 3.40760596444438)
  HostTensor x = make(F64, {2, 3}, {1.0, 2.0, 3.0, 0.0, 0.0, 0.0}), y(F64, {2, 3}), ly(F64, {2, 3});
  KF_ASSERT_OK(ref::softmax(x.view(), y.view()));
  KF_ASSERT_OK(ref::log_softmax(x.view(), ly.view()));
  EXPECT_TRUE(
      near("softmax", y, {0.09003057317038046, 0.24472847105479767, 0.6652409557748219, 1.0 / 3, 1.0 / 3, 1.0 / 3}));
  const double lse = 3.40760596444438;
  EXPECT_TRUE(near("log_softmax", ly, {1.0 - lse, 2.0 - lse, 3.0 - lse, -std::log(3.0), -std::log(3.0), -std::log(3.0)},
                   1e-13));
  // one element: softmax 1, log_softmax 0, whatever the value
  HostTensor one = make(F64, {1}, {-123.0}), y1(F64, {1});
  KF_ASSERT_OK(ref::softmax(one.view(), y1.view()));
  EXPECT_EQ(y1.get(0), 1.0);
  KF_ASSERT_OK(ref::log_softmax(one.view(), y1.view()));
  EXPECT_EQ(y1.get(0), 0.0);
}

TEST(SoftmaxReference, BackwardHandValues) {
  // y = [0.2, 0.3, 0.5], g = [1, 0, -1]: dot = -0.3; dx = y (g + 0.3) = [0.26, 0.09, -0.35]
  HostTensor y = make(F64, {1, 3}, {0.2, 0.3, 0.5}), g = make(F64, {1, 3}, {1.0, 0.0, -1.0}), dx(F64, {1, 3});
  KF_ASSERT_OK(ref::softmax_backward(g.view(), y.view(), dx.view()));
  EXPECT_TRUE(near("softmax_backward", dx, {0.26, 0.09, -0.35}));
  // log_softmax: y = log p, g = [1, 2, 3]: sum g = 6, dx = g - p * 6 = [-0.2, 0.2, 0]
  HostTensor ly = make(F64, {1, 3}, {std::log(0.2), std::log(0.3), std::log(0.5)});
  HostTensor g2 = make(F64, {1, 3}, {1.0, 2.0, 3.0});
  KF_ASSERT_OK(ref::log_softmax_backward(g2.view(), ly.view(), dx.view()));
  EXPECT_TRUE(near("log_softmax_backward", dx, {-0.2, 0.2, 0.0}, 1e-14));
}

TEST(SoftmaxReference, SpecialValuesAsTorch) {
  // torch.softmax / log_softmax: a NaN or +inf anywhere, or a row of only -inf, gives NaN for the
  // whole row; -inf elements of an otherwise finite row give 0 (log: -inf).
  const double inf = INFINITY, nan = NAN;
  HostTensor x = make(F64, {4, 3}, {nan, 1.0, 2.0, inf, 1.0, 2.0, -inf, -inf, -inf, -inf, 1.0, 2.0});
  HostTensor y(F64, {4, 3}), ly(F64, {4, 3});
  KF_ASSERT_OK(ref::softmax(x.view(), y.view()));
  KF_ASSERT_OK(ref::log_softmax(x.view(), ly.view()));
  for (int64_t i = 0; i < 9; ++i) {
    EXPECT_TRUE(std::isnan(y.get(i))) << i;
    EXPECT_TRUE(std::isnan(ly.get(i))) << i;
  }
  EXPECT_EQ(y.get(9), 0.0);
  EXPECT_NEAR(y.get(10), 0.2689414213699951, 1e-15);
  EXPECT_NEAR(y.get(11), 0.7310585786300049, 1e-15);
  EXPECT_EQ(ly.get(9), -inf);
  EXPECT_NEAR(ly.get(10), -1.3132616875182228, 1e-14);
}

TEST(SoftmaxReference, ShiftInvarianceAndHugeValues) {
  // softmax(x + c) = softmax(x): no overflow at 1e300 (the max is subtracted first)
  HostTensor x = make(F64, {1, 3}, {1e300, 1e300 - 1e285, 1e300}), y(F64, {1, 3});
  KF_ASSERT_OK(ref::softmax(x.view(), y.view()));
  EXPECT_TRUE(near("huge", y, {0.5, 0.0, 0.5}));
  HostTensor a = make(F64, {1, 4}, {0.5, -1.0, 2.0, 0.0}), b = make(F64, {1, 4}, {1000.5, 999.0, 1002.0, 1000.0});
  HostTensor ya(F64, {1, 4}), yb(F64, {1, 4});
  KF_ASSERT_OK(ref::softmax(a.view(), ya.view()));
  KF_ASSERT_OK(ref::softmax(b.view(), yb.view()));
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(ya.get(i), yb.get(i), 1e-13);
}

TEST(SoftmaxReference, OneRoundingPerDtype) {
  Rng rng(3);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    HostTensor x = random_tensor(t, {3, 37}, rng, -5, 5), x64(F64, {3, 37});
    for (int64_t i = 0; i < x.numel(); ++i) x64.set(i, x.get(i));
    for (bool log : {false, true}) {
      HostTensor y(t, {3, 37}), y64(F64, {3, 37});
      KF_ASSERT_OK(log ? ref::log_softmax(x.view(), y.view()) : ref::softmax(x.view(), y.view()));
      KF_ASSERT_OK(log ? ref::log_softmax(x64.view(), y64.view()) : ref::softmax(x64.view(), y64.view()));
      for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.get(i), round_to(t, y64.get(i))) << dtype_name(t) << " " << i;
    }
  }
}

TEST(SoftmaxReference, RowStridedViewsAndInPlace) {
  // x rows of 5 inside rows of 8: only the view is read and written
  HostTensor big = make(F64, {2, 8}, {1, 2, 3, 4, 5, 99, 99, 99, 0, 0, 0, 0, 1, 99, 99, 99});
  kernelforge::TensorView v = big.view();
  v.shape[1] = 5;
  HostTensor y(F64, {2, 5}), want(F64, {2, 5});
  HostTensor dense = make(F64, {2, 5}, {1, 2, 3, 4, 5, 0, 0, 0, 0, 1});
  KF_ASSERT_OK(ref::softmax(v, y.view()));
  KF_ASSERT_OK(ref::softmax(dense.view(), want.view()));
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(y.get(i), want.get(i));
  KF_ASSERT_OK(ref::softmax(v, v));  // in place
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(big.get(r * 8 + j), want.get(r * 5 + j));
  EXPECT_EQ(big.get(5), 99.0);
  EXPECT_EQ(big.get(15), 99.0);
}

// dx_j = sum_k g_k dy_k/dx_j, with dy/dx by central differences of the reference forward.
TEST(SoftmaxReference, BackwardMatchesFiniteDifferences) {
  Rng rng(11);
  const int64_t n = 9;
  for (bool log : {false, true}) {
    HostTensor x = random_tensor(F64, {1, n}, rng, -3, 3), g = random_tensor(F64, {1, n}, rng);
    HostTensor y(F64, {1, n}), dx(F64, {1, n});
    KF_ASSERT_OK(log ? ref::log_softmax(x.view(), y.view()) : ref::softmax(x.view(), y.view()));
    KF_ASSERT_OK(log ? ref::log_softmax_backward(g.view(), y.view(), dx.view())
                     : ref::softmax_backward(g.view(), y.view(), dx.view()));
    const double h = 1e-6;
    for (int64_t j = 0; j < n; ++j) {
      HostTensor xp = x, xm = x, yp(F64, {1, n}), ym(F64, {1, n});
      xp.set(j, x.get(j) + h);
      xm.set(j, x.get(j) - h);
      KF_ASSERT_OK(log ? ref::log_softmax(xp.view(), yp.view()) : ref::softmax(xp.view(), yp.view()));
      KF_ASSERT_OK(log ? ref::log_softmax(xm.view(), ym.view()) : ref::softmax(xm.view(), ym.view()));
      double fd = 0.0;
      for (int64_t k = 0; k < n; ++k) fd += g.get(k) * (yp.get(k) - ym.get(k)) / (2 * h);
      EXPECT_NEAR(dx.get(j), fd, 1e-7) << (log ? "log_softmax" : "softmax") << " j = " << j;
    }
  }
}

TEST(SoftmaxReference, EmptyTensors) {
  HostTensor x(F64, {0, 7}), y(F64, {0, 7}), e(F64, {3, 0}), ye(F64, {3, 0});
  KF_ASSERT_OK(ref::softmax(x.view(), y.view()));
  KF_ASSERT_OK(ref::log_softmax(e.view(), ye.view()));
  KF_ASSERT_OK(ref::softmax_backward(x.view(), x.view(), y.view()));
}

}  // namespace
