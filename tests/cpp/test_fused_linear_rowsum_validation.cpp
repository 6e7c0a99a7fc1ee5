// Argument validation of fused_linear_rowsum: a bad call returns a failed Status whose message names
// the function, the argument and what was expected, and nothing is launched. Validation runs before
// any device query or launch, so these tests need no GPU: the views point at dummy addresses that are
// never dereferenced (every CUDA call here fails validation or the workspace check).
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

constexpr DType F32 = DType::kFloat32;
constexpr DType BF16 = DType::kBFloat16;

struct Call {
  TensorView x = cuda_view(BF16, {4, 64}, 0, uintptr_t{1} << 40);
  TensorView w = cuda_view(BF16, {8, 64}, 0, uintptr_t{2} << 40);
  TensorView b = cuda_view(BF16, {8}, 0, uintptr_t{3} << 40);
  TensorView y = cuda_view(BF16, {4}, 0, uintptr_t{4} << 40);
  TensorView ws = cuda_view(F32, {64}, 0, uintptr_t{5} << 40);
  Status fwd(void* work = reinterpret_cast<void*>(uintptr_t{6} << 40), size_t bytes = 1 << 20) const {
    return kf::fused_linear_rowsum(x, w, &b, y, ws, work, bytes, nullptr);
  }
};

TEST(FlrsValidation, WeightShape) {
  Call c;
  c.w = cuda_view(BF16, {8, 63});
  EXPECT_EQ(c.fwd().message(),
            "fused_linear_rowsum: weight must have shape [O, 64] (in_features = the last dimension of x), got [8, 63]");
  c.w = cuda_view(BF16, {8, 64, 1});
  KF_EXPECT_INVALID(c.fwd(), "weight must have shape [O, 64]", "got [8, 64, 1]");
}

TEST(FlrsValidation, BiasShape) {
  Call c;
  c.b = cuda_view(BF16, {7});
  EXPECT_EQ(c.fwd().message(),
            "fused_linear_rowsum: bias must have shape [8] (out_features = weight.shape[0]), got [7]");
}

TEST(FlrsValidation, OutputShapes) {
  Call c;
  c.y = cuda_view(BF16, {4, 1});
  EXPECT_EQ(c.fwd().message(),
            "fused_linear_rowsum: y must have shape [4] (the shape of x without its last dimension), got [4, 1]");
  Call d;
  d.ws = cuda_view(F32, {63});
  KF_EXPECT_INVALID(d.fwd(), "w_sum must have shape [64] (the last dimension of x), got [63]");
  d.ws = cuda_view(BF16, {64});
  KF_EXPECT_INVALID(d.fwd(), "fused_linear_rowsum: w_sum must be a float32 tensor, got bfloat16");
}

TEST(FlrsValidation, DtypesAndDevices) {
  Call c;
  c.w = cuda_view(F32, {8, 64});
  KF_EXPECT_INVALID(c.fwd(), "weight must have the same dtype as x (bfloat16), got float32");
  Call d;
  d.b = cuda_view(BF16, {8}, 1);
  KF_EXPECT_INVALID(d.fwd(), "bias must be on the same device as x (cuda:0), got cuda:1");
  Call e;
  e.x = cuda_view(DType::kInt64, {4, 64});
  KF_EXPECT_INVALID(e.fwd(), "x must be a float32/float16/bfloat16 tensor, got int64");
  HostTensor hx(BF16, {4, 64});
  Call f;
  f.x = hx.view();
  KF_EXPECT_INVALID(f.fwd(), "x must be a CUDA tensor, got cpu", "kernelforge::ref::");
}

TEST(FlrsValidation, Strides) {
  Call c;
  c.x.strides[1] = 2;
  KF_EXPECT_INVALID(c.fwd(), "x must be contiguous in its last dimension (stride 1), got stride 2");
  Call d;
  d.y.strides[0] = 0;
  KF_EXPECT_INVALID(d.fwd(), "y elements overlap: stride 0");
  Call e;
  e.ws.strides[0] = 2;
  KF_EXPECT_INVALID(e.fwd(), "w_sum must be contiguous (stride 1), got stride 2");
}

TEST(FlrsValidation, Workspace) {
  Call c;
  const size_t need = kf::fused_linear_rowsum_workspace_size(4, 64, 8);
  KF_EXPECT_INVALID(c.fwd(nullptr, need), ("workspace must hold at least " + std::to_string(need) + " bytes").c_str(),
                    "got a null pointer");
  KF_EXPECT_INVALID(c.fwd(reinterpret_cast<void*>(uintptr_t{6} << 40), need - 4), "fused_linear_rowsum_workspace_size",
                    std::to_string(need - 4).c_str());
  KF_EXPECT_INVALID(c.fwd(reinterpret_cast<void*>((uintptr_t{6} << 40) + 4), need),
                    "workspace must be 16-byte aligned");
}

TEST(FlrsValidation, Backward) {
  TensorView x = cuda_view(BF16, {2, 3, 64}), dy = cuda_view(BF16, {2, 3}, 0, uintptr_t{2} << 40);
  TensorView ws = cuda_view(F32, {64}, 0, uintptr_t{3} << 40), dx = cuda_view(BF16, {2, 3, 64}, 0, uintptr_t{4} << 40);
  TensorView dw = cuda_view(BF16, {8, 64}, 0, uintptr_t{5} << 40), db = cuda_view(BF16, {7}, 0, uintptr_t{6} << 40);
  void* work = reinterpret_cast<void*>(uintptr_t{7} << 40);
  EXPECT_EQ(kf::fused_linear_rowsum_backward(dy, x, ws, &dx, &dw, &db, work, 1 << 20, nullptr).message(),
            "fused_linear_rowsum_backward: dbias must have shape [8] (out_features = dweight.shape[0]), got [7]");
  TensorView dy2 = cuda_view(BF16, {6});
  KF_EXPECT_INVALID(kf::fused_linear_rowsum_backward(dy2, x, ws, &dx, nullptr, nullptr, work, 1 << 20, nullptr),
                    "dy must have shape [2, 3] (the shape of x without its last dimension), got [6]");
  TensorView dx2 = cuda_view(BF16, {6, 64});
  KF_EXPECT_INVALID(kf::fused_linear_rowsum_backward(dy, x, ws, &dx2, nullptr, nullptr, work, 1 << 20, nullptr),
                    "dx must have shape [2, 3, 64] (the shape of x), got [6, 64]");
  TensorView dwo = cuda_view(BF16, {8, 64}, 0, uintptr_t{5} << 40);
  dwo.strides[0] = 32;
  KF_EXPECT_INVALID(kf::fused_linear_rowsum_backward(dy, x, ws, nullptr, &dwo, nullptr, work, 1 << 20, nullptr),
                    "dweight rows overlap: row stride 32 is smaller than the row length 64");
}

TEST(FlrsValidation, Reference) {
  HostTensor x(BF16, {4, 64}), w(BF16, {8, 65}), y(BF16, {4}), ws(F32, {64});
  KF_EXPECT_INVALID(ref::fused_linear_rowsum(x.view(), w.view(), nullptr, y.view(), ws.view()),
                    "fused_linear_rowsum: weight must have shape [O, 64]");
  HostTensor w2(BF16, {8, 64}), ws16(BF16, {64});
  KF_EXPECT_INVALID(ref::fused_linear_rowsum(x.view(), w2.view(), nullptr, y.view(), ws16.view()),
                    "w_sum must be a float32 or float64 tensor, got bfloat16");
  const TensorView cx = cuda_view(BF16, {4, 64});
  KF_EXPECT_INVALID(ref::fused_linear_rowsum(cx, w2.view(), nullptr, y.view(), ws.view()),
                    "x must be a CPU tensor for the reference, got cuda:0");
}

}  // namespace
