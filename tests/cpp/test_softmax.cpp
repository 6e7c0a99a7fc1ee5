// The CUDA softmax-family kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case runs the four ops (softmax, log_softmax, softmax_backward, log_softmax_backward) on
// fresh random inputs, with every output buffer poisoned with NaN (0xFF bytes) before the run; every
// element is compared with the reference (NaN never passes), inputs must come back unchanged, and
// bytes outside each output view (row padding, base offset, a guard after the last row) must stay
// untouched. Shapes are chosen per code path (notes/softmax.md): 1, odd and prime lengths (partial
// last vector), short rows packed several per block, 1024 / 4096 / 8191, one-CTA rows up to 32 K
// (the forward row kernel: rows filling its team, 1544 / 3000 leaving vectors of it empty),
// cluster rows (65536, 131072, 262144 bf16 on sm_90), streaming rows (262144 float32, unaligned
// 65536), the bulk-copy kernel (long rows, more rows than SMs), decode (1 row), many rows, no rows.
// Layouts: contiguous, row-padded, odd row stride (a scalar head per row), base + 1 element (one
// element per access). These run the default plan; SoftmaxGpuPlans runs every candidate plan of a
// set of shapes through launch_with_plan (src/softmax/softmax_plan.h). Tests skip without a GPU, and
// fail instead when KF_REQUIRE_GPU=1.
//
// Tolerance: outputs and reference are both rounded to the dtype, so a correct kernel is within
// about one rounding step; the float32 arithmetic adds an error relative to the terms of each
// formula, which sets a per-element absolute bound (see bound() below).
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "softmax/softmax_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

struct Shape {
  int64_t rows, n;
};
const Shape kShapes[] = {{1, 1},      {3, 7},      {5, 127},    {129, 33},  {4, 1024},  {1, 4096},
                         {7, 4096},   {3, 8191},   {33, 2048},  {2, 16384}, {2, 32768}, {2, 65536},
                         {2, 131072}, {1, 262144}, {0, 4096},   {5, 0},     {300, 520}, {200, 1544},
                         {5, 3000},   {140, 4096}, {2, 131073}, {5, 16383}, {7, 1031},  {4, 4095}};

// Layout of the k-th tensor of a call (k = 0: the first input).
Layout layout_of(LayoutKind l, int k) {
  switch (l) {
    case LayoutKind::kMixed:  // (not a layout of this family's tests)
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};  // rows stay 16-byte aligned when the length allows
    case LayoutKind::kOddStride:
      return {3, 0};  // every row starts at a different alignment
    case LayoutKind::kUnaligned:
      return {0, k == 0 ? 1 : 0};  // one base pointer off alignment: the whole call takes the scalar path
  }
  return {};
}

using Case = std::tuple<DType, Shape, LayoutKind>;
void PrintTo(const Shape& s, std::ostream* os) { *os << s.rows << "x" << s.n; }

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// Smallest magnitude a kernel may flush to zero or round differently: ex2.approx.ftz flushes
// results below 2^-126 (float32, bfloat16); float16 outputs have subnormals down to 2^-24.
double floor_of(DType t) { return t == DType::kFloat16 ? 6.0e-8 : 1.0e-37; }

// Per-element bound |got - want| <= rtol |want| + atol_j, atol_j = rtol * (the magnitudes that the
// float32 formula combines) + floor:
//   softmax       exp(x - m) / s        relative only                    atol = 0
//   log_softmax   (x - m) - log s       |x - m| + log s                  (cancellation near 0)
//                 + the float32 sum's own error: s >= 1 carries a relative error of about
//                 (2 + log2 n) float32 epsilons, which log s turns into an absolute one
//   softmax bwd   y (g - Σ g y)         |y| (|g| + Σ |g y|)              (cancellation in g - dot)
//   log bwd       g - exp(y) Σ g        |g| + exp(y) Σ |g|
// The backward's float32 row sum has an error relative to Σ |terms|, not to |Σ terms| (a row of g in
// [-2, 2) summing to ~0.3 over 520 elements loses ~1e-4 of the sum in float32).
struct Bound {
  bool log, bwd;
};
constexpr double kFloatEps = 1.1920928955078125e-07;  // 2^-23, float32
::testing::AssertionResult compare(const char* what, const HostTensor& got, const HostTensor& want,
                                   const HostTensor& in, const HostTensor* y, Bound b) {
  if (got.shape != want.shape) return ::testing::AssertionFailure() << what << ": shape mismatch";
  const DType t = got.dtype;
  const double rtol = tolerance(t).rtol, fl = floor_of(t);
  const int64_t n = got.shape.empty() ? 1 : got.shape.back();
  const int64_t rows = n == 0 ? 0 : got.numel() / n;
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t r = 0; r < rows; ++r) {
    // row statistics in double from the inputs the kernel saw
    double m = -INFINITY, s = 0.0, acc = 0.0;  // acc: Σ |terms| of the backward's row sum
    if (!b.bwd) {
      for (int64_t j = 0; j < n; ++j) m = std::max(m, in.get(r * n + j));
      for (int64_t j = 0; j < n; ++j) s += std::exp(in.get(r * n + j) - m);
    } else {
      for (int64_t j = 0; j < n; ++j)
        acc += std::fabs(b.log ? in.get(r * n + j) : in.get(r * n + j) * y->get(r * n + j));
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = r * n + j;
      const double g = got.get(i), w = want.get(i);
      double atol = fl;
      if (!b.bwd && b.log)
        atol += rtol * (std::fabs(in.get(i) - m) + std::fabs(std::log(s))) + kFloatEps * (2.0 + std::log2(double(n)));
      if (b.bwd && !b.log) atol += rtol * std::fabs(y->get(i)) * (std::fabs(in.get(i)) + std::fabs(acc));
      if (b.bwd && b.log) atol += rtol * (std::fabs(in.get(i)) + std::exp(y->get(i)) * std::fabs(acc));
      const double err = std::fabs(g - w);
      const bool fail = !std::isfinite(g) || !std::isfinite(w) || !(err <= atol + rtol * std::fabs(w));
      if (!fail) continue;
      if (bad < 8) first << "\n    [" << r << ", " << j << "] got " << g << " want " << w << " (bound " << atol << ")";
      worst = std::isnan(err) ? err : std::max(worst, err);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << dtype_name(t) << " " << shape_str(got.shape) << ": " << bad
                                       << " of " << got.numel() << " elements differ from the reference (rtol " << rtol
                                       << ", worst |err| " << worst << "); first:" << first.str();
}

// The four ops; `cuda` false = the reference.
Status fwd(bool log, const TensorView& x, const TensorView& y, bool cuda, cudaStream_t s) {
  if (cuda) return log ? kf::log_softmax(x, y, s) : kf::softmax(x, y, s);
  return log ? ref::log_softmax(x, y) : ref::softmax(x, y);
}
Status bwd(bool log, const TensorView& g, const TensorView& y, const TensorView& dx, bool cuda, cudaStream_t s) {
  if (cuda) return log ? kf::log_softmax_backward(g, y, dx, s) : kf::softmax_backward(g, y, dx, s);
  return log ? ref::log_softmax_backward(g, y, dx) : ref::softmax_backward(g, y, dx);
}
const char* op_name(bool log) { return log ? "log_softmax" : "softmax"; }

class SoftmaxGpu : public ::testing::TestWithParam<Case> {
 protected:
  cudaStream_t stream_ = nullptr;
  void SetUp() override {
    KF_NEED_GPU();
    if (dtype() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t M() const { return std::get<1>(GetParam()).rows; }
  int64_t N() const { return std::get<1>(GetParam()).n; }
  LayoutKind layout() const { return std::get<2>(GetParam()); }
  uint64_t seed(const std::string& op) const {
    return hash_str(op + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  // Logits in [-8, 8) with a per-row offset in [-20, 20): rows do not share a max, and exp(x - m)
  // spans ~7 decades.
  HostTensor logits(Rng& rng) const {
    HostTensor h(dtype(), {M(), N()});
    for (int64_t r = 0; r < M(); ++r) {
      const double off = rng.uniform(-20.0, 20.0);
      for (int64_t j = 0; j < N(); ++j) h.set(r * N() + j, off + rng.uniform(-8.0, 8.0));
    }
    return h;
  }
  // A forward output y (the reference's, rounded to the dtype) and a gradient g in [-2, 2).
  void backward_inputs(bool log, Rng& rng, HostTensor* y, HostTensor* g) const {
    const HostTensor x = logits(rng);
    *y = HostTensor(dtype(), {M(), N()});
    EXPECT_TRUE(fwd(log, x.view(), y->view(), false, nullptr).ok());
    *g = random_tensor(dtype(), {M(), N()}, rng);
  }
};

TEST_P(SoftmaxGpu, Forward) {
  const DType t = dtype();
  for (bool log : {false, true}) {
    SCOPED_TRACE(op_name(log));
    Rng rng(seed(std::string(op_name(log)) + " fwd"));
    const HostTensor x = logits(rng);
    HostTensor want(t, {M(), N()});
    KF_ASSERT_OK(fwd(log, x.view(), want.view(), false, nullptr));
    DeviceTensor dx = to_device(x, layout_of(layout(), 0)), y(t, {M(), N()}, layout_of(layout(), 1));
    ASSERT_TRUE(finish(fwd(log, dx.view(), y.view(), true, stream_)));
    EXPECT_TRUE(compare("y", y.download(), want, x, nullptr, {log, false}));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(bit_equal("x is not written", dx.download(), x));
  }
}

TEST_P(SoftmaxGpu, Backward) {
  const DType t = dtype();
  for (bool log : {false, true}) {
    SCOPED_TRACE(std::string(op_name(log)) + "_backward");
    Rng rng(seed(std::string(op_name(log)) + " bwd"));
    HostTensor y, g;
    backward_inputs(log, rng, &y, &g);
    HostTensor want(t, {M(), N()});
    KF_ASSERT_OK(bwd(log, g.view(), y.view(), want.view(), false, nullptr));
    DeviceTensor dg = to_device(g, layout_of(layout(), 0)), dy = to_device(y, layout_of(layout(), 1));
    DeviceTensor dx(t, {M(), N()}, layout_of(layout(), 2));
    ASSERT_TRUE(finish(bwd(log, dg.view(), dy.view(), dx.view(), true, stream_)));
    EXPECT_TRUE(compare("dx", dx.download(), want, g, &y, {log, true}));
    EXPECT_TRUE(dx.check_untouched("dx"));
    EXPECT_TRUE(bit_equal("g is not written", dg.download(), g));
    EXPECT_TRUE(bit_equal("y is not written", dy.download(), y));
  }
}

// y = x and dx = g (one buffer): every element of a row is read before any of it is written.
TEST_P(SoftmaxGpu, InPlace) {
  if (layout() == LayoutKind::kOddStride) GTEST_SKIP() << "covered by the other layouts";
  const DType t = dtype();
  for (bool log : {false, true}) {
    SCOPED_TRACE(op_name(log));
    Rng rng(seed(std::string(op_name(log)) + " inplace"));
    const HostTensor x = logits(rng);
    HostTensor want(t, {M(), N()});
    KF_ASSERT_OK(fwd(log, x.view(), want.view(), false, nullptr));
    DeviceTensor buf = to_device(x, layout_of(layout(), 0));
    ASSERT_TRUE(finish(fwd(log, buf.view(), buf.view(), true, stream_)));
    EXPECT_TRUE(compare("y (in place)", buf.download(), want, x, nullptr, {log, false}));
    EXPECT_TRUE(buf.check_untouched("y (in place)"));

    HostTensor y, g;
    backward_inputs(log, rng, &y, &g);
    HostTensor wdx(t, {M(), N()});
    KF_ASSERT_OK(bwd(log, g.view(), y.view(), wdx.view(), false, nullptr));
    DeviceTensor gbuf = to_device(g, layout_of(layout(), 0)), dy = to_device(y, layout_of(layout(), 1));
    ASSERT_TRUE(finish(bwd(log, gbuf.view(), dy.view(), gbuf.view(), true, stream_)));
    EXPECT_TRUE(compare("dx (in place)", gbuf.download(), wdx, g, &y, {log, true}));
    EXPECT_TRUE(gbuf.check_untouched("dx (in place)"));
  }
}

// Two runs of the same call give identical bits (the (m, s) combine is order-fixed).
TEST_P(SoftmaxGpu, Deterministic) {
  if (layout() != LayoutKind::kContiguous) GTEST_SKIP() << "once per shape";
  const DType t = dtype();
  Rng rng(seed("det"));
  const HostTensor x = logits(rng);
  DeviceTensor dx = to_device(x, {}), y1(t, {M(), N()}), y2(t, {M(), N()});
  ASSERT_TRUE(finish(kf::softmax(dx.view(), y1.view(), stream_)));
  ASSERT_TRUE(finish(kf::softmax(dx.view(), y2.view(), stream_)));
  EXPECT_TRUE(bit_equal("y", y1.download(), y2.download()));
}

INSTANTIATE_TEST_SUITE_P(All, SoftmaxGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

// ---- special values --------------------------------------------------------------------------
// Rows holding NaN, +inf, only -inf, some -inf, huge finite values and constant rows give the
// reference's (= torch.softmax's) values: NaN for the whole row where torch gives NaN. Each row is
// also placed in a long row (cluster / streaming paths) by repeating it.
class SoftmaxGpuSpecial : public SoftmaxGpu {};

TEST_P(SoftmaxGpuSpecial, NonFinite) {
  const DType t = dtype();
  const double inf = INFINITY, nan = NAN;
  const double huge = t == DType::kFloat16 ? 60000.0 : 1e30;
  const std::vector<std::vector<double>> patterns = {
      {1.0, nan, 2.0, 3.0},     {1.0, inf, 2.0, 3.0}, {-inf, -inf, -inf, -inf},     {-inf, 1.0, -inf, 2.0},
      {huge, -huge, 0.0, huge}, {5.0, 5.0, 5.0, 5.0}, {-huge, -huge, -huge, -huge}, {0.0, -0.0, 1e-3, -1e-3}};
  // 4096: the forward row kernel (eight rows: one vector per thread); N: cluster / bulk / streaming
  for (int64_t n : {int64_t(4), int64_t(4096), int64_t(4099), N()}) {
    const int64_t rows = int64_t(patterns.size());
    HostTensor x(t, {rows, n}), g(t, {rows, n});
    Rng rng(seed("special" + std::to_string(n)));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const size_t k = size_t(j % 4);
        // the special values once per row (long rows: the rest is the finite pattern's neighbours)
        x.set(r * n + j, j < 4 || (n > 4 && j == n - 1) ? patterns[size_t(r)][k] : rng.uniform(-2.0, 2.0));
        g.set(r * n + j, rng.uniform(-2.0, 2.0));
      }
    for (bool log : {false, true}) {
      SCOPED_TRACE(std::string(op_name(log)) + " n = " + std::to_string(n));
      HostTensor want(t, {rows, n}), wdx(t, {rows, n});
      KF_ASSERT_OK(fwd(log, x.view(), want.view(), false, nullptr));
      KF_ASSERT_OK(bwd(log, g.view(), want.view(), wdx.view(), false, nullptr));
      DeviceTensor dxin = to_device(x, {}), y(t, {rows, n}), dg = to_device(g, {}), dyin = to_device(want, {});
      DeviceTensor dx(t, {rows, n});
      ASSERT_TRUE(finish(fwd(log, dxin.view(), y.view(), true, stream_)));
      ASSERT_TRUE(finish(bwd(log, dg.view(), dyin.view(), dx.view(), true, stream_)));
      const HostTensor gy = y.download(), gdx = dx.download();
      const double rtol = tolerance(t).rtol;
      for (int64_t i = 0; i < rows * n; ++i) {
        for (int which = 0; which < 2; ++which) {
          const double got = which ? gdx.get(i) : gy.get(i), w = which ? wdx.get(i) : want.get(i);
          if (std::isnan(w)) {
            EXPECT_TRUE(std::isnan(got)) << (which ? "dx" : "y") << "[" << i / n << ", " << i % n << "] got " << got;
          } else if (std::isinf(w)) {
            EXPECT_EQ(got, w) << (which ? "dx" : "y") << "[" << i / n << ", " << i % n << "]";
          } else {
            // a loose bound: these rows test the special-value paths, the random tests the accuracy
            EXPECT_TRUE(std::isfinite(got) && std::fabs(got - w) <= 4 * rtol * (1.0 + std::fabs(w)))
                << (which ? "dx" : "y") << "[" << i / n << ", " << i % n << "] got " << got << " want " << w;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SoftmaxGpuSpecial,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(Shape{1, 131072}),
                                            ::testing::Values(LayoutKind::kContiguous)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           return std::string(t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16");
                         });

// The bulk-copy kernel (sm_90) with its default plan: long rows and more rows than SMs (H100/H200:
// 132; B200: 148), so the persistent grid loops over rows and reuses its pipeline stages: bf16 65536
// -> 2 CTAs of 64 KB slices, float32 -> 4 CTAs, 2 stages each; bf16 32000 (62.5 KB rows: the
// forward's bulk plan from 32 KB rows, one CTA per row, 8 vectors per thread) and 12288 (24 KB: the
// forward's row kernel at 512 threads x 4 vectors; float32 48 KB: bulk); the backward's softmax_regs.
// SoftmaxGpuPlans runs the bulk kernels at any row length and count, the backward's too.
INSTANTIATE_TEST_SUITE_P(Bulk, SoftmaxGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16),
                                            ::testing::Values(Shape{140, 65536}, Shape{140, 12288}, Shape{140, 32000}),
                                            ::testing::Values(LayoutKind::kContiguous)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           return std::string(t == DType::kFloat32 ? "fp32" : "bf16") + "_" + std::to_string(s.rows) +
                                  "x" + std::to_string(s.n) +
                                  (std::get<2>(info.param) == LayoutKind::kContiguous ? "_contiguous" : "_padded");
                         });

// ---- every candidate plan ---------------------------------------------------------------------
// Each op of each shape runs every plan of kernelforge::softmax_candidate_plans (the default plan,
// the other kernels, team sizes, vectors per thread, forward modes, cluster sizes, streaming and bulk
// stages) through launch_with_plan, against one float64 reference, the output poisoned before each
// plan. The shapes give every kernel kind something to do: short and odd rows, one-CTA rows, rows
// that need a cluster or streaming, and (140 rows of 32768) more rows than the bulk kernels'
// persistent grid holds at once. Failures name the plan (SCOPED_TRACE) and the plan that ran
// (last_plan(), printed by test_main.cpp).
class SoftmaxGpuPlans : public SoftmaxGpu {};

TEST_P(SoftmaxGpuPlans, EveryCandidate) {
  const DType t = dtype();
  const std::vector<int64_t> shape = {M(), N()};
  for (int op = 0; op < 4; ++op) {
    const bool log = (op & 1) != 0, backward = (op & 2) != 0;
    SCOPED_TRACE(std::string(op_name(log)) + (backward ? "_backward" : ""));
    Rng rng(seed(std::string(op_name(log)) + (backward ? " bwd plans" : " fwd plans")));
    HostTensor in, y, want(t, shape);
    if (backward) {
      backward_inputs(log, rng, &y, &in);
      KF_ASSERT_OK(bwd(log, in.view(), y.view(), want.view(), false, nullptr));
    } else {
      in = logits(rng);
      KF_ASSERT_OK(fwd(log, in.view(), want.view(), false, nullptr));
    }
    const DeviceTensor din = to_device(in, layout_of(layout(), 0));
    DeviceTensor dy;
    if (backward) dy = to_device(y, layout_of(layout(), 1));
    DeviceTensor dout(t, shape, layout_of(layout(), backward ? 2 : 1));
    const TensorView vin = din.view(), vout = dout.view();
    TensorView vy;
    if (backward) vy = dy.view();
    kf::SoftmaxCall c;
    c.name = log ? (backward ? "log_softmax_backward" : "log_softmax") : (backward ? "softmax_backward" : "softmax");
    c.log = log;
    c.backward = backward;
    if (backward) {
      c.g = &vin, c.y = &vy, c.dx = &vout;
    } else {
      c.x = &vin, c.y = &vout;
    }
    std::vector<kf::SoftmaxPlan> plans;
    KF_ASSERT_OK(kf::softmax_candidate_plans(c, &plans));
    ASSERT_FALSE(plans.empty());
    for (const kf::SoftmaxPlan& plan : plans) {
      SCOPED_TRACE(kf::to_string(plan));
      dout.poison();
      ASSERT_TRUE(finish(kf::launch_with_plan(plan, c, stream_)));
      EXPECT_TRUE(compare(backward ? "dx" : "y", dout.download(), want, in, backward ? &y : nullptr, {log, backward}));
      EXPECT_TRUE(dout.check_untouched(backward ? "dx" : "y"));
    }
    EXPECT_TRUE(bit_equal("the input is not written", din.download(), in));
  }
}

// A plan that does not fit the call is an error naming the plan, not a launch.
TEST(SoftmaxGpuPlanErrors, RejectedPlan) {
  KF_NEED_GPU();
  const DType t = DType::kFloat32;
  DeviceTensor x(t, {4, 4096}), y(t, {4, 4096});
  const TensorView vx = x.view(), vy = y.view();
  kf::SoftmaxCall c;
  c.name = "softmax_backward";
  c.backward = true;
  c.g = &vx, c.y = &vy, c.dx = &vy;
  kf::SoftmaxPlan plan;
  plan.kind = kf::SoftmaxKernel::kFwdRow;
  plan.vec = 4, plan.iters = 2, plan.threads = 512;
  const Status st = kf::launch_with_plan(plan, c, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(has_substrings(st, {"softmax_backward", "fwd_row", "forward only"}));
}

const Shape kPlanShapes[] = {{1, 1},     {3, 7},     {129, 33},  {1, 4096},  {33, 2048},  {7, 4096},   {3, 8191},
                             {5, 16383}, {4, 12288}, {3, 32000}, {2, 65536}, {2, 131073}, {1, 262144}, {140, 32768}};

INSTANTIATE_TEST_SUITE_P(All, SoftmaxGpuPlans,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kPlanShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kOddStride,
                                                              LayoutKind::kUnaligned)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

// More rows than a grid holds in one pass at once, and a 1-D view; a 3-D view with a row stride.
TEST(SoftmaxGpuManyRows, RowLoopAndViews) {
  KF_NEED_GPU();
  const DType t = DType::kFloat16;
  const int64_t m = 600000, n = 3;
  Rng rng(99);
  HostTensor x = random_tensor(t, {m, n}, rng, -6, 6), want(t, {m, n});
  KF_ASSERT_OK(ref::softmax(x.view(), want.view()));
  DeviceTensor dx = to_device(x, {}), y(t, {m, n});
  KF_ASSERT_OK(kf::softmax(dx.view(), y.view(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));

  HostTensor x1 = random_tensor(t, {4097}, rng, -6, 6), w1(t, {4097});
  KF_ASSERT_OK(ref::log_softmax(x1.view(), w1.view()));
  DeviceTensor d1 = to_device(x1, {}), y1(t, {4097});
  KF_ASSERT_OK(kf::log_softmax(d1.view(), y1.view(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close("y 1-D", y1.download(), w1, Tol{2e-3, 2e-2}));

  HostTensor x3 = random_tensor(t, {2, 3, 100}, rng, -6, 6), w3(t, {2, 3, 100});
  KF_ASSERT_OK(ref::softmax(x3.view(), w3.view()));
  DeviceTensor d3 = to_device(x3, {28, 5}), y3(t, {2, 3, 100}, {4, 0});
  KF_ASSERT_OK(kf::softmax(d3.view(), y3.view(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close("y 3-D", y3.download(), w3, Tol{2e-3, 1e-6}));
  EXPECT_TRUE(y3.check_untouched("y 3-D"));
}

// More than 2^31 elements in all (64-bit row offsets): [16385, 131072] bf16 (4.3 GB per tensor).
// Zeros everywhere except the first and last rows (softmax of zeros is 1/n), which are random.
TEST(SoftmaxGpuLarge, Over2To31Elements) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80+";
  const DType t = DType::kBFloat16;
  const int64_t m = 16385, n = 131072;  // m * n = 2^31 + 2^17
  size_t free_b = 0, total_b = 0;
  KF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t bytes = size_t(m * n) * 2;
  if (free_b < 2 * bytes + (size_t(1) << 30)) GTEST_SKIP() << "needs " << 2 * bytes / (1 << 20) << " MB free";
  void *xb = nullptr, *yb = nullptr;
  KF_CUDA_CHECK(cudaMalloc(&xb, bytes));
  KF_CUDA_CHECK(cudaMalloc(&yb, bytes));
  KF_CUDA_CHECK(cudaMemset(xb, 0, bytes));
  KF_CUDA_CHECK(cudaMemset(yb, 0xFF, bytes));
  Rng rng(7);
  HostTensor row0 = random_tensor(t, {1, n}, rng, -8, 8), rowl = random_tensor(t, {1, n}, rng, -8, 8);
  KF_CUDA_CHECK(cudaMemcpy(xb, row0.bytes.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
  KF_CUDA_CHECK(cudaMemcpy(static_cast<char*>(xb) + size_t(m - 1) * n * 2, rowl.bytes.data(), size_t(n) * 2,
                           cudaMemcpyHostToDevice));
  const TensorView xv = kf::make_view(xb, t, {m, n}), yv = kf::make_view(yb, t, {m, n});
  for (bool log : {false, true}) {
    SCOPED_TRACE(op_name(log));
    KF_ASSERT_OK(fwd(log, xv, yv, true, nullptr));
    KF_CUDA_CHECK(cudaDeviceSynchronize());
    for (int64_t r : {int64_t(0), m / 2, m - 1}) {
      const HostTensor& in = r == 0 ? row0 : rowl;
      HostTensor xr(t, {1, n}), got(t, {1, n}), want(t, {1, n});
      if (r == m / 2) {
        for (int64_t j = 0; j < n; ++j) xr.set(j, 0.0);
      } else {
        xr = in;
      }
      KF_ASSERT_OK(fwd(log, xr.view(), want.view(), false, nullptr));
      KF_CUDA_CHECK(cudaMemcpy(got.bytes.data(), static_cast<char*>(yb) + size_t(r) * n * 2, size_t(n) * 2,
                               cudaMemcpyDeviceToHost));
      EXPECT_TRUE(compare("y row", got, want, xr, nullptr, {log, false})) << "row " << r;
    }
  }
  cudaFree(xb);
  cudaFree(yb);
}

}  // namespace
