// Argument validation of the softmax family: a bad call returns a failed Status whose message names
// the function, the argument and what was expected (e.g. "softmax: y must have shape [2, 64] (the
// shape of x), got [2, 63]"), and nothing is launched.
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

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;

TEST(SoftmaxValidation, ShapeMismatch) {
  TensorView x = cuda_view(F32, {2, 64}), y = cuda_view(F32, {2, 63}, 0, uintptr_t{2} << 40);
  const Status st = kf::softmax(x, y, nullptr);
  EXPECT_EQ(st.message(), "softmax: y must have shape [2, 64] (the shape of x), got [2, 63]");
  KF_EXPECT_INVALID(kf::log_softmax(x, y, nullptr), "log_softmax: y must have shape [2, 64]");
  TensorView g = cuda_view(F16, {4, 8}), yy = cuda_view(F16, {4, 9}), dx = cuda_view(F16, {4, 8});
  KF_EXPECT_INVALID(kf::softmax_backward(g, yy, dx, nullptr),
                    "softmax_backward: y must have shape [4, 8] (the shape of g), got [4, 9]");
  TensorView dx3 = cuda_view(F16, {1, 4, 8});
  KF_EXPECT_INVALID(kf::log_softmax_backward(g, cuda_view(F16, {4, 8}), dx3, nullptr), "log_softmax_backward: dx",
                    "[4, 8]", "[1, 4, 8]");
}

TEST(SoftmaxValidation, Dtypes) {
  TensorView x = cuda_view(DType::kInt32, {4, 64}), y = cuda_view(DType::kInt32, {4, 64});
  KF_EXPECT_INVALID(kf::softmax(x, y, nullptr), "softmax: x must be a float32/float16/bfloat16 tensor, got int32");
  TensorView l = cuda_view(DType::kInt64, {4, 64});
  KF_EXPECT_INVALID(kf::log_softmax_backward(l, l, l, nullptr), "log_softmax_backward: g must be", "int64");
  TensorView o = cuda_view(DType::kOther, {4, 64});
  KF_EXPECT_INVALID(kf::softmax(o, o, nullptr), "softmax: x must be", "unsupported dtype");
  TensorView d = cuda_view(DType::kFloat64, {4, 64});  // float64 has no kernel: use the reference
  KF_EXPECT_INVALID(kf::softmax(d, d, nullptr), "softmax: x", "float64");
  TensorView b = cuda_view(BF16, {4, 64}), f = cuda_view(F32, {4, 64});
  KF_EXPECT_INVALID(kf::softmax(b, f, nullptr), "softmax: y must have the same dtype as x (bfloat16), got float32");
  KF_EXPECT_INVALID(kf::softmax_backward(b, f, b, nullptr), "softmax_backward: y must have the same dtype as g");
  KF_EXPECT_INVALID(kf::softmax_backward(b, b, f, nullptr), "softmax_backward: dx must have the same dtype as g");
  HostTensor hi(DType::kInt32, {2, 3});
  KF_EXPECT_INVALID(ref::softmax(hi.view(), hi.view()), "softmax: x must be a floating-point tensor, got int32");
}

TEST(SoftmaxValidation, Devices) {
  TensorView x = cuda_view(F32, {4, 64}), y1 = cuda_view(F32, {4, 64}, 1);
  KF_EXPECT_INVALID(kf::softmax(x, y1, nullptr), "softmax: y must be on the same device as x (cuda:0), got cuda:1");
  HostTensor hx(F32, {4, 64});
  KF_EXPECT_INVALID(kf::softmax(hx.view(), x, nullptr), "softmax: x must be a CUDA tensor, got cpu");
  KF_EXPECT_INVALID(kf::softmax(x, hx.view(), nullptr), "softmax: y must be on the same device as x", "cpu");
  KF_EXPECT_INVALID(ref::log_softmax(x, x), "log_softmax: x must be a CPU tensor for the reference, got cuda:0");
  KF_EXPECT_INVALID(kf::softmax_backward(x, hx.view(), x, nullptr), "softmax_backward: y", "same device");
}

TEST(SoftmaxValidation, LastDimStrideAndLayout) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 64});
  x.strides[1] = 2;
  x.strides[0] = 128;
  KF_EXPECT_INVALID(kf::softmax(x, y, nullptr),
                    "softmax: x must be contiguous in its last dimension (stride 1), got stride 2");
  TensorView g = cuda_view(F32, {4, 64}), yy = cuda_view(F32, {4, 64}), dx = cuda_view(F32, {4, 64});
  yy.strides[1] = 4;
  yy.strides[0] = 256;
  KF_EXPECT_INVALID(kf::softmax_backward(g, yy, dx, nullptr),
                    "softmax_backward: y must be contiguous in its last dimension");
  TensorView x3 = cuda_view(F32, {2, 3, 64}), y3 = cuda_view(F32, {2, 3, 64});
  x3.strides[0] = 1000;  // 3 rows of stride 64, then a jump
  KF_EXPECT_INVALID(kf::log_softmax(x3, y3, nullptr), "log_softmax: x must have leading dimensions that collapse");
}

TEST(SoftmaxValidation, OverlappingOutputRows) {
  TensorView x = cuda_view(F32, {4, 64}), y = cuda_view(F32, {4, 64});
  y.strides[0] = 16;
  KF_EXPECT_INVALID(kf::softmax(x, y, nullptr),
                    "softmax: y rows overlap: row stride 16 is smaller than the row length 64");
  TensorView dx = cuda_view(F32, {4, 64});
  dx.strides[0] = 0;
  KF_EXPECT_INVALID(kf::softmax_backward(x, x, dx, nullptr), "softmax_backward: dx rows overlap");
}

TEST(SoftmaxValidation, RankAndSizes) {
  TensorView s = cuda_view(F32, {}), y = cuda_view(F32, {4});
  KF_EXPECT_INVALID(kf::softmax(s, y, nullptr), "softmax: x must have between 1 and 8 dimensions, got 0");
  TensorView neg = cuda_view(F32, {4, 8});
  neg.shape[0] = -1;
  KF_EXPECT_INVALID(kf::softmax(neg, neg, nullptr), "softmax: x has a negative size");
  TensorView big = cuda_view(F16, {1, int64_t(1) << 31}), bigy = cuda_view(F16, {1, int64_t(1) << 31});
  KF_EXPECT_INVALID(kf::softmax(big, bigy, nullptr), "softmax: the last dimension of x must be at most 2^31 - 1");
  TensorView x = cuda_view(F32, {4, 8});
  x.data = nullptr;
  KF_EXPECT_INVALID(kf::softmax(x, cuda_view(F32, {4, 8}), nullptr), "softmax: x has a null data pointer");
  KF_EXPECT_INVALID(kf::softmax(cuda_view(F32, {4, 8}), x, nullptr), "softmax: y has a null data pointer");
}

}  // namespace
