// The float64 CPU reference of the activation family (kernelforge::ref) checked on its own, without
// a GPU:
//  - forward results against hand values (PyTorch float64 F.silu / F.gelu at the same points);
//  - layouts: gate-first and up-first halves of x [..., 2I], the two-tensor ops, row-strided views;
//  - rounding: each output is one rounding of the float64 result;
//  - backward results against central finite differences of the forward, in float64.
// These run on CI (no GPU), so the oracle the GPU tests trust is itself tested.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
using kernelforge::GeluApprox;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

::testing::AssertionResult near(const char* what, const HostTensor& got, std::vector<double> want, double tol = 1e-14) {
  HostTensor w = make(DType::kFloat64, got.shape, std::move(want));
  HostTensor g(DType::kFloat64, got.shape);
  for (int64_t i = 0; i < got.numel(); ++i) g.set(i, got.get(i));
  return all_close(what, g, w, Tol{tol, tol});
}

// points and PyTorch float64 values: F.silu, F.gelu, F.gelu(approximate="tanh")
const std::vector<double> kA = {0.0, 1.0, -1.0, 2.0, -3.0};
const std::vector<double> kSilu = {0.0, 0.7310585786300049, -0.2689414213699951, 1.7615941559557646,
                                   -0.14227761953270035};
const std::vector<double> kGelu = {0.0, 0.841344746068543, -0.15865525393145702, 1.9544997361036416,
                                   -0.00404969409489031};
const std::vector<double> kGeluTanh = {0.0, 0.8411919906082768, -0.15880800939172324, 1.954597694087775,
                                       -0.0036373920817729943};

TEST(ActReference, GeluHandValues) {
  HostTensor x = make(DType::kFloat64, {1, 5}, kA), y(DType::kFloat64, {1, 5}), yt(DType::kFloat64, {1, 5});
  KF_ASSERT_OK(ref::gelu(x.view(), GeluApprox::kNone, y.view()));
  KF_ASSERT_OK(ref::gelu(x.view(), GeluApprox::kTanh, yt.view()));
  EXPECT_TRUE(near("gelu", y, kGelu));
  EXPECT_TRUE(near("gelu tanh", yt, kGeluTanh));
}

TEST(ActReference, GatedHandValues) {
  const std::vector<double> b = {1.5, -2.0, 0.5, 3.0, -0.25};
  std::vector<double> gate_up, up_gate, want_silu, want_gelu, want_tanh;
  gate_up = kA;
  gate_up.insert(gate_up.end(), b.begin(), b.end());
  up_gate = b;
  up_gate.insert(up_gate.end(), kA.begin(), kA.end());
  for (size_t i = 0; i < kA.size(); ++i) {
    want_silu.push_back(kSilu[i] * b[i]);
    want_gelu.push_back(kGelu[i] * b[i]);
    want_tanh.push_back(kGeluTanh[i] * b[i]);
  }
  const DType t = DType::kFloat64;
  HostTensor x = make(t, {1, 10}, gate_up), x2 = make(t, {1, 10}, up_gate);
  HostTensor g = make(t, {1, 5}, kA), u = make(t, {1, 5}, b);
  HostTensor y(t, {1, 5});
  KF_ASSERT_OK(ref::silu_and_mul(x.view(), y.view()));
  EXPECT_TRUE(near("silu_and_mul", y, want_silu));
  KF_ASSERT_OK(ref::swiglu(g.view(), u.view(), y.view()));
  EXPECT_TRUE(near("swiglu", y, want_silu));
  KF_ASSERT_OK(ref::gelu_and_mul(x.view(), GeluApprox::kTanh, true, y.view()));
  EXPECT_TRUE(near("gelu_and_mul tanh, gate first", y, want_tanh));
  KF_ASSERT_OK(ref::gelu_and_mul(x2.view(), GeluApprox::kNone, false, y.view()));
  EXPECT_TRUE(near("gelu_and_mul none, gate second (diffusers)", y, want_gelu));
  KF_ASSERT_OK(ref::geglu(u.view(), g.view(), GeluApprox::kNone, y.view()));  // hidden * gelu(gate)
  EXPECT_TRUE(near("geglu", y, want_gelu));
  KF_ASSERT_OK(ref::geglu(u.view(), g.view(), GeluApprox::kTanh, y.view()));
  EXPECT_TRUE(near("geglu tanh", y, want_tanh));
}

// Every output is exactly the float64 result rounded once to the dtype.
TEST(ActReference, RoundsOnce) {
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(t));
    Rng rng(11 + static_cast<int>(t));
    HostTensor g = random_tensor(t, {3, 37}, rng, -6, 6), u = random_tensor(t, {3, 37}, rng, -3, 3);
    HostTensor y(t, {3, 37});
    KF_ASSERT_OK(ref::swiglu(g.view(), u.view(), y.view()));
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double a = g.get(i);
      const double want = round_to(t, a / (1.0 + std::exp(-a)) * u.get(i));
      ASSERT_EQ(y.get(i), want) << "element " << i;
    }
  }
}

// x[:, :N] of a wider buffer (row stride N + 5) gives the contiguous result.
TEST(ActReference, RowStridedViews) {
  const DType t = DType::kFloat32;
  Rng rng(5);
  const int64_t m = 4, i2 = 14, pad = 5;
  HostTensor wide = random_tensor(t, {m, i2 + pad}, rng), dense(t, {m, i2});
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < i2; ++c) dense.set(r * i2 + c, wide.get(r * (i2 + pad) + c));
  TensorView v = wide.view();
  v.shape[1] = i2;  // strides stay {i2 + pad, 1}
  HostTensor y1(t, {m, i2 / 2}), y2(t, {m, i2 / 2});
  KF_ASSERT_OK(ref::gelu_and_mul(v, GeluApprox::kNone, false, y1.view()));
  KF_ASSERT_OK(ref::gelu_and_mul(dense.view(), GeluApprox::kNone, false, y2.view()));
  EXPECT_TRUE(bit_equal("strided vs dense", y1, y2));
}

// ---- backward vs central finite differences ----------------------------------------------------
// f(inputs) -> y; the gradient of sum(y * dy) w.r.t. each input element, by (f(+h) - f(-h)) / 2h.
using Fwd = std::function<void(const std::vector<HostTensor*>&, HostTensor&)>;

void check_fd(const char* what, std::vector<HostTensor*> inputs, const std::vector<HostTensor*>& grads,
              const HostTensor& dy, const Fwd& fwd) {
  const double h = 1e-6;
  for (size_t k = 0; k < inputs.size(); ++k) {
    HostTensor& in = *inputs[k];
    for (int64_t i = 0; i < in.numel(); ++i) {
      const double v = in.get(i);
      HostTensor yp(DType::kFloat64, dy.shape), ym(DType::kFloat64, dy.shape);
      in.set(i, v + h);
      fwd(inputs, yp);
      in.set(i, v - h);
      fwd(inputs, ym);
      in.set(i, v);
      double fd = 0.0;
      for (int64_t j = 0; j < dy.numel(); ++j) fd += (yp.get(j) - ym.get(j)) / (2 * h) * dy.get(j);
      const double got = grads[k]->get(i);
      EXPECT_NEAR(got, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << what << ": input " << k << " element " << i;
    }
  }
}

TEST(ActReference, BackwardMatchesFiniteDifferences) {
  const DType t = DType::kFloat64;
  for (GeluApprox ap : {GeluApprox::kNone, GeluApprox::kTanh}) {
    SCOPED_TRACE(ap == GeluApprox::kNone ? "erf" : "tanh");
    Rng rng(21 + static_cast<int>(ap));
    const int64_t m = 3, n = 7;
    HostTensor x = random_tensor(t, {m, 2 * n}, rng, -4, 4), g = random_tensor(t, {m, n}, rng, -4, 4);
    HostTensor u = random_tensor(t, {m, n}, rng), dy = random_tensor(t, {m, n}, rng);
    HostTensor dx(t, {m, 2 * n}), dg(t, {m, n}), du(t, {m, n});

    KF_ASSERT_OK(ref::silu_and_mul_backward(dy.view(), x.view(), dx.view()));
    check_fd("silu_and_mul", {&x}, {&dx}, dy, [](const std::vector<HostTensor*>& in, HostTensor& y) {
      (void)ref::silu_and_mul(in[0]->view(), y.view());
    });
    KF_ASSERT_OK(ref::swiglu_backward(dy.view(), g.view(), u.view(), dg.view(), du.view()));
    check_fd("swiglu", {&g, &u}, {&dg, &du}, dy, [](const std::vector<HostTensor*>& in, HostTensor& y) {
      (void)ref::swiglu(in[0]->view(), in[1]->view(), y.view());
    });
    for (bool gate_first : {true, false}) {
      SCOPED_TRACE(gate_first ? "gate first" : "gate second");
      KF_ASSERT_OK(ref::gelu_and_mul_backward(dy.view(), x.view(), ap, gate_first, dx.view()));
      check_fd("gelu_and_mul", {&x}, {&dx}, dy, [&](const std::vector<HostTensor*>& in, HostTensor& y) {
        (void)ref::gelu_and_mul(in[0]->view(), ap, gate_first, y.view());
      });
    }
    // geglu(hidden = u, gate = g): gradients (dhidden, dgate)
    KF_ASSERT_OK(ref::geglu_backward(dy.view(), u.view(), g.view(), ap, du.view(), dg.view()));
    check_fd("geglu", {&u, &g}, {&du, &dg}, dy, [&](const std::vector<HostTensor*>& in, HostTensor& y) {
      (void)ref::geglu(in[0]->view(), in[1]->view(), ap, y.view());
    });
    KF_ASSERT_OK(ref::gelu_backward(dy.view(), g.view(), ap, dg.view()));
    check_fd("gelu", {&g}, {&dg}, dy,
             [&](const std::vector<HostTensor*>& in, HostTensor& y) { (void)ref::gelu(in[0]->view(), ap, y.view()); });
  }
}

// Non-finite inputs: the limits PyTorch gives (F.silu(-inf) = nan, F.silu(inf) = inf, gradients at
// +-inf are nan), and a huge finite input keeps the exact limits (gelu_tanh'(1e30) = 1).
// gelu_backward_bias_grad: dx is gelu_backward's, bit for bit; dbias the float64 column sums of the
// unrounded gradients (of the inputs as given), rounded once to dbias's dtype, at any dbias stride;
// no rows give dbias = 0.
TEST(ActReference, GeluBackwardBiasGrad) {
  const int64_t m = 9, n = 5;
  for (GeluApprox a : {GeluApprox::kNone, GeluApprox::kTanh}) {
    for (DType t : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(kernelforge::dtype_name(t)) + (a == GeluApprox::kTanh ? " tanh" : " erf"));
      Rng rng(77);
      const HostTensor x = random_tensor(t, {m, n}, rng, -5.0, 5.0), dy = random_tensor(t, {m, n}, rng);
      HostTensor want_dx(t, {m, n});
      KF_ASSERT_OK(ref::gelu_backward(dy.view(), x.view(), a, want_dx.view()));
      // the exact gradients: gelu_backward on float64 copies of the same values
      HostTensor x64(DType::kFloat64, {m, n}), dy64(DType::kFloat64, {m, n}), g64(DType::kFloat64, {m, n});
      for (int64_t i = 0; i < m * n; ++i) x64.set(i, x.get(i)), dy64.set(i, dy.get(i));
      KF_ASSERT_OK(ref::gelu_backward(dy64.view(), x64.view(), a, g64.view()));
      for (DType bt : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
        HostTensor dx(t, {m, n}), db(bt, {n});
        KF_ASSERT_OK(ref::gelu_backward_bias_grad(dy.view(), x.view(), a, dx.view(), db.view()));
        EXPECT_TRUE(bit_equal("dx", dx, want_dx));
        for (int64_t c = 0; c < n; ++c) {
          double sum = 0.0;
          for (int64_t r = 0; r < m; ++r) sum += g64.get(r * n + c);
          EXPECT_EQ(db.get(c), round_to(bt, sum)) << "column " << c;
        }
        // dbias as every other element of a [2n] buffer: the same values, the gaps untouched
        HostTensor wide(bt, {2 * n});
        TensorView v = wide.view();
        v.shape[0] = n;
        v.strides[0] = 2;
        KF_ASSERT_OK(ref::gelu_backward_bias_grad(dy.view(), x.view(), a, dx.view(), v));
        for (int64_t c = 0; c < n; ++c) {
          EXPECT_EQ(wide.get(2 * c), db.get(c));
          EXPECT_TRUE(std::isnan(wide.get(2 * c + 1)));
        }
      }
    }
  }
  HostTensor x(DType::kFloat32, {0, 3}), dx(DType::kFloat32, {0, 3}), db(DType::kFloat32, {3});
  KF_ASSERT_OK(ref::gelu_backward_bias_grad(x.view(), x.view(), GeluApprox::kTanh, dx.view(), db.view()));
  for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(db.get(c), 0.0);
}

TEST(ActReference, NonFinite) {
  const DType t = DType::kFloat64;
  const double inf = INFINITY;
  HostTensor x = make(t, {1, 3}, {-inf, inf, 1e30}), y(t, {1, 3}), dy = make(t, {1, 3}, {1, 1, 1}), dx(t, {1, 3});
  for (GeluApprox ap : {GeluApprox::kNone, GeluApprox::kTanh}) {
    KF_ASSERT_OK(ref::gelu(x.view(), ap, y.view()));
    EXPECT_TRUE(std::isnan(y.get(0)));
    EXPECT_EQ(y.get(1), inf);
    EXPECT_EQ(y.get(2), 1e30);
    KF_ASSERT_OK(ref::gelu_backward(dy.view(), x.view(), ap, dx.view()));
    EXPECT_TRUE(std::isnan(dx.get(0)) && std::isnan(dx.get(1)));
    EXPECT_EQ(dx.get(2), 1.0);
  }
}

}  // namespace
