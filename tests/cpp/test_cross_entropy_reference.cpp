// The float64 CPU reference of the cross-entropy family (kernelforge::ref) checked on its own,
// without a GPU:
//  - forward results against hand values (3 classes; Python float64 math of the formulas in
//    cross_entropy.h): lse - x_t, label smoothing, z-loss, softcap, all three together;
//  - ignore_index rows (0 loss, lse still written, not counted), every row ignored (mean NaN,
//    valid 0), an ignore_index inside [0, V), mean / sum / none (loss not written for none);
//  - int32 and strided targets, row-strided and 16-bit logits;
//  - an out-of-range target is an error naming the row (forward and backward);
//  - backward against finite differences of the forward in double (float64 logits), with every
//    option and reduction, the `valid` argument as the mean's divisor, and in place.
// These run on CI (no GPU), so the oracle the GPU tests trust is itself tested.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
using kernelforge::CrossEntropyOptions;
using kernelforge::Reduction;
using kernelforge::StatusCode;

constexpr DType F64 = DType::kFloat64;
constexpr DType F32 = DType::kFloat32;
constexpr DType I64 = DType::kInt64;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

// True when every byte of the tensor is still the 0xFF poison (the output was not written).
bool untouched(const HostTensor& h) {
  const size_t n = static_cast<size_t>(h.numel()) * kernelforge::dtype_size(h.dtype);
  for (size_t b = 0; b < n; ++b)
    if (h.bytes[b] != 0xFF) return false;
  return true;
}

// The forward's outputs for T rows.
struct Fwd {
  HostTensor row_loss, lse, loss, valid;
  explicit Fwd(int64_t rows) : row_loss(F32, {rows}), lse(F32, {rows}), loss(F32, {}), valid(F32, {}) {}
  Status run(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& o) {
    return ref::cross_entropy(logits, target, o, row_loss.view(), lse.view(), loss.view(), valid.view());
  }
};

CrossEntropyOptions opts(double eps, double zl, double cap, Reduction red = Reduction::kMean) {
  CrossEntropyOptions o;
  o.label_smoothing = eps;
  o.z_loss_scale = zl;
  o.softcap = cap;
  o.reduction = red;
  return o;
}

// Two rows of 3 classes: x0 = [1, 2, 3] with target 2, x1 = [0.5, -1, 2] with target 1. Wanted
// (lse0, row_loss0, lse1, row_loss1), from Python float64 math of the header's formulas:
//   z = cap * tanh(x / cap), lse = log sum exp z, loss = lse - (1 - eps) z_t - eps/V sum z + zl lse^2
const std::vector<double> kX = {1.0, 2.0, 3.0, 0.5, -1.0, 2.0};
const std::vector<double> kT = {2, 1};
struct Hand {
  const char* name;
  double eps, zl, cap;
  double lse0, loss0, lse1, loss1;
};
const Hand kHand[] = {
    {"plain", 0, 0, 0, 3.4076059644443806, 0.4076059644443806, 2.241311296657157, 3.241311296657157},
    {"label smoothing 0.1", 0.1, 0, 0, 3.4076059644443806, 0.5076059644443804, 2.241311296657157, 3.091311296657157},
    {"z-loss 0.01", 0, 0.01, 0, 3.4076059644443806, 0.5237237485335497, 2.241311296657157, 3.291546059942387},
    {"softcap 2", 0, 0, 2, 2.581656979471634, 0.7713604721819014, 1.8894474254704687, 2.8136817399904883},
    {"all three", 0.1, 0.01, 2, 2.581656979471634, 0.8771156793833779, 1.8894474254704687, 2.7206653802013583},
};

TEST(CeReference, HandValuesThreeClasses) {
  HostTensor x = make(F64, {2, 3}, kX), t = make(I64, {2}, kT);
  for (const Hand& h : kHand) {
    SCOPED_TRACE(h.name);
    for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      SCOPED_TRACE(static_cast<int>(red));
      Fwd f(2);
      KF_ASSERT_OK(f.run(x.view(), t.view(), opts(h.eps, h.zl, h.cap, red)));
      // float32 outputs: the float64 result rounded once
      EXPECT_FLOAT_EQ(f.lse.get(0), h.lse0);
      EXPECT_FLOAT_EQ(f.lse.get(1), h.lse1);
      EXPECT_FLOAT_EQ(f.row_loss.get(0), h.loss0);
      EXPECT_FLOAT_EQ(f.row_loss.get(1), h.loss1);
      EXPECT_EQ(f.valid.get(0), 2.0);
      if (red == Reduction::kMean) {
        EXPECT_FLOAT_EQ(f.loss.get(0), (h.loss0 + h.loss1) / 2);
      }
      if (red == Reduction::kSum) {
        EXPECT_FLOAT_EQ(f.loss.get(0), h.loss0 + h.loss1);
      }
      if (red == Reduction::kNone) {
        EXPECT_TRUE(untouched(f.loss)) << "loss is not written for Reduction::kNone";
      }
    }
  }
}

// loss = lse - x_t written out for a row with one dominant class, and a single class (V = 1: the
// loss is exactly 0 and lse = x).
TEST(CeReference, LseMinusTargetLogit) {
  HostTensor x = make(F64, {2, 3}, {10.0, -10.0, 0.0, 0.0, 0.0, 0.0}), t = make(I64, {2}, {0, 2});
  Fwd f(2);
  KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0, 0, 0)));
  const double lse0 = 10.0 + std::log1p(std::exp(-20.0) + std::exp(-10.0));
  EXPECT_FLOAT_EQ(f.lse.get(0), lse0);
  EXPECT_FLOAT_EQ(f.row_loss.get(0), lse0 - 10.0);
  EXPECT_EQ(f.lse.get(1), static_cast<float>(std::log(3.0)));  // uniform logits: log V
  EXPECT_EQ(f.row_loss.get(1), static_cast<float>(std::log(3.0)));

  HostTensor x1 = make(F64, {3, 1}, {-2.5, 0.0, 7.0}), t1 = make(I64, {3}, {0, 0, 0});
  Fwd g(3);
  KF_ASSERT_OK(g.run(x1.view(), t1.view(), opts(0.3, 0.01, 0)));
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(g.lse.get(i), x1.get(i));
    // lse - (1 - eps) x - eps x + z lse^2 = z lse^2
    EXPECT_FLOAT_EQ(g.row_loss.get(i), 0.01 * x1.get(i) * x1.get(i));
  }
}

TEST(CeReference, IgnoredRows) {
  // rows 1 and 3 ignored (default -100); the loss averages rows 0 and 2 only
  HostTensor x = make(F64, {4, 3}, {1, 2, 3, 9, 9, 9, 0.5, -1, 2, -4, 0, 4}), t = make(I64, {4}, {2, -100, 1, -100});
  Fwd f(4);
  KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0.1, 0.01, 2, Reduction::kMean)));
  const Hand& h = kHand[4];
  EXPECT_FLOAT_EQ(f.row_loss.get(0), h.loss0);
  EXPECT_EQ(f.row_loss.get(1), 0.0);
  EXPECT_FLOAT_EQ(f.row_loss.get(2), h.loss1);
  EXPECT_EQ(f.row_loss.get(3), 0.0);
  EXPECT_EQ(f.valid.get(0), 2.0);
  EXPECT_FLOAT_EQ(f.loss.get(0), (h.loss0 + h.loss1) / 2);
  // an ignored row still gets its lse: cap 2 of [9, 9, 9] = 3 equal values
  EXPECT_FLOAT_EQ(f.lse.get(1), 2 * std::tanh(4.5) + std::log(3.0));
  EXPECT_TRUE(std::isfinite(f.lse.get(3)));

  // sum: the same two rows
  Fwd s(4);
  KF_ASSERT_OK(s.run(x.view(), t.view(), opts(0.1, 0.01, 2, Reduction::kSum)));
  EXPECT_FLOAT_EQ(s.loss.get(0), h.loss0 + h.loss1);
}

// An ignore_index inside [0, V) is honoured: class 1 rows are skipped, -100 is then a bad target.
TEST(CeReference, IgnoreIndexInsideVocab) {
  HostTensor x = make(F64, {2, 3}, kX), t = make(I64, {2}, {2, 1});
  CrossEntropyOptions o = opts(0, 0, 0, Reduction::kSum);
  o.ignore_index = 1;
  Fwd f(2);
  KF_ASSERT_OK(f.run(x.view(), t.view(), o));
  EXPECT_FLOAT_EQ(f.row_loss.get(0), kHand[0].loss0);
  EXPECT_EQ(f.row_loss.get(1), 0.0);
  EXPECT_EQ(f.valid.get(0), 1.0);
  EXPECT_FLOAT_EQ(f.loss.get(0), kHand[0].loss0);
  HostTensor bad = make(I64, {2}, {2, -100});
  KF_EXPECT_INVALID(f.run(x.view(), bad.view(), o), "target[1] = -100", "outside [0, 3)");
}

// Every row ignored: mean = 0 / 0 = NaN (as PyTorch), sum = 0, valid = 0, and the backward gives
// a zero gradient (no 0 / 0 reaches it).
TEST(CeReference, AllRowsIgnored) {
  HostTensor x = make(F64, {2, 3}, kX), t = make(I64, {2}, {-100, -100});
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    SCOPED_TRACE(static_cast<int>(red));
    Fwd f(2);
    KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0.1, 0.01, 0, red)));
    EXPECT_EQ(f.valid.get(0), 0.0);
    EXPECT_EQ(f.row_loss.get(0), 0.0);
    EXPECT_EQ(f.row_loss.get(1), 0.0);
    EXPECT_FLOAT_EQ(f.lse.get(0), kHand[0].lse0);
    if (red == Reduction::kMean) {
      EXPECT_TRUE(std::isnan(f.loss.get(0))) << f.loss.get(0);
    }
    if (red == Reduction::kSum) {
      EXPECT_EQ(f.loss.get(0), 0.0);
    }
    if (red == Reduction::kNone) {
      EXPECT_TRUE(untouched(f.loss));
    }
    HostTensor dloss = red == Reduction::kNone ? make(F32, {2}, {1.5, -2}) : make(F32, {}, {1.5});
    HostTensor dx(F64, {2, 3});
    KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(),
                                             opts(0.1, 0.01, 0, red), dx.view()));
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(dx.get(i), 0.0) << i;
      EXPECT_FALSE(std::signbit(dx.get(i))) << "a +0 gradient, element " << i;
    }
  }
}

// No rows: valid 0, mean NaN, sum 0, and the backward writes nothing.
TEST(CeReference, NoRows) {
  HostTensor x(F64, {0, 5}), t(I64, {0});
  Fwd f(0);
  KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0, 0, 0, Reduction::kMean)));
  EXPECT_EQ(f.valid.get(0), 0.0);
  EXPECT_TRUE(std::isnan(f.loss.get(0)));
  Fwd s(0);
  KF_ASSERT_OK(s.run(x.view(), t.view(), opts(0, 0, 0, Reduction::kSum)));
  EXPECT_EQ(s.loss.get(0), 0.0);
  HostTensor dloss = make(F32, {}, {1.0}), dx(F64, {0, 5});
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(),
                                           opts(0, 0, 0, Reduction::kMean), dx.view()));
}

// int32 targets and a strided int64 target (any stride) give the same results as contiguous int64.
TEST(CeReference, TargetDtypesAndStrides) {
  Rng rng(31);
  const int64_t m = 5, v = 11;
  HostTensor x(F64, {m, v});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(3.0));
  const std::vector<double> tv = {3, -100, 10, 0, 7};
  HostTensor t64 = make(I64, {m}, tv), t32 = make(DType::kInt32, {m}, tv);
  HostTensor wide(I64, {3 * m});  // every third element; the others are -1 (poison): out of range if read
  for (int64_t i = 0; i < m; ++i) wide.set(3 * i, tv[i]);
  TensorView ts = wide.view();
  ts.shape[0] = m;
  ts.strides[0] = 3;
  const CrossEntropyOptions o = opts(0.05, 1e-3, 0, Reduction::kSum);
  Fwd a(m), b(m), c(m);
  KF_ASSERT_OK(a.run(x.view(), t64.view(), o));
  KF_ASSERT_OK(b.run(x.view(), t32.view(), o));
  KF_ASSERT_OK(c.run(x.view(), ts, o));
  EXPECT_TRUE(bit_equal("row_loss int32", b.row_loss, a.row_loss));
  EXPECT_TRUE(bit_equal("row_loss strided", c.row_loss, a.row_loss));
  EXPECT_TRUE(bit_equal("loss int32", b.loss, a.loss));
  EXPECT_TRUE(bit_equal("loss strided", c.loss, a.loss));
  EXPECT_EQ(a.valid.get(0), 4.0);
  HostTensor dloss = make(F32, {}, {0.75}), d1(F64, {m, v}), d2(F64, {m, v});
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss.view(), x.view(), t64.view(), a.lse.view(), a.valid.view(), o, d1.view()));
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss.view(), x.view(), t32.view(), a.lse.view(), a.valid.view(), o, d2.view()));
  EXPECT_TRUE(bit_equal("gradient int32", d2, d1));
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), ts, a.lse.view(), a.valid.view(), o, d2.view()));
  EXPECT_TRUE(bit_equal("gradient strided target", d2, d1));
}

// A row-strided logits view (x[:, :V] of a wider buffer) gives the dense result; 16-bit logits are
// read exactly (the result equals float64 logits holding the same values) and the gradient is the
// float64 gradient rounded once to the dtype.
TEST(CeReference, LogitLayoutsAndDtypes) {
  Rng rng(32);
  const int64_t m = 4, v = 9, pad = 3;
  HostTensor wide(F64, {m, v + pad}), dense(F64, {m, v});
  for (int64_t i = 0; i < wide.numel(); ++i) wide.set(i, rng.normal(2.0));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < v; ++c) dense.set(r * v + c, wide.get(r * (v + pad) + c));
  TensorView sv = wide.view();
  sv.shape[1] = v;  // strides stay {v + pad, 1}
  HostTensor t = make(I64, {m}, {0, 8, -100, 4});
  const CrossEntropyOptions o = opts(0.1, 1e-4, 5.0, Reduction::kMean);
  Fwd a(m), b(m);
  KF_ASSERT_OK(a.run(sv, t.view(), o));
  KF_ASSERT_OK(b.run(dense.view(), t.view(), o));
  EXPECT_TRUE(bit_equal("row_loss strided vs dense", a.row_loss, b.row_loss));
  EXPECT_TRUE(bit_equal("lse strided vs dense", a.lse, b.lse));

  HostTensor dloss = make(F32, {}, {1.25}), want64(F64, {m, v});
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), dense.view(), t.view(), b.lse.view(), b.valid.view(), o,
                                           want64.view()));
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    HostTensor x(dt, {m, v}), x64(F64, {m, v});
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.set(i, dense.get(i));
      x64.set(i, x.get(i));  // the same (rounded) values in float64
    }
    Fwd f(m), g(m);
    KF_ASSERT_OK(f.run(x.view(), t.view(), o));
    KF_ASSERT_OK(g.run(x64.view(), t.view(), o));
    EXPECT_TRUE(bit_equal("row_loss", f.row_loss, g.row_loss));
    EXPECT_TRUE(bit_equal("lse", f.lse, g.lse));
    HostTensor d(dt, {m, v}), d64(F64, {m, v});
    KF_ASSERT_OK(
        ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(), o, d.view()));
    KF_ASSERT_OK(
        ref::cross_entropy_backward(dloss.view(), x64.view(), t.view(), g.lse.view(), g.valid.view(), o, d64.view()));
    for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.get(i), round_to(dt, d64.get(i))) << "element " << i;
  }
}

// An out-of-range target has no defined loss: the reference refuses it and names the row.
TEST(CeReference, OutOfRangeTargetNamesTheRow) {
  HostTensor x = make(F64, {3, 3}, {1, 2, 3, 0.5, -1, 2, 0, 0, 0});
  HostTensor t = make(I64, {3}, {2, 3, 0}), tn = make(I64, {3}, {0, 1, -1});
  HostTensor t32 = make(DType::kInt32, {3}, {2, 1, 7});
  Fwd f(3);
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    const CrossEntropyOptions o = opts(0, 0, 0, red);
    KF_EXPECT_INVALID(f.run(x.view(), t.view(), o), "cross_entropy: target[1] = 3 is outside [0, 3)",
                      "not ignore_index");
    KF_EXPECT_INVALID(f.run(x.view(), tn.view(), o), "cross_entropy: target[2] = -1 is outside [0, 3)");
    KF_EXPECT_INVALID(f.run(x.view(), t32.view(), o), "target[2] = 7");
  }
  HostTensor good = make(I64, {3}, {2, 1, 0}), dloss = make(F32, {}, {1.0}), dx(F64, {3, 3});
  Fwd g(3);
  KF_ASSERT_OK(g.run(x.view(), good.view(), opts(0, 0, 0)));
  KF_EXPECT_INVALID(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), g.lse.view(), g.valid.view(),
                                                opts(0, 0, 0), dx.view()),
                    "cross_entropy_backward: target[1] = 3 is outside [0, 3)");
  KF_EXPECT_INVALID(ref::cross_entropy_backward(dloss.view(), x.view(), tn.view(), g.lse.view(), g.valid.view(),
                                                opts(0, 0, 0), dx.view()),
                    "cross_entropy_backward: target[2] = -1");
}

// ---- backward -----------------------------------------------------------------------------------

// The gradient of the 3-class row by hand: softmax(x) - onehot(t), times dloss (sum).
TEST(CeReference, BackwardHandValues) {
  HostTensor x = make(F64, {1, 3}, {1, 2, 3}), t = make(I64, {1}, {2});
  Fwd f(1);
  KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0, 0, 0, Reduction::kSum)));
  HostTensor dloss = make(F32, {}, {2.0}), dx(F64, {1, 3});
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(),
                                           opts(0, 0, 0, Reduction::kSum), dx.view()));
  const double want[3] = {0.09003057317038043, 0.24472847105479759, -0.3347590442251783};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(dx.get(j), 2.0 * want[j], 1e-15) << j;
}

// f(x) = the reduced loss times dloss (mean / sum), or sum_i dloss_i row_loss_i (none), computed by
// the reference forward. Its outputs are float32, so the finite difference takes a large step and
// Richardson extrapolation: D(h) = (f(x + h) - f(x - h)) / 2h, D = (4 D(h/2) - D(h)) / 3 = f' -
// h^4 f^(5) / 480 (~1e-8 at h = 0.05). The float32 rounding of f (|f| < 16: u <= 9.5e-7 per
// evaluation) adds at most 3u / h ~ 6e-5. Gradients here are O(0.1 - 1), and every option is large
// enough to move them by far more than the 1e-4 tolerance (z-loss 0.05, softcap 3, smoothing 0.2).
double objective(const HostTensor& x, const HostTensor& t, const CrossEntropyOptions& o, const HostTensor& dloss,
                 const TensorView& dloss_view) {
  Fwd f(x.shape[0]);
  const Status s = f.run(x.view(), t.view(), o);
  EXPECT_TRUE(s.ok()) << s.message();
  if (o.reduction != Reduction::kNone) return f.loss.get(0) * dloss.get(0);
  double acc = 0;
  const float* d = static_cast<const float*>(dloss_view.data);
  for (int64_t i = 0; i < x.shape[0]; ++i) acc += f.row_loss.get(i) * double(d[i * dloss_view.strides[0]]);
  return acc;
}

TEST(CeReference, BackwardMatchesFiniteDifferences) {
  struct O {
    const char* name;
    double eps, zl, cap;
  };
  const O os[] = {{"plain", 0, 0, 0},       {"label smoothing 0.2", 0.2, 0, 0}, {"z-loss 0.05", 0, 0.05, 0},
                  {"softcap 3", 0, 0, 3.0}, {"smoothing 1", 1.0, 0, 0},         {"all", 0.2, 0.05, 3.0}};
  const int64_t m = 4, v = 6;
  for (const O& oo : os) {
    for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      SCOPED_TRACE(std::string(oo.name) + ", reduction " + std::to_string(static_cast<int>(red)));
      Rng rng(hash_str(oo.name) + static_cast<uint64_t>(red));
      HostTensor x(F64, {m, v});
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(1.5));
      HostTensor t = make(I64, {m}, {1, -100, 5, 0});
      const CrossEntropyOptions o = opts(oo.eps, oo.zl, oo.cap, red);
      // dloss: a scalar, or a [m] view with stride 2 for none
      HostTensor dloss(F32, red == Reduction::kNone ? std::vector<int64_t>{2 * m} : std::vector<int64_t>{});
      for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, rng.uniform(0.5, 1.5) * (i % 3 == 1 ? -1 : 1));
      TensorView dv = dloss.view();
      if (red == Reduction::kNone) {
        dv.shape[0] = m;
        dv.strides[0] = 2;
      }
      Fwd f(m);
      KF_ASSERT_OK(f.run(x.view(), t.view(), o));
      HostTensor dx(F64, {m, v});
      KF_ASSERT_OK(ref::cross_entropy_backward(dv, x.view(), t.view(), f.lse.view(), f.valid.view(), o, dx.view()));
      const double h = 0.05;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double x0 = x.get(i);
        auto central = [&](double step) {
          x.set(i, x0 + step);
          const double fp = objective(x, t, o, dloss, dv);
          x.set(i, x0 - step);
          const double fm = objective(x, t, o, dloss, dv);
          x.set(i, x0);
          return (fp - fm) / (2 * step);
        };
        const double fd = (4 * central(h / 2) - central(h)) / 3;
        EXPECT_NEAR(dx.get(i), fd, 1e-4) << "element " << i << " (row " << i / v << ")";
        if (i / v == 1) {
          EXPECT_EQ(dx.get(i), 0.0) << "ignored row, element " << i;
        }
      }
    }
  }
}

// The mean's divisor is the `valid` argument (a chunk of a longer call passes the total count), not
// the number of valid rows of this call.
TEST(CeReference, BackwardMeanDividesByValidArgument) {
  Rng rng(41);
  HostTensor x(F64, {3, 5});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(2.0));
  HostTensor t = make(I64, {3}, {4, 0, -100});
  const CrossEntropyOptions mean = opts(0.1, 1e-3, 0, Reduction::kMean), sum = opts(0.1, 1e-3, 0, Reduction::kSum);
  Fwd f(3);
  KF_ASSERT_OK(f.run(x.view(), t.view(), mean));
  ASSERT_EQ(f.valid.get(0), 2.0);
  HostTensor dloss = make(F32, {}, {3.0}), dloss8 = make(F32, {}, {3.0 / 8.0}), valid8 = make(F32, {}, {8.0});
  HostTensor dm(F64, {3, 5}), ds(F64, {3, 5});
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), valid8.view(), mean, dm.view()));
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss8.view(), x.view(), t.view(), f.lse.view(), f.valid.view(), sum, ds.view()));
  for (int64_t i = 0; i < dm.numel(); ++i) EXPECT_DOUBLE_EQ(dm.get(i), ds.get(i)) << i;
}

// In place (dlogits == logits): the gradient overwrites the logits and equals the out-of-place
// result, for float64 and a 16-bit dtype, with every option.
TEST(CeReference, BackwardInPlace) {
  for (DType dt : {F64, F32, DType::kBFloat16}) {
    for (Reduction red : {Reduction::kMean, Reduction::kNone}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", reduction " + std::to_string(static_cast<int>(red)));
      Rng rng(51 + static_cast<int>(dt));
      const int64_t m = 3, v = 17;
      HostTensor x(dt, {m, v});
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(3.0));
      HostTensor t = make(I64, {m}, {16, -100, 0});
      const CrossEntropyOptions o = opts(0.1, 1e-4, 4.0, red);
      Fwd f(m);
      KF_ASSERT_OK(f.run(x.view(), t.view(), o));
      HostTensor dloss = red == Reduction::kNone ? make(F32, {m}, {0.5, 2.0, -1.5}) : make(F32, {}, {1.5});
      HostTensor out(dt, {m, v});
      KF_ASSERT_OK(
          ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(), o, out.view()));
      HostTensor inplace = x;
      KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), inplace.view(), t.view(), f.lse.view(), f.valid.view(), o,
                                               inplace.view()));
      EXPECT_TRUE(bit_equal("in place vs out of place", inplace, out));
    }
  }
}

// The backward does not use the lse argument's values (it recomputes lse in double), so a float32
// rounding of lse does not leak into the reference gradient.
TEST(CeReference, BackwardRecomputesLse) {
  HostTensor x = make(F64, {2, 3}, kX), t = make(I64, {2}, kT);
  Fwd f(2);
  KF_ASSERT_OK(f.run(x.view(), t.view(), opts(0, 0.01, 0)));
  HostTensor dloss = make(F32, {}, {1.0}), d1(F64, {2, 3}), d2(F64, {2, 3});
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), f.lse.view(), f.valid.view(),
                                           opts(0, 0.01, 0), d1.view()));
  HostTensor junk = make(F32, {2}, {100.0, -100.0});
  KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), junk.view(), f.valid.view(),
                                           opts(0, 0.01, 0), d2.view()));
  EXPECT_TRUE(bit_equal("gradient", d2, d1));
}

// Vocabulary-parallel shards: the logits of 17 classes split into [0, 6), [6, 11) and [11, 17). Each
// shard's forward gives its lse and row_loss; combined as the header says (lse = log sum_r exp lse_r,
// loss = lse + z lse^2 - sum_r (lse_r - row_loss_r)) they give the full forward, and each shard's
// backward with the combined lse gives the full gradient's columns. Targets fall in every shard, an
// ignored row included.
TEST(CeReference, ShardsCombineToTheFullLoss) {
  const int64_t m = 5, v = 17;
  const int64_t cuts[] = {0, 6, 11, 17};
  Rng rng(77);
  HostTensor x(F64, {m, v});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(3.0));
  const HostTensor t = make(I64, {m}, {0, 8, -100, 16, 5});
  for (const CrossEntropyOptions& full_o : {opts(0, 0, 0, Reduction::kNone), opts(0.1, 1e-3, 4.0, Reduction::kNone)}) {
    SCOPED_TRACE("eps " + std::to_string(full_o.label_smoothing));
    Fwd full(m);
    KF_ASSERT_OK(full.run(x.view(), t.view(), full_o));
    HostTensor dloss = make(F32, {m}, {0.5, 2.0, -1.5, 1.0, -0.25});
    HostTensor want(F64, {m, v});
    KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), t.view(), full.lse.view(), full.valid.view(),
                                             full_o, want.view()));
    std::vector<double> sum_exp(m, 0.0), linear(m, 0.0);
    std::vector<HostTensor> parts;
    for (int s = 0; s < 3; ++s) {
      const int64_t w = cuts[s + 1] - cuts[s];
      HostTensor xs(F64, {m, w});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < w; ++j) xs.set(i * w + j, x.get(i * v + cuts[s] + j));
      CrossEntropyOptions o = full_o;
      o.z_loss_scale = 0;  // the z-loss needs the global lse: added after combining
      o.class_start = cuts[s], o.num_classes = v;
      Fwd f(m);
      KF_ASSERT_OK(f.run(xs.view(), t.view(), o));
      for (int64_t i = 0; i < m; ++i) {
        sum_exp[i] += std::exp(double(f.lse.get(i)));
        linear[i] += double(f.lse.get(i)) - double(f.row_loss.get(i));
      }
      parts.push_back(xs);
    }
    HostTensor lse(F32, {m});
    for (int64_t i = 0; i < m; ++i) {
      const double l = std::log(sum_exp[i]);
      lse.set(i, l);
      EXPECT_NEAR(l, full.lse.get(i), 1e-5) << "lse row " << i;
      if (t.get(i) == -100) continue;
      EXPECT_NEAR(l - linear[i] + full_o.z_loss_scale * l * l, full.row_loss.get(i), 1e-5) << "row_loss row " << i;
    }
    for (int s = 0; s < 3; ++s) {
      const int64_t w = cuts[s + 1] - cuts[s];
      CrossEntropyOptions o = full_o;
      o.class_start = cuts[s], o.num_classes = v;
      HostTensor d(F64, {m, w});
      KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), parts[s].view(), t.view(), lse.view(), full.valid.view(),
                                               o, d.view()));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < w; ++j)
          EXPECT_NEAR(d.get(i * w + j), want.get(i * v + cuts[s] + j), 1e-5)
              << "shard " << s << " (" << i << ", " << j << ")";
    }
  }
}

TEST(CeReference, ShardOutOfRangeTargetNamesTheClasses) {
  HostTensor x = make(F64, {1, 3}, {1, 2, 3}), t = make(I64, {1}, {9});
  CrossEntropyOptions o = opts(0, 0, 0);
  o.class_start = 3, o.num_classes = 9;  // classes [0, 9): 9 is outside
  Fwd f(1);
  const Status s = f.run(x.view(), t.view(), o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside [0, 9)"), std::string::npos) << s.message();
}

}  // namespace
