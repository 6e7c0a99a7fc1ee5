// Argument validation of the activation family: a bad call returns a failed Status whose message
// names the function, the argument and what was expected (e.g. "silu_and_mul: x last dimension must
// be even (2*I), got 4097"), and nothing is launched.
//
// Validation runs before any device query or launch, so these tests need no GPU: the views point at
// a dummy address that is never dereferenced (every call here fails validation).
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::GeluApprox;
using kernelforge::StatusCode;

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;

TEST(ActValidation, SiluAndMulOddLastDim) {
  TensorView x = cuda_view(BF16, {2, 4097}), y = cuda_view(BF16, {2, 2048});
  const Status st = kf::silu_and_mul(x, y, nullptr);
  EXPECT_EQ(st.message(), "silu_and_mul: x last dimension must be even (2*I), got 4097");
  HostTensor hx(BF16, {2, 4097}), hy(BF16, {2, 2048});
  KF_EXPECT_INVALID(ref::silu_and_mul(hx.view(), hy.view()), "silu_and_mul: x last dimension must be even");
  KF_EXPECT_INVALID(kf::gelu_and_mul(x, GeluApprox::kTanh, true, y, nullptr),
                    "gelu_and_mul: x last dimension must be even (2*I), got 4097");
  KF_EXPECT_INVALID(kf::silu_and_mul_backward(y, x, x, nullptr), "silu_and_mul_backward", "even", "4097");
}

TEST(ActValidation, HalvedOutputShape) {
  TensorView x = cuda_view(F16, {2, 128}), y = cuda_view(F16, {2, 128});
  KF_EXPECT_INVALID(kf::silu_and_mul(x, y, nullptr), "silu_and_mul: y must have shape [2, 64]", "halved",
                    "got [2, 128]");
  TensorView y3 = cuda_view(F16, {1, 2, 64});
  KF_EXPECT_INVALID(kf::gelu_and_mul(x, GeluApprox::kNone, false, y3, nullptr), "y", "[2, 64]", "[1, 2, 64]");
}

TEST(ActValidation, SecondInputShape) {
  TensorView g = cuda_view(F32, {4, 64}), u = cuda_view(F32, {4, 63}), y = cuda_view(F32, {4, 64});
  KF_EXPECT_INVALID(kf::swiglu(g, u, y, nullptr),
                    "swiglu: up must have shape [4, 64] (the shape of gate), got [4, 63]");
  KF_EXPECT_INVALID(kf::geglu(g, u, GeluApprox::kNone, y, nullptr), "geglu: gate must have shape [4, 64]",
                    "the shape of hidden", "[4, 63]");
}

TEST(ActValidation, MismatchedDtypes) {
  TensorView g = cuda_view(BF16, {4, 64}), u = cuda_view(F32, {4, 64}), y = cuda_view(BF16, {4, 64});
  KF_EXPECT_INVALID(kf::swiglu(g, u, y, nullptr),
                    "swiglu: up must have the same dtype as gate (bfloat16), got float32");
  TensorView yf = cuda_view(F32, {4, 64});
  KF_EXPECT_INVALID(kf::gelu(g, GeluApprox::kNone, yf, nullptr), "gelu: y must have the same dtype as x");
  TensorView h = cuda_view(F16, {4, 64});
  KF_EXPECT_INVALID(kf::geglu(h, g, GeluApprox::kNone, y, nullptr), "geglu: gate", "same dtype as hidden (float16)");
}

TEST(ActValidation, MismatchedDevices) {
  TensorView g = cuda_view(F32, {4, 64}), u = cuda_view(F32, {4, 64}, 1), y = cuda_view(F32, {4, 64});
  KF_EXPECT_INVALID(kf::swiglu(g, u, y, nullptr), "swiglu: up must be on the same device as gate (cuda:0), got cuda:1");
  HostTensor hu(F32, {4, 64});
  KF_EXPECT_INVALID(kf::swiglu(g, hu.view(), y, nullptr), "up", "same device", "cpu");
  HostTensor hx(F32, {4, 64});
  KF_EXPECT_INVALID(kf::gelu(hx.view(), GeluApprox::kNone, y, nullptr), "gelu: x must be a CUDA tensor, got cpu");
  KF_EXPECT_INVALID(ref::gelu(g, GeluApprox::kNone, y), "gelu: x must be a CPU tensor for the reference");
}

TEST(ActValidation, IntegerAndUnknownDtypes) {
  TensorView x = cuda_view(DType::kInt32, {4, 64}), y = cuda_view(DType::kInt32, {4, 32});
  KF_EXPECT_INVALID(kf::silu_and_mul(x, y, nullptr),
                    "silu_and_mul: x must be a float32/float16/bfloat16 tensor, got int32");
  TensorView o = cuda_view(DType::kOther, {4, 64});
  KF_EXPECT_INVALID(kf::gelu(o, GeluApprox::kNone, o, nullptr), "gelu: x must be", "unsupported dtype");
  TensorView d = cuda_view(DType::kFloat64, {4, 64});  // float64 has no kernel: use the reference
  KF_EXPECT_INVALID(kf::gelu(d, GeluApprox::kNone, d, nullptr), "gelu: x", "float64");
}

TEST(ActValidation, NonContiguousLastDim) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 32});
  x.strides[1] = 2;
  x.strides[0] = 128;
  KF_EXPECT_INVALID(kf::silu_and_mul(x, y, nullptr),
                    "silu_and_mul: x must be contiguous in its last dimension (stride 1), got stride 2");
  TensorView g = cuda_view(F32, {4, 64}), u = cuda_view(F32, {4, 64}), yy = cuda_view(F32, {4, 64});
  u.strides[1] = 4;
  u.strides[0] = 256;
  KF_EXPECT_INVALID(kf::swiglu(g, u, yy, nullptr), "swiglu: up must be contiguous in its last dimension");
  yy.strides[1] = 3;
  yy.strides[0] = 192;
  KF_EXPECT_INVALID(kf::gelu(g, GeluApprox::kTanh, yy, nullptr), "gelu: y must be contiguous in its last dimension");
}

TEST(ActValidation, LeadingDimsMustCollapse) {
  TensorView x = cuda_view(F32, {2, 3, 64}), y = cuda_view(F32, {2, 3, 64});
  x.strides[0] = 1000;  // 3 rows of stride 64, then a jump
  KF_EXPECT_INVALID(kf::gelu(x, GeluApprox::kNone, y, nullptr), "gelu: x must have leading dimensions that collapse");
}

TEST(ActValidation, OverlappingOutputRows) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 32});
  y.strides[0] = 16;
  KF_EXPECT_INVALID(kf::silu_and_mul(x, y, nullptr),
                    "silu_and_mul: y rows overlap: row stride 16 is smaller than the row length 32");
  TensorView dy = cuda_view(F32, {4, 32}), dx = cuda_view(F32, {4, 64});
  dx.strides[0] = 40;  // the two halves of a dx row need 64 elements
  KF_EXPECT_INVALID(kf::silu_and_mul_backward(dy, x, dx, nullptr), "dx rows overlap");
}

TEST(ActValidation, BadApproximate) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 64});
  KF_EXPECT_INVALID(kf::gelu(x, static_cast<GeluApprox>(7), y, nullptr),
                    "gelu: approximate must be GeluApprox::kNone or GeluApprox::kTanh, got 7");
  HostTensor hx(F32, {4, 64}), hy(F32, {4, 64});
  KF_EXPECT_INVALID(ref::geglu(hx.view(), hx.view(), static_cast<GeluApprox>(-1), hy.view()), "geglu: approximate");
}

TEST(ActValidation, BackwardShapes) {
  TensorView x = cuda_view(F16, {4, 64}), dy = cuda_view(F16, {4, 64}), dx = cuda_view(F16, {4, 64});
  TensorView bad = cuda_view(F16, {4, 65});
  KF_EXPECT_INVALID(kf::silu_and_mul_backward(dy, x, dx, nullptr), "silu_and_mul_backward: dy must have shape [4, 32]");
  TensorView dy32 = cuda_view(F16, {4, 32});
  KF_EXPECT_INVALID(kf::gelu_and_mul_backward(dy32, x, GeluApprox::kNone, true, bad, nullptr),
                    "gelu_and_mul_backward: dx must have shape [4, 64] (the shape of x), got [4, 65]");
  KF_EXPECT_INVALID(kf::swiglu_backward(dy, x, x, dx, bad, nullptr), "swiglu_backward: dup must have shape [4, 64]",
                    "the shape of up");
  KF_EXPECT_INVALID(kf::geglu_backward(dy, x, x, GeluApprox::kNone, bad, dx, nullptr),
                    "geglu_backward: dhidden must have shape [4, 64] (the shape of hidden)");
  KF_EXPECT_INVALID(kf::gelu_backward(bad, x, GeluApprox::kTanh, dx, nullptr),
                    "gelu_backward: dy must have shape [4, 64]");
}

TEST(ActValidation, NullData) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 32});
  x.data = nullptr;
  KF_EXPECT_INVALID(kf::silu_and_mul(x, y, nullptr), "silu_and_mul: x has a null data pointer");
  TensorView g = cuda_view(F32, {4, 64}), u = cuda_view(F32, {4, 64});
  u.data = nullptr;
  KF_EXPECT_INVALID(kf::swiglu(g, u, g, nullptr), "swiglu: up has a null data pointer");
}

TEST(ActValidation, RankAndSize) {
  TensorView s = cuda_view(F32, {});
  KF_EXPECT_INVALID(kf::gelu(s, GeluApprox::kNone, s, nullptr), "gelu: x must have between 1 and 8 dimensions, got 0");
  TensorView big = cuda_view(F16, {1, (int64_t(1) << 31) + 2}), y = cuda_view(F16, {1, (int64_t(1) << 30) + 1});
  KF_EXPECT_INVALID(kf::silu_and_mul(big, y, nullptr),
                    "silu_and_mul: the last dimension of x must be at most 2^31 - 1");
}

// gelu_backward_bias_grad: dbias [N] (own dtype, x's device, any nonzero stride) and the workspace.
TEST(ActValidation, BiasGrad) {
  TensorView x = cuda_view(BF16, {8, 64}), dy = cuda_view(BF16, {8, 64}), dx = cuda_view(BF16, {8, 64});
  TensorView db = cuda_view(F32, {64});
  char ws_store[512];
  void* ws = ws_store;
  const size_t need = kf::gelu_backward_bias_grad_workspace_size(8, 64);
  EXPECT_EQ(need, 256u);  // one chunk of 64 float32 sums
  auto call = [&](const TensorView& b, void* w, size_t bytes) {
    return kf::gelu_backward_bias_grad(dy, x, GeluApprox::kTanh, dx, b, w, bytes, nullptr);
  };
  KF_EXPECT_INVALID(call(cuda_view(F32, {63}), ws, need),
                    "gelu_backward_bias_grad: dbias must have shape [64] (the last dimension of x), got [63]");
  KF_EXPECT_INVALID(call(cuda_view(F32, {1, 64}), ws, need), "dbias must have shape [64]", "got [1, 64]");
  KF_EXPECT_INVALID(call(cuda_view(DType::kInt32, {64}), ws, need),
                    "gelu_backward_bias_grad: dbias must be a float32/float16/bfloat16 tensor, got int32");
  KF_EXPECT_INVALID(call(cuda_view(DType::kFloat64, {64}), ws, need), "dbias must be", "got float64");
  TensorView db0 = db;
  db0.strides[0] = 0;
  KF_EXPECT_INVALID(call(db0, ws, need), "gelu_backward_bias_grad: dbias must not have stride 0");
  HostTensor hb(F32, {64});
  KF_EXPECT_INVALID(call(hb.view(), ws, need), "dbias must be on the same device as x (cuda:0), got cpu");
  KF_EXPECT_INVALID(call(db, ws, need - 1),
                    "gelu_backward_bias_grad: workspace must hold at least 256 bytes "
                    "(gelu_backward_bias_grad_workspace_size(8, 64)), got 255");
  KF_EXPECT_INVALID(call(db, nullptr, need), "workspace must hold at least 256 bytes", "got a null pointer");
  KF_EXPECT_INVALID(call(db, ws_store + 1, need), "workspace must be 4-byte aligned");
  TensorView bad = cuda_view(BF16, {8, 65});
  KF_EXPECT_INVALID(kf::gelu_backward_bias_grad(dy, x, GeluApprox::kTanh, bad, db, ws, need, nullptr),
                    "gelu_backward_bias_grad: dx must have shape [8, 64] (the shape of x), got [8, 65]");
  KF_EXPECT_INVALID(kf::gelu_backward_bias_grad(bad, x, GeluApprox::kTanh, dx, db, ws, need, nullptr),
                    "gelu_backward_bias_grad: dy must have shape [8, 64]");
  KF_EXPECT_INVALID(kf::gelu_backward_bias_grad(dy, x, static_cast<GeluApprox>(3), dx, db, ws, need, nullptr),
                    "gelu_backward_bias_grad: approximate must be");
  // the reference: CPU tensors, float64 dbias allowed, no workspace
  HostTensor hx(F32, {8, 64}), hdx(F32, {8, 64}), hb63(DType::kFloat64, {63});
  KF_EXPECT_INVALID(ref::gelu_backward_bias_grad(hx.view(), hx.view(), GeluApprox::kNone, hdx.view(), hb63.view()),
                    "gelu_backward_bias_grad: dbias must have shape [64]");
  KF_EXPECT_INVALID(ref::gelu_backward_bias_grad(hx.view(), hx.view(), GeluApprox::kNone, hdx.view(), db),
                    "dbias must be on the same device as x (cpu), got cuda:0");
}

}  // namespace
