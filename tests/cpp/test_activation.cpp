// The CUDA activation kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case: every op variant (silu_and_mul, swiglu, gelu_and_mul erf/tanh x gate first/second,
// geglu erf/tanh, gelu erf/tanh), forward and backward, on fresh random inputs (never zeros), with
// every output buffer poisoned with NaN (0xFF bytes) before the run; every element is compared with
// the one tolerance table per dtype, NaN never passes, inputs must come back unchanged, and bytes
// outside each output view (row padding, base offset, a guard after the last row) must stay
// untouched. Shapes are chosen per code path (I = the output width): 1, odd and prime widths (no
// 16-byte vectors, partial last vector), the common MLP widths, decode rows (1, 7), many rows, no
// rows; each runs contiguous, row-padded, odd-row-stride, unaligned (base + 1 element) and mixed
// (first input aligned, the rest unaligned) layouts. Tests skip without a GPU, and fail instead
// when KF_REQUIRE_GPU=1. ActGpuAllPlans runs every candidate plan of the planner (vector widths,
// vectors per thread) on each shape through launch_with_plan. ActGpuBiasGrad: gelu_backward_bias_grad
// (its own shapes, below).
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "activation/activation_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::GeluApprox;

struct Shape {
  int64_t rows, n;  // n = I, the width of y
};
const Shape kShapes[] = {{1, 1},     {1, 7},    {7, 1},     {7, 127},  {3, 4096}, {19, 4097},
                         {2, 11008}, {1, 8192}, {257, 520}, {0, 4096}, {5, 0},    {1, 65537}};

// Layout of the k-th tensor of a call (k = 0: the first input).
Layout layout_of(LayoutKind l, int k) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};  // rows stay 16-byte aligned when the width allows
    case LayoutKind::kOddStride:
      return {3, 0};  // every row starts at a different alignment
    case LayoutKind::kUnaligned:
      return {0, 1};  // base pointer one element past alignment
    case LayoutKind::kMixed:
      return {0, k == 0 ? 0 : 1};
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

// One op variant: which inputs it takes and how to call the kernel and the reference.
enum class Op { kSiluAndMul, kSwiglu, kGeluAndMul, kGeglu, kGelu };
struct Variant {
  Op op;
  GeluApprox approx;
  bool gate_first;
  std::string name() const {
    static const char* names[] = {"silu_and_mul", "swiglu", "gelu_and_mul", "geglu", "gelu"};
    std::string s = names[static_cast<int>(op)];
    if (op != Op::kSiluAndMul && op != Op::kSwiglu) s += approx == GeluApprox::kTanh ? " tanh" : " erf";
    if (op == Op::kGeluAndMul) s += gate_first ? " gate first" : " gate second";
    return s;
  }
  bool split() const { return op == Op::kSiluAndMul || op == Op::kGeluAndMul; }
  int inputs() const { return op == Op::kSwiglu || op == Op::kGeglu ? 2 : 1; }
};
std::vector<Variant> variants() {
  std::vector<Variant> v = {{Op::kSiluAndMul, GeluApprox::kNone, true}, {Op::kSwiglu, GeluApprox::kNone, true}};
  for (GeluApprox a : {GeluApprox::kNone, GeluApprox::kTanh}) {
    v.push_back({Op::kGeluAndMul, a, true});
    v.push_back({Op::kGeluAndMul, a, false});
    v.push_back({Op::kGeglu, a, true});
    v.push_back({Op::kGelu, a, true});
  }
  return v;
}

// Forward of a variant on views (in: 1 or 2 inputs); `stream` null = the reference.
Status forward(const Variant& v, const std::vector<TensorView>& in, const TensorView& y, bool cuda,
               cudaStream_t stream) {
  switch (v.op) {
    case Op::kSiluAndMul:
      return cuda ? kf::silu_and_mul(in[0], y, stream) : ref::silu_and_mul(in[0], y);
    case Op::kSwiglu:
      return cuda ? kf::swiglu(in[0], in[1], y, stream) : ref::swiglu(in[0], in[1], y);
    case Op::kGeluAndMul:
      return cuda ? kf::gelu_and_mul(in[0], v.approx, v.gate_first, y, stream)
                  : ref::gelu_and_mul(in[0], v.approx, v.gate_first, y);
    case Op::kGeglu:
      return cuda ? kf::geglu(in[0], in[1], v.approx, y, stream) : ref::geglu(in[0], in[1], v.approx, y);
    case Op::kGelu:
      return cuda ? kf::gelu(in[0], v.approx, y, stream) : ref::gelu(in[0], v.approx, y);
  }
  return Status::Invalid("test: unknown op");
}

// Backward: grads[k] is the gradient of in[k].
Status backward(const Variant& v, const TensorView& dy, const std::vector<TensorView>& in,
                const std::vector<TensorView>& grads, bool cuda, cudaStream_t stream) {
  switch (v.op) {
    case Op::kSiluAndMul:
      return cuda ? kf::silu_and_mul_backward(dy, in[0], grads[0], stream)
                  : ref::silu_and_mul_backward(dy, in[0], grads[0]);
    case Op::kSwiglu:
      return cuda ? kf::swiglu_backward(dy, in[0], in[1], grads[0], grads[1], stream)
                  : ref::swiglu_backward(dy, in[0], in[1], grads[0], grads[1]);
    case Op::kGeluAndMul:
      return cuda ? kf::gelu_and_mul_backward(dy, in[0], v.approx, v.gate_first, grads[0], stream)
                  : ref::gelu_and_mul_backward(dy, in[0], v.approx, v.gate_first, grads[0]);
    case Op::kGeglu:
      return cuda ? kf::geglu_backward(dy, in[0], in[1], v.approx, grads[0], grads[1], stream)
                  : ref::geglu_backward(dy, in[0], in[1], v.approx, grads[0], grads[1]);
    case Op::kGelu:
      return cuda ? kf::gelu_backward(dy, in[0], v.approx, grads[0], stream)
                  : ref::gelu_backward(dy, in[0], v.approx, grads[0]);
  }
  return Status::Invalid("test: unknown op");
}

class ActGpu : public ::testing::TestWithParam<Case> {
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
  // Random inputs of a variant: x [M, 2N] for the split ops, else 1 or 2 tensors [M, N]. Values in
  // [-6, 6) for the activation input (both tails of sigmoid and GELU), [-3, 3) for multipliers.
  std::vector<HostTensor> inputs(const Variant& v, Rng& rng) const {
    std::vector<HostTensor> in;
    if (v.split()) {
      in.push_back(random_tensor(dtype(), {M(), 2 * N()}, rng, -6.0, 6.0));
    } else {
      for (int k = 0; k < v.inputs(); ++k) in.push_back(random_tensor(dtype(), {M(), N()}, rng, -6.0, 6.0));
    }
    return in;
  }
};

TEST_P(ActGpu, Forward) {
  const DType t = dtype();
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name());
    Rng rng(seed(v.name() + " fwd"));
    std::vector<HostTensor> in = inputs(v, rng);
    std::vector<TensorView> hv;
    for (const HostTensor& h : in) hv.push_back(h.view());
    HostTensor want(t, {M(), N()});
    KF_ASSERT_OK(forward(v, hv, want.view(), false, nullptr));

    std::vector<DeviceTensor> din;
    std::vector<TensorView> dv;
    for (size_t k = 0; k < in.size(); ++k) din.push_back(to_device(in[k], layout_of(layout(), int(k))));
    for (const DeviceTensor& d : din) dv.push_back(d.view());
    DeviceTensor y(t, {M(), N()}, layout_of(layout(), 2));
    ASSERT_TRUE(finish(forward(v, dv, y.view(), true, stream_)));
    EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
    EXPECT_TRUE(y.check_untouched("y"));
    for (size_t k = 0; k < in.size(); ++k) EXPECT_TRUE(bit_equal("inputs are not written", din[k].download(), in[k]));
  }
}

TEST_P(ActGpu, Backward) {
  const DType t = dtype();
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name());
    Rng rng(seed(v.name() + " bwd"));
    std::vector<HostTensor> in = inputs(v, rng);
    HostTensor dy = random_tensor(t, {M(), N()}, rng);
    std::vector<TensorView> hv, hg;
    std::vector<HostTensor> want;
    for (const HostTensor& h : in) {
      hv.push_back(h.view());
      want.emplace_back(t, h.shape);
    }
    for (const HostTensor& w : want) hg.push_back(w.view());
    KF_ASSERT_OK(backward(v, dy.view(), hv, hg, false, nullptr));

    std::vector<DeviceTensor> din, dgrad;
    std::vector<TensorView> dv, dg;
    for (size_t k = 0; k < in.size(); ++k) {
      din.push_back(to_device(in[k], layout_of(layout(), int(k))));
      dgrad.emplace_back(t, in[k].shape, layout_of(layout(), int(k) + 2));
    }
    for (const DeviceTensor& d : din) dv.push_back(d.view());
    for (const DeviceTensor& d : dgrad) dg.push_back(d.view());
    DeviceTensor d_dy = to_device(dy, layout_of(layout(), 1));
    ASSERT_TRUE(finish(backward(v, d_dy.view(), dv, dg, true, stream_)));
    for (size_t k = 0; k < in.size(); ++k) {
      const std::string name = "gradient of input " + std::to_string(k);
      EXPECT_TRUE(all_close(name.c_str(), dgrad[k].download(), want[k], tolerance(t)));
      EXPECT_TRUE(dgrad[k].check_untouched(name.c_str()));
      EXPECT_TRUE(bit_equal("inputs are not written", din[k].download(), in[k]));
    }
    EXPECT_TRUE(bit_equal("dy is not written", d_dy.download(), dy));
  }
}

// Two runs of the same call give identical bits (no races between a row's vectors).
TEST_P(ActGpu, Deterministic) {
  if (layout() != LayoutKind::kContiguous) GTEST_SKIP() << "once per shape";
  const DType t = dtype();
  const Variant v = {Op::kGeluAndMul, GeluApprox::kTanh, false};
  Rng rng(seed("det"));
  std::vector<HostTensor> in = inputs(v, rng);
  DeviceTensor x = to_device(in[0], {});
  DeviceTensor y1(t, {M(), N()}), y2(t, {M(), N()});
  ASSERT_TRUE(finish(forward(v, {x.view()}, y1.view(), true, stream_)));
  ASSERT_TRUE(finish(forward(v, {x.view()}, y2.view(), true, stream_)));
  EXPECT_TRUE(bit_equal("y", y1.download(), y2.download()));
}

INSTANTIATE_TEST_SUITE_P(All, ActGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned,
                                                              LayoutKind::kMixed)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

// ---- every candidate plan --------------------------------------------------------------------
// The internal call of a variant (as the public entries build it), for launch_with_plan.
kf::ActCall internal_call(const Variant& v, bool bwd, const std::vector<TensorView>& in, const TensorView* y,
                          const TensorView* dy, const std::vector<TensorView>& grads) {
  kf::ActCall c;
  c.backward = bwd;
  c.approx = v.approx;
  c.gate_first = v.gate_first;
  c.y = y;
  c.dy = dy;
  switch (v.op) {
    case Op::kSiluAndMul:
    case Op::kGeluAndMul:
    case Op::kGelu:
      c.name = v.op == Op::kSiluAndMul ? "silu_and_mul" : v.op == Op::kGelu ? "gelu" : "gelu_and_mul";
      c.op = v.op == Op::kSiluAndMul ? kf::ActOp::kSiluAndMul
             : v.op == Op::kGelu     ? kf::ActOp::kGelu
                                     : kf::ActOp::kGeluAndMul;
      c.x = &in[0];
      if (bwd) c.dx = &grads[0];
      break;
    case Op::kSwiglu:
      c.name = "swiglu";
      c.op = kf::ActOp::kSwiglu;
      c.gate = &in[0], c.up = &in[1];
      if (bwd) c.dgate = &grads[0], c.dup = &grads[1];
      break;
    case Op::kGeglu:
      c.name = "geglu";
      c.op = kf::ActOp::kGeglu;
      c.up = &in[0], c.gate = &in[1];
      if (bwd) c.dup = &grads[0], c.dgate = &grads[1];
      break;
  }
  return c;
}

class ActGpuAllPlans : public ActGpu {};

TEST_P(ActGpuAllPlans, EveryCandidate) {
  const DType t = dtype();
  const Variant kVariants[] = {{Op::kSwiglu, GeluApprox::kNone, true},
                               {Op::kGeluAndMul, GeluApprox::kTanh, false},
                               {Op::kGelu, GeluApprox::kNone, true}};
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name());
    Rng rng(seed(v.name() + " plans"));
    std::vector<HostTensor> in = inputs(v, rng);
    HostTensor dy = random_tensor(t, {M(), N()}, rng);
    std::vector<TensorView> hv, hg;
    std::vector<HostTensor> want_g;
    for (const HostTensor& h : in) {
      hv.push_back(h.view());
      want_g.emplace_back(t, h.shape);
    }
    for (const HostTensor& w : want_g) hg.push_back(w.view());
    HostTensor want_y(t, {M(), N()});
    KF_ASSERT_OK(forward(v, hv, want_y.view(), false, nullptr));
    KF_ASSERT_OK(backward(v, dy.view(), hv, hg, false, nullptr));

    std::vector<DeviceTensor> din, dgrad;
    std::vector<TensorView> dv, dg;
    for (size_t k = 0; k < in.size(); ++k) {
      din.push_back(to_device(in[k], layout_of(layout(), int(k))));
      dgrad.emplace_back(t, in[k].shape, layout_of(layout(), int(k) + 2));
    }
    for (const DeviceTensor& d : din) dv.push_back(d.view());
    for (const DeviceTensor& d : dgrad) dg.push_back(d.view());
    DeviceTensor y(t, {M(), N()}, layout_of(layout(), 2)), d_dy = to_device(dy, layout_of(layout(), 1));
    const TensorView yv = y.view(), dyv = d_dy.view();

    for (bool bwd : {false, true}) {
      const kf::ActCall call = internal_call(v, bwd, dv, &yv, &dyv, dg);
      std::vector<kf::ActPlan> plans;
      KF_ASSERT_OK(kf::act_candidate_plans(call, &plans));
      EXPECT_EQ(plans.empty(), M() == 0 || N() == 0);
      for (const kf::ActPlan& plan : plans) {
        SCOPED_TRACE(kf::to_string(plan));
        y.poison();
        for (DeviceTensor& d : dgrad) d.poison();
        ASSERT_TRUE(finish(kf::launch_with_plan(plan, call, stream_)));
        if (!bwd) {
          EXPECT_TRUE(all_close("y", y.download(), want_y, tolerance(t)));
          EXPECT_TRUE(y.check_untouched("y"));
          continue;
        }
        for (size_t k = 0; k < in.size(); ++k) {
          const std::string name = "gradient of input " + std::to_string(k);
          EXPECT_TRUE(all_close(name.c_str(), dgrad[k].download(), want_g[k], tolerance(t)));
          EXPECT_TRUE(dgrad[k].check_untouched(name.c_str()));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, ActGpuAllPlans,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kOddStride,
                                                              LayoutKind::kMixed)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

// ---- special values --------------------------------------------------------------------------
// NaN and +-inf inputs give the reference's NaN/inf pattern (F.silu(-inf) = nan, gradients at
// +-inf are nan); huge finite inputs keep the limits (gelu_tanh'(1e30) = 1, not 0 * inf).
class ActGpuSpecial : public ActGpu {};

TEST_P(ActGpuSpecial, NonFiniteAndHuge) {
  const DType t = dtype();
  const double inf = INFINITY;
  const double huge = t == DType::kFloat16 ? 60000.0 : 1e30;  // fp16: the largest finite magnitude region
  const std::vector<double> vals = {NAN, inf, -inf, huge, -huge, 0.0, -0.0, 100.0, -100.0, 20.0, -20.0, 1.0};
  const int64_t n = static_cast<int64_t>(vals.size());
  for (const Variant& v : variants()) {
    if (v.split() || v.inputs() == 2) {
      if (v.op != Op::kSwiglu && v.op != Op::kGeglu) continue;  // the split ops share these kernels
    }
    SCOPED_TRACE(v.name());
    Rng rng(seed(v.name() + " special"));
    HostTensor a(t, {1, n}), b = random_tensor(t, {1, n}, rng, 0.5, 2.0), dy = random_tensor(t, {1, n}, rng, 0.5, 2.0);
    for (int64_t i = 0; i < n; ++i) a.set(i, vals[i]);
    // swiglu(gate = a, up = b); geglu(hidden = b, gate = a); gelu(a)
    std::vector<HostTensor> in;
    if (v.op == Op::kSwiglu) {
      in.push_back(a);
      in.push_back(b);
    } else if (v.op == Op::kGeglu) {
      in.push_back(b);
      in.push_back(a);
    } else {
      in.push_back(a);
    }
    std::vector<TensorView> hv;
    for (const HostTensor& h : in) hv.push_back(h.view());
    HostTensor want(t, {1, n});
    KF_ASSERT_OK(forward(v, hv, want.view(), false, nullptr));
    std::vector<HostTensor> want_g;
    std::vector<TensorView> hg;
    for (const HostTensor& h : in) want_g.emplace_back(t, h.shape);
    for (const HostTensor& w : want_g) hg.push_back(w.view());
    KF_ASSERT_OK(backward(v, dy.view(), hv, hg, false, nullptr));

    std::vector<DeviceTensor> din, dgrad;
    std::vector<TensorView> dv, dg;
    for (const HostTensor& h : in) {
      din.push_back(to_device(h, {}));
      dgrad.emplace_back(t, h.shape);
    }
    for (const DeviceTensor& d : din) dv.push_back(d.view());
    for (const DeviceTensor& d : dgrad) dg.push_back(d.view());
    DeviceTensor y(t, {1, n}), d_dy = to_device(dy, {});
    ASSERT_TRUE(finish(forward(v, dv, y.view(), true, stream_)));
    ASSERT_TRUE(finish(backward(v, d_dy.view(), dv, dg, true, stream_)));
    std::vector<std::pair<HostTensor, HostTensor>> pairs = {{y.download(), want}};
    for (size_t k = 0; k < in.size(); ++k) pairs.emplace_back(dgrad[k].download(), want_g[k]);
    for (size_t p = 0; p < pairs.size(); ++p) {
      const HostTensor &got = pairs[p].first, &w = pairs[p].second;
      for (int64_t i = 0; i < n; ++i) {
        const double g = got.get(i), e = w.get(i);
        SCOPED_TRACE("output " + std::to_string(p) + " (0 = y), input value " + std::to_string(vals[i]));
        if (std::isnan(e)) {
          EXPECT_TRUE(std::isnan(g)) << "got " << g;
        } else if (std::isinf(e)) {
          EXPECT_EQ(g, e);
        } else {
          const Tol tol = tolerance(t);
          EXPECT_TRUE(std::isfinite(g) && std::fabs(g - e) <= tol.atol + tol.rtol * std::fabs(e))
              << "got " << g << " want " << e;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, ActGpuSpecial,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(Shape{1, 12}),
                                            ::testing::Values(LayoutKind::kContiguous)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           return std::string(t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16");
                         });

// ---- gelu_backward_bias_grad ----------------------------------------------------------------------
// dx against the reference and bit for bit against gelu_backward's dx on the same device; dbias (in
// the input dtype and in float32, contiguous or at stride 3) against the float64 column sums; every
// output and the workspace poisoned before the call; every candidate plan gives the same bits.
// Shapes: M in {1, 7, 1000, 2049 (65 chunks, the last partial)} x N in {1, 7, 4099 (a partial last
// vector)}, and no rows (dbias = 0) / no columns.
const Shape kBiasShapes[] = {{1, 1},    {1, 7},    {1, 4099},    {7, 1},       {7, 7}, {7, 4099},
                             {1000, 1}, {1000, 7}, {1000, 4099}, {2049, 1024}, {0, 7}, {5, 0}};

class ActGpuBiasGrad : public ActGpu {
 protected:
  // dbias [N] in `t`: contiguous, or every third element of an [N, 1] buffer with rows 3 apart.
  static DeviceTensor make_dbias(DType t, int64_t n, bool strided) {
    return strided ? DeviceTensor(t, {n, 1}, Layout{2, 0}) : DeviceTensor(t, {n});
  }
  static TensorView dbias_view(const DeviceTensor& d, int64_t n) {
    TensorView v = d.view();
    v.ndim = 1;
    v.shape[0] = n;
    v.strides[0] = d.shape().size() == 2 ? 3 : 1;
    return v;
  }
  static HostTensor dbias_host(const DeviceTensor& d, int64_t n) {
    HostTensor h = d.download();
    h.shape = {n};
    return h;
  }
};

TEST_P(ActGpuBiasGrad, MatchesReference) {
  const DType t = dtype();
  const int64_t m = M(), n = N();
  const bool strided = layout() == LayoutKind::kRowPadded || layout() == LayoutKind::kOddStride;
  for (GeluApprox approx : {GeluApprox::kTanh, GeluApprox::kNone}) {
    SCOPED_TRACE(approx == GeluApprox::kTanh ? "tanh" : "erf");
    Rng rng(seed(approx == GeluApprox::kTanh ? "bias tanh" : "bias erf"));
    const HostTensor x = random_tensor(t, {m, n}, rng, -6.0, 6.0), dy = random_tensor(t, {m, n}, rng);
    DeviceTensor d_x = to_device(x, layout_of(layout(), 0)), d_dy = to_device(dy, layout_of(layout(), 1));
    DeviceTensor dx(t, {m, n}, layout_of(layout(), 2)), dx_plain(t, {m, n}, layout_of(layout(), 2));
    ASSERT_TRUE(finish(kf::gelu_backward(d_dy.view(), d_x.view(), approx, dx_plain.view(), stream_)));
    const size_t ws_bytes = kf::gelu_backward_bias_grad_workspace_size(m, n);
    DeviceTensor ws(DType::kFloat32, {int64_t(ws_bytes / 4) + 1});  // poisoned: NaN partials
    for (DType bt : {t, DType::kFloat32}) {
      SCOPED_TRACE(std::string("dbias ") + kf::dtype_name(bt));
      HostTensor want_dx(t, {m, n}), want_db(bt, {n});
      KF_ASSERT_OK(ref::gelu_backward_bias_grad(dy.view(), x.view(), approx, want_dx.view(), want_db.view()));
      DeviceTensor db = make_dbias(bt, n, strided);
      dx.poison();
      ws.poison();
      ASSERT_TRUE(finish(kf::gelu_backward_bias_grad(d_dy.view(), d_x.view(), approx, dx.view(), dbias_view(db, n),
                                                     ws.view().data, ws_bytes, stream_)));
      EXPECT_TRUE(all_close("dx", dx.download(), want_dx, tolerance(t)));
      EXPECT_TRUE(bit_equal("dx is gelu_backward's", dx.download(), dx_plain.download()));
      EXPECT_TRUE(all_close("dbias", dbias_host(db, n), want_db, reduction_tolerance(bt, m)));
      EXPECT_TRUE(dx.check_untouched("dx"));
      EXPECT_TRUE(db.check_untouched("dbias"));
      EXPECT_TRUE(bit_equal("x is not written", d_x.download(), x));
      EXPECT_TRUE(bit_equal("dy is not written", d_dy.download(), dy));

      // every candidate plan: the same bits
      kf::ActCall call;
      call.name = "gelu_backward_bias_grad";
      call.op = kf::ActOp::kGelu;
      call.backward = true;
      call.approx = approx;
      const TensorView xv = d_x.view(), dyv = d_dy.view(), dxv = dx.view(), dbv = dbias_view(db, n);
      call.x = &xv, call.dy = &dyv, call.dx = &dxv, call.dbias = &dbv;
      call.workspace = ws.view().data, call.workspace_bytes = ws_bytes;
      std::vector<kf::ActPlan> plans;
      KF_ASSERT_OK(kf::act_candidate_plans(call, &plans));
      EXPECT_EQ(plans.empty(), n == 0);
      const HostTensor first_dx = dx.download(), first_db = dbias_host(db, n);
      for (const kf::ActPlan& plan : plans) {
        SCOPED_TRACE(kf::to_string(plan));
        dx.poison();
        db.poison();
        ws.poison();
        ASSERT_TRUE(finish(kf::launch_with_plan(plan, call, stream_)));
        EXPECT_TRUE(bit_equal("dx", dx.download(), first_dx));
        EXPECT_TRUE(bit_equal("dbias", dbias_host(db, n), first_db));
        EXPECT_TRUE(db.check_untouched("dbias"));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, ActGpuBiasGrad,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kBiasShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned,
                                                              LayoutKind::kMixed)),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const DType t = std::get<0>(info.param);
                           const Shape s = std::get<1>(info.param);
                           const char* tag = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
                           return std::string(tag) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(info.param));
                         });

// Rows of more than 2^16 row groups: the grid loops over rows (gridDim.y is capped at 65535).
TEST(ActGpuManyRows, RowLoop) {
  KF_NEED_GPU();
  const DType t = DType::kFloat16;
  const int64_t m = 600000, n = 3;  // ty = 8 rows per block -> 75000 row groups > 65535
  Rng rng(99);
  HostTensor g = random_tensor(t, {m, n}, rng, -6, 6), u = random_tensor(t, {m, n}, rng), want(t, {m, n});
  KF_ASSERT_OK(ref::swiglu(g.view(), u.view(), want.view()));
  DeviceTensor dg = to_device(g, {}), du = to_device(u, {}), y(t, {m, n});
  KF_ASSERT_OK(kf::swiglu(dg.view(), du.view(), y.view(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
}

}  // namespace
