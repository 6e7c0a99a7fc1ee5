// The float64 CPU reference (kernelforge::ref) checked on its own, without a GPU:
//  - forward results against small examples computed by hand;
//  - rounding semantics: rms_norm casts to the dtype before the weight (HF), add_rms_norm
//    normalizes the rounded sum, layer_norm and ada_norm round once;
//  - backward results against central finite differences of the forward, in float64.
// These run on CI (no GPU), so the oracle the GPU tests trust is itself tested.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../../src/norm/norm_problem.h"  // FastDiv (internal: the kernels' AdaLN group index)
#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
using kernelforge::NormKind;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

// exact comparison for hand examples, up to float64 rounding
::testing::AssertionResult near(const char* what, const HostTensor& got, std::vector<double> want, double tol = 1e-12) {
  HostTensor w = make(DType::kFloat64, got.shape, std::move(want));
  HostTensor g(DType::kFloat64, got.shape);
  for (int64_t i = 0; i < got.numel(); ++i) g.set(i, got.get(i));
  return all_close(what, g, w, Tol{tol, tol});
}

// ---- hand examples ---------------------------------------------------------------------------
// rms rows: [-3, 1, 1, 1] has mean(x^2) = 3, +eps 1 -> rstd 0.5;
//           [0.5, 1.5, -2.5, 3.5] has mean(x^2) = 5.25, +1 -> rstd 0.4.
const std::vector<double> kRmsX = {-3, 1, 1, 1, 0.5, 1.5, -2.5, 3.5};
const std::vector<double> kW = {1, 2, -0.5, 0.25};
const std::vector<double> kB = {0.5, 0, 1, -1};

TEST(NormReference, RmsNormHandExample) {
  for (DType t : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(t));
    HostTensor x = make(t, {2, 4}, kRmsX), w = make(t, {4}, kW), y(t, {2, 4});
    TensorView wv = w.view();
    KF_ASSERT_OK(ref::rms_norm(x.view(), &wv, 1.0f, y.view()));
    // x * rstd * w
    EXPECT_TRUE(near("y", y, {-1.5, 1.0, -0.25, 0.125, 0.2, 1.2, 0.5, 0.35}, 1e-7));
    HostTensor y2(t, {2, 4});
    KF_ASSERT_OK(ref::rms_norm(x.view(), nullptr, 1.0f, y2.view()));
    EXPECT_TRUE(near("y (no weight)", y2, {-1.5, 0.5, 0.5, 0.5, 0.2, 0.6, -1.0, 1.4}, 1e-7));
  }
}

TEST(NormReference, AddRmsNormHandExample) {
  // x + residual = the rms rows above
  HostTensor x = make(DType::kFloat64, {2, 4}, {-4, 0.5, 0.5, 0.5, 0.25, 1, -3, 1.5});
  HostTensor r = make(DType::kFloat64, {2, 4}, {1, 0.5, 0.5, 0.5, 0.25, 0.5, 0.5, 2});
  HostTensor w = make(DType::kFloat64, {4}, kW), y(DType::kFloat64, {2, 4}), s(DType::kFloat64, {2, 4});
  TensorView wv = w.view();
  KF_ASSERT_OK(ref::add_rms_norm(x.view(), r.view(), &wv, 1.0f, y.view(), s.view()));
  EXPECT_TRUE(near("sum", s, kRmsX));
  EXPECT_TRUE(near("y", y, {-1.5, 1.0, -0.25, 0.125, 0.2, 1.2, 0.5, 0.35}));
}

TEST(NormReference, LayerNormHandExample) {
  // [1, 2, 3, 6]: mean 3, var 3.5, +eps 0.5 -> rstd 0.5, xhat [-1, -0.5, 0, 1.5];
  // [8, 9, 10, 13] is the same row shifted by 7 (mean subtraction).
  for (DType t : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(dtype_name(t));
    HostTensor x = make(t, {2, 4}, {1, 2, 3, 6, 8, 9, 10, 13});
    HostTensor w = make(t, {4}, kW), b = make(t, {4}, kB);
    TensorView wv = w.view(), bv = b.view();
    HostTensor y(t, {2, 4}), yw(t, {2, 4}), yb(t, {2, 4}), yn(t, {2, 4});
    KF_ASSERT_OK(ref::layer_norm(x.view(), &wv, &bv, 0.5f, y.view()));
    KF_ASSERT_OK(ref::layer_norm(x.view(), &wv, nullptr, 0.5f, yw.view()));
    KF_ASSERT_OK(ref::layer_norm(x.view(), nullptr, &bv, 0.5f, yb.view()));
    KF_ASSERT_OK(ref::layer_norm(x.view(), nullptr, nullptr, 0.5f, yn.view()));
    EXPECT_TRUE(near("y", y, {-0.5, -1, 1, -0.625, -0.5, -1, 1, -0.625}, 1e-6));
    EXPECT_TRUE(near("y (weight)", yw, {-1, -1, 0, 0.375, -1, -1, 0, 0.375}, 1e-6));
    EXPECT_TRUE(near("y (bias)", yb, {-0.5, -0.5, 1, 0.5, -0.5, -0.5, 1, 0.5}, 1e-6));
    EXPECT_TRUE(near("y (plain)", yn, {-1, -0.5, 0, 1.5, -1, -0.5, 0, 1.5}, 1e-6));
  }
}

TEST(NormReference, AdaNormHandExample) {
  // x [1, 2, 4], scale/shift [1, 1, 4]: y = norm(x) * (1 + scale) + shift
  HostTensor scale = make(DType::kFloat64, {1, 1, 4}, {0.5, -0.5, 1, 0});
  HostTensor shift = make(DType::kFloat64, {1, 1, 4}, {0, 1, -1, 2});
  {
    HostTensor x = make(DType::kFloat64, {1, 2, 4}, {1, 2, 3, 6, 8, 9, 10, 13});
    HostTensor y(DType::kFloat64, {1, 2, 4});
    KF_ASSERT_OK(
        ref::ada_norm(x.view(), scale.view(), shift.view(), nullptr, nullptr, 0.5f, NormKind::kLayer, y.view()));
    EXPECT_TRUE(near("layer", y, {-1.5, 0.75, -1, 3.5, -1.5, 0.75, -1, 3.5}));
  }
  {
    HostTensor x = make(DType::kFloat64, {1, 2, 4}, kRmsX);
    HostTensor y(DType::kFloat64, {1, 2, 4});
    KF_ASSERT_OK(ref::ada_norm(x.view(), scale.view(), shift.view(), nullptr, nullptr, 1.0f, NormKind::kRms, y.view()));
    // xhat row 0 [-1.5, 0.5, 0.5, 0.5], row 1 [0.2, 0.6, -1.0, 1.4]
    EXPECT_TRUE(near("rms", y, {-2.25, 1.25, 0, 2.5, 0.3, 1.3, -3, 3.4}));
  }
}

// ---- rounding semantics ----------------------------------------------------------------------
class NormReferenceRounding : public ::testing::TestWithParam<DType> {};

TEST_P(NormReferenceRounding, RmsNormCastsBeforeWeight) {
  const DType t = GetParam();
  const int64_t M = 8, N = 256;
  Rng rng(hash_str("rms_round") + static_cast<int>(t));
  HostTensor x = random_tensor(t, {M, N}, rng), w = random_weight(t, {N}, rng), y(t, {M, N});
  TensorView wv = w.view();
  const float eps = 1e-6f;
  KF_ASSERT_OK(ref::rms_norm(x.view(), &wv, eps, y.view()));
  int64_t differs_from_one_rounding = 0;
  for (int64_t r = 0; r < M; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < N; ++c) ss += x.get(r * N + c) * x.get(r * N + c);
    const double rstd = 1.0 / std::sqrt(ss / N + static_cast<double>(eps));
    for (int64_t c = 0; c < N; ++c) {
      const double xv = x.get(r * N + c), wc = w.get(c);
      const double want = round_to(t, round_to(t, xv * rstd) * wc);
      ASSERT_EQ(y.get(r * N + c), want) << "row " << r << " col " << c;
      if (want != round_to(t, xv * rstd * wc)) ++differs_from_one_rounding;
    }
  }
  // the data must be able to tell the two semantics apart
  EXPECT_GT(differs_from_one_rounding, 0);
}

TEST_P(NormReferenceRounding, AddRmsNormNormalizesRoundedSum) {
  const DType t = GetParam();
  const int64_t M = 4, N = 128;
  Rng rng(hash_str("add_round") + static_cast<int>(t));
  HostTensor x = random_tensor(t, {M, N}, rng), res = random_tensor(t, {M, N}, rng);
  HostTensor y(t, {M, N}), s(t, {M, N}), s_ref(t, {M, N}), y_ref(t, {M, N});
  KF_ASSERT_OK(ref::add_rms_norm(x.view(), res.view(), nullptr, 1e-6f, y.view(), s.view()));
  for (int64_t i = 0; i < M * N; ++i) s_ref.set(i, x.get(i) + res.get(i));  // set() rounds
  KF_ASSERT_OK(ref::rms_norm(s_ref.view(), nullptr, 1e-6f, y_ref.view()));
  EXPECT_TRUE(bit_equal("sum", s, s_ref));
  EXPECT_TRUE(bit_equal("y", y, y_ref));
}

TEST_P(NormReferenceRounding, LayerAndAdaNormRoundOnce) {
  const DType t = GetParam();
  const int64_t B = 2, S = 3, N = 96;
  const float eps = 1e-5f;
  Rng rng(hash_str("ada_round") + static_cast<int>(t));
  HostTensor x = random_tensor(t, {B, S, N}, rng, -1.0, 3.0);
  HostTensor w = random_weight(t, {N}, rng), b = random_tensor(t, {N}, rng);
  HostTensor scale = random_tensor(t, {B, 1, N}, rng, -0.5, 0.5);
  HostTensor shift = random_tensor(t, {B, 1, N}, rng);
  TensorView wv = w.view(), bv = b.view();
  HostTensor y_ln(t, {B, S, N}), y_ada(t, {B, S, N});
  KF_ASSERT_OK(ref::layer_norm(x.view(), &wv, &bv, eps, y_ln.view()));
  KF_ASSERT_OK(ref::ada_norm(x.view(), scale.view(), shift.view(), &wv, &bv, eps, NormKind::kLayer, y_ada.view()));
  for (int64_t r = 0; r < B * S; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < N; ++c) mean += x.get(r * N + c);
    mean /= N;
    for (int64_t c = 0; c < N; ++c) var += (x.get(r * N + c) - mean) * (x.get(r * N + c) - mean);
    const double rstd = 1.0 / std::sqrt(var / N + static_cast<double>(eps));
    const int64_t bi = r / S;
    for (int64_t c = 0; c < N; ++c) {
      const double ln = (x.get(r * N + c) - mean) * rstd * w.get(c) + b.get(c);
      ASSERT_EQ(y_ln.get(r * N + c), round_to(t, ln)) << "layer_norm row " << r << " col " << c;
      const double ada = ln * (1.0 + scale.get(bi * N + c)) + shift.get(bi * N + c);
      ASSERT_EQ(y_ada.get(r * N + c), round_to(t, ada)) << "ada_norm row " << r << " col " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NormReferenceRounding,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// ---- backward against finite differences (float64) --------------------------------------------
// loss = sum_k <g_k, out_k>; d loss / d theta by central differences, h = 1e-5.
using LossFn = std::function<double()>;

void check_gradient(const char* what, HostTensor& param, const HostTensor& grad, const LossFn& loss) {
  ASSERT_EQ(param.numel(), grad.numel()) << what;
  const double h = 1e-5;
  HostTensor fd(DType::kFloat64, grad.shape);
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double v = param.get(i);
    param.set(i, v + h);
    const double lp = loss();
    param.set(i, v - h);
    const double lm = loss();
    param.set(i, v);
    fd.set(i, (lp - lm) / (2 * h));
  }
  EXPECT_TRUE(all_close(what, grad, fd, Tol{1e-6, 1e-6}));
}

double dot(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * b.get(i);
  return s;
}

constexpr DType kF64 = DType::kFloat64;

TEST(NormReference, RmsNormBackwardFiniteDifference) {
  const int64_t M = 3, N = 7;
  const float eps = 1e-5f;
  Rng rng(hash_str("rms_fd"));
  for (bool with_w : {true, false}) {
    SCOPED_TRACE(with_w ? "weight" : "no weight");
    HostTensor x = random_tensor(kF64, {M, N}, rng), w = random_weight(kF64, {N}, rng);
    HostTensor g = random_tensor(kF64, {M, N}, rng);
    TensorView wv = w.view();
    const TensorView* wp = with_w ? &wv : nullptr;
    auto loss = [&] {
      HostTensor y(kF64, {M, N});
      EXPECT_TRUE(ref::rms_norm(x.view(), wp, eps, y.view()).ok());
      return dot(g, y);
    };
    HostTensor dx(kF64, {M, N}), dw(kF64, {N});
    TensorView dwv = dw.view();
    KF_ASSERT_OK(ref::rms_norm_backward(g.view(), x.view(), wp, eps, dx.view(), with_w ? &dwv : nullptr));
    check_gradient("dx", x, dx, loss);
    if (with_w) check_gradient("dweight", w, dw, loss);
  }
}

TEST(NormReference, AddRmsNormBackwardFiniteDifference) {
  const int64_t M = 3, N = 6;
  const float eps = 1e-5f;
  Rng rng(hash_str("add_fd"));
  for (bool with_dsum : {true, false}) {
    SCOPED_TRACE(with_dsum ? "dsum" : "no dsum");
    HostTensor x = random_tensor(kF64, {M, N}, rng), res = random_tensor(kF64, {M, N}, rng);
    HostTensor w = random_weight(kF64, {N}, rng);
    HostTensor gy = random_tensor(kF64, {M, N}, rng), gs = random_tensor(kF64, {M, N}, rng);
    TensorView wv = w.view(), gsv = gs.view();
    auto loss = [&] {
      HostTensor y(kF64, {M, N}), s(kF64, {M, N});
      EXPECT_TRUE(ref::add_rms_norm(x.view(), res.view(), &wv, eps, y.view(), s.view()).ok());
      return dot(gy, y) + (with_dsum ? dot(gs, s) : 0.0);
    };
    HostTensor s(kF64, {M, N}), y(kF64, {M, N});
    KF_ASSERT_OK(ref::add_rms_norm(x.view(), res.view(), &wv, eps, y.view(), s.view()));
    HostTensor dx(kF64, {M, N}), dw(kF64, {N});
    TensorView dwv = dw.view();
    KF_ASSERT_OK(
        ref::add_rms_norm_backward(gy.view(), with_dsum ? &gsv : nullptr, s.view(), &wv, eps, dx.view(), &dwv));
    check_gradient("dx (wrt x)", x, dx, loss);
    check_gradient("dx (wrt residual)", res, dx, loss);
    check_gradient("dweight", w, dw, loss);
  }
}

TEST(NormReference, LayerNormBackwardFiniteDifference) {
  const int64_t M = 3, N = 5;
  const float eps = 1e-5f;
  Rng rng(hash_str("ln_fd"));
  for (int mask = 0; mask < 4; ++mask) {
    const bool with_w = mask & 1, with_b = mask & 2;
    SCOPED_TRACE("weight " + std::to_string(with_w) + " bias " + std::to_string(with_b));
    HostTensor x = random_tensor(kF64, {M, N}, rng, -1.0, 3.0);
    HostTensor w = random_weight(kF64, {N}, rng), b = random_tensor(kF64, {N}, rng);
    HostTensor g = random_tensor(kF64, {M, N}, rng);
    TensorView wv = w.view(), bv = b.view();
    const TensorView* wp = with_w ? &wv : nullptr;
    const TensorView* bp = with_b ? &bv : nullptr;
    auto loss = [&] {
      HostTensor y(kF64, {M, N});
      EXPECT_TRUE(ref::layer_norm(x.view(), wp, bp, eps, y.view()).ok());
      return dot(g, y);
    };
    HostTensor dx(kF64, {M, N}), dw(kF64, {N}), db(kF64, {N});
    TensorView dwv = dw.view(), dbv = db.view();
    KF_ASSERT_OK(ref::layer_norm_backward(g.view(), x.view(), wp, bp, eps, dx.view(), with_w ? &dwv : nullptr,
                                          with_b ? &dbv : nullptr));
    check_gradient("dx", x, dx, loss);
    if (with_w) check_gradient("dweight", w, dw, loss);
    if (with_b) check_gradient("dbias", b, db, loss);
  }
}

TEST(NormReference, AdaNormBackwardFiniteDifference) {
  const int64_t B = 2, S = 3, N = 5;
  const float eps = 1e-5f;
  Rng rng(hash_str("ada_fd"));
  const std::vector<std::vector<int64_t>> mod_shapes = {{N}, {B, 1, N}, {B, S, N}};
  for (NormKind kind : {NormKind::kLayer, NormKind::kRms}) {
    for (const auto& ms : mod_shapes) {
      for (bool affine : {false, true}) {
        SCOPED_TRACE(std::string(kind == NormKind::kRms ? "rms" : "layer") + " scale " + shape_str(ms) +
                     (affine ? " affine" : ""));
        HostTensor x = random_tensor(kF64, {B, S, N}, rng, -1.0, 3.0);
        HostTensor scale = random_tensor(kF64, ms, rng, -0.5, 0.5);
        HostTensor shift = random_tensor(kF64, ms, rng);
        HostTensor w = random_weight(kF64, {N}, rng), b = random_tensor(kF64, {N}, rng);
        HostTensor g = random_tensor(kF64, {B, S, N}, rng);
        TensorView wv = w.view(), bv = b.view();
        const TensorView* wp = affine ? &wv : nullptr;
        const TensorView* bp = affine && kind == NormKind::kLayer ? &bv : nullptr;
        auto loss = [&] {
          HostTensor y(kF64, {B, S, N});
          EXPECT_TRUE(ref::ada_norm(x.view(), scale.view(), shift.view(), wp, bp, eps, kind, y.view()).ok());
          return dot(g, y);
        };
        HostTensor dx(kF64, {B, S, N}), dscale(kF64, ms), dshift(kF64, ms), dw(kF64, {N}), db(kF64, {N});
        TensorView dsv = dscale.view(), dhv = dshift.view(), dwv = dw.view(), dbv = db.view();
        KF_ASSERT_OK(ref::ada_norm_backward(g.view(), x.view(), scale.view(), shift.view(), wp, bp, eps, kind,
                                            dx.view(), &dsv, &dhv, wp ? &dwv : nullptr, bp ? &dbv : nullptr));
        check_gradient("dx", x, dx, loss);
        check_gradient("dscale", scale, dscale, loss);
        check_gradient("dshift", shift, dshift, loss);
        if (wp) check_gradient("dweight", w, dw, loss);
        if (bp) check_gradient("dbias", b, db, loss);
      }
    }
  }
}

// Tensors with no elements are valid whatever their strides (a framework's empty tensor [2, 0, 64]
// has strides [64, 64, 1]); nothing is computed and parameter gradients are zero.
// The kernels compute AdaLN's group index r / rows_per_group with make_fast_div's multiply-high:
// exact for every divisor 1 <= d < 2^31 and numerator 0 <= n < 2^31 (edges and random pairs).
TEST(NormFastDiv, MatchesDivision) {
  std::vector<int64_t> ds = {1,
                             2,
                             3,
                             5,
                             7,
                             255,
                             256,
                             257,
                             4095,
                             4096,
                             4097,
                             65535,
                             65536,
                             1000003,
                             (int64_t(1) << 30) - 1,
                             int64_t(1) << 30,
                             (int64_t(1) << 30) + 1,
                             (int64_t(1) << 31) - 1};
  std::vector<uint32_t> ns = {0,     1,           2,          4095,           4096,          4097,
                              65536, 1000000007u, (1u << 30), (1u << 31) - 2, (1u << 31) - 1};
  uint64_t st = 0x9e3779b97f4a7c15ull;
  auto rnd = [&st] {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
  };
  for (int i = 0; i < 200; ++i) ds.push_back(int64_t(rnd() % ((uint64_t(1) << 31) - 1)) + 1);
  for (int i = 0; i < 200; ++i) ns.push_back(uint32_t(rnd() % (uint64_t(1) << 31)));
  for (int64_t d : ds) {
    const kernelforge::FastDiv f = kernelforge::make_fast_div(d);
    for (uint32_t n : ns) ASSERT_EQ(kernelforge::fast_div_host(f, n), uint32_t(n / d)) << "n=" << n << " d=" << d;
    for (int64_t k = 1; k < 4; ++k) {  // around multiples of d, where rounding errors would show
      for (int64_t off = -1; off <= 1; ++off) {
        const int64_t n = k * d + off;
        if (n >= 0 && n < (int64_t(1) << 31)) {
          ASSERT_EQ(kernelforge::fast_div_host(f, uint32_t(n)), uint32_t(n / d)) << "n=" << n << " d=" << d;
        }
      }
    }
  }
}

TEST(NormReference, EmptyTensorsWithAnyStrides) {
  auto empty = [](DType t) {
    TensorView v = kernelforge::make_view(nullptr, t, {2, 0, 64}, Device{DeviceType::kCPU, 0});
    v.strides[0] = 64;  // as torch.empty(2, 0, 64).stride()
    v.strides[1] = 64;
    return v;
  };
  Rng rng(hash_str("empty"));
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    const TensorView x = empty(t), y = empty(t);
    HostTensor w = random_weight(t, {64}, rng), dw(t, {64});
    TensorView wv = w.view(), dwv = dw.view();
    KF_ASSERT_OK(ref::rms_norm(x, &wv, 1e-6f, y));
    KF_ASSERT_OK(ref::layer_norm(x, &wv, nullptr, 1e-5f, y));
    KF_ASSERT_OK(ref::rms_norm_backward(x, x, &wv, 1e-6f, y, &dwv));
    for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(dw.get(i), 0.0) << "dweight[" << i << "] of no rows";
  }
}

// ---- the test helpers themselves -------------------------------------------------------------
TEST(TestUtil, HalfConversionsRoundTrip) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    EXPECT_EQ(fp16_to_float(float_to_fp16(f)), round_to(DType::kFloat16, f)) << f;
  }
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 2048)), 1.0f);  // tie -> even
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(65520.0f))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(65519.0f)), 65504.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 2.0f / 128);
  // all-ones bytes, the poison, are NaN in every float dtype
  EXPECT_TRUE(std::isnan(fp16_to_float(0xFFFF)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0xFFFF)));
  EXPECT_TRUE(std::isnan(bits_float(0xFFFFFFFFu)));
}

}  // namespace
