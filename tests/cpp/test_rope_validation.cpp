// Argument validation of the RoPE family: a bad call returns a failed Status whose message names
// the function, the argument and what was expected, and nothing is launched. Validation runs before
// any device query, so these need no GPU: the views point at a dummy address never dereferenced.
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::RopeLayout;
using kernelforge::RopeOptions;
using kernelforge::StatusCode;

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;

// A valid GQA call: q [2, 16, 8, 64], k [2, 16, 2, 64], cos/sin [16, 64], separate outputs.
struct Call {
  TensorView q = cuda_view(BF16, {2, 16, 8, 64}, 0, uintptr_t{1} << 40);
  TensorView k = cuda_view(BF16, {2, 16, 2, 64}, 0, uintptr_t{2} << 40);
  TensorView cos = cuda_view(F32, {16, 64}, 0, uintptr_t{3} << 40);
  TensorView sin = cuda_view(F32, {16, 64}, 0, uintptr_t{4} << 40);
  TensorView qo = cuda_view(BF16, {2, 16, 8, 64}, 0, uintptr_t{5} << 40);
  TensorView ko = cuda_view(BF16, {2, 16, 2, 64}, 0, uintptr_t{6} << 40);
  const TensorView* pos = nullptr;
  RopeOptions o;
  Status run() { return kf::apply_rope(q, &k, cos, sin, pos, o, qo, &ko, nullptr); }
  Status run_bwd() { return kf::apply_rope_backward(q, &k, cos, sin, pos, o, qo, &ko, nullptr); }
};

TEST(RopeValidation, RotaryDim) {
  Call c;
  c.cos = cuda_view(F32, {16, 63}), c.sin = cuda_view(F32, {16, 63});
  KF_EXPECT_INVALID(c.run(),
                    "apply_rope: rotary_dim (the last dimension of cos and sin) must be even and at least 2, got 63");
  c.cos = cuda_view(F32, {16, 66}), c.sin = cuda_view(F32, {16, 66});
  KF_EXPECT_INVALID(c.run(),
                    "apply_rope: rotary_dim (the last dimension of cos and sin) must not exceed head_dim 64, got 66");
  Call d;
  d.o.rotary_dim = 32;
  KF_EXPECT_INVALID(d.run(), "rotary_dim (32) must equal the last dimension of cos and sin [16, 64]");
  KF_EXPECT_INVALID(d.run_bwd(), "apply_rope_backward: rotary_dim (32)");
}

TEST(RopeValidation, CosSinShapes) {
  Call c;
  c.cos = cuda_view(F32, {15, 64}), c.sin = cuda_view(F32, {15, 64});
  KF_EXPECT_INVALID(c.run(),
                    "cos and sin must have shape [S, rotary_dim] = [16, 64] or [B, S, rotary_dim] = [2, 16, 64]",
                    "got [15, 64]");
  c.cos = cuda_view(F32, {3, 16, 64}), c.sin = cuda_view(F32, {3, 16, 64});
  KF_EXPECT_INVALID(c.run(), "got [3, 16, 64]");
  c.cos = cuda_view(F32, {2, 16, 64}), c.sin = cuda_view(F32, {16, 64});
  KF_EXPECT_INVALID(c.run(), "sin must have the shape of cos [2, 16, 64], got [16, 64]");
  c.cos = cuda_view(F32, {1, 1, 16, 64}), c.sin = c.cos;
  KF_EXPECT_INVALID(c.run(), "cos must have 2 or 3 dimensions, got 4");
  Call d;
  d.cos.strides[1] = 2;
  KF_EXPECT_INVALID(d.run(), "cos must be contiguous in its last dimension (stride 1), got stride 2");
}

TEST(RopeValidation, Dtypes) {
  Call c;
  c.cos = cuda_view(F16, {16, 64}), c.sin = cuda_view(F16, {16, 64});
  KF_EXPECT_INVALID(c.run(), "apply_rope: cos must have the dtype of q (bfloat16) or float32, got float16");
  Call d;
  d.sin = cuda_view(BF16, {16, 64});
  KF_EXPECT_INVALID(d.run(), "sin must have the dtype of cos (float32), got bfloat16");
  Call e;
  e.k = cuda_view(F16, {2, 16, 2, 64});
  KF_EXPECT_INVALID(e.run(), "k must have the same dtype as q (bfloat16), got float16");
  Call f;
  f.qo = cuda_view(F32, {2, 16, 8, 64});
  KF_EXPECT_INVALID(f.run(), "q_out must have the dtype of q (bfloat16), got float32");
  Call g;
  g.q = cuda_view(DType::kFloat64, {2, 16, 8, 64});
  KF_EXPECT_INVALID(g.run(), "q must be a float32/float16/bfloat16 tensor, got float64");
  KF_EXPECT_INVALID(g.run_bwd(), "apply_rope_backward: dq_out must be a float32/float16/bfloat16 tensor, got float64");
}

TEST(RopeValidation, Shapes) {
  Call c;
  c.q = cuda_view(BF16, {2, 16, 512});
  KF_EXPECT_INVALID(c.run(), "q must have 4 dimensions [B, S, H, D] (layout bshd), got 3 dimensions [2, 16, 512]");
  Call d;
  d.k = cuda_view(BF16, {2, 15, 2, 64});
  KF_EXPECT_INVALID(d.run(), "k must have the batch, sequence and head_dim of q [2, 16, 8, 64]", "got [2, 15, 2, 64]");
  Call e;
  e.o.layout = RopeLayout::kBHSD;  // q [2, 16, 8, 64] is then B=2, H=16, S=8
  KF_EXPECT_INVALID(kf::apply_rope(e.q, nullptr, e.cos, e.sin, nullptr, e.o, e.qo, nullptr, nullptr),
                    "cos and sin must have shape [S, rotary_dim] = [8, 64]");
  Call f;
  f.ko = cuda_view(BF16, {2, 16, 8, 64});
  KF_EXPECT_INVALID(f.run(), "k_out must have the shape of k [2, 16, 2, 64], got [2, 16, 8, 64]");
  Call g;
  g.q.strides[3] = 2;
  KF_EXPECT_INVALID(g.run(), "q must be contiguous in its last dimension (stride 1), got stride 2");
  Call h;
  KF_EXPECT_INVALID(kf::apply_rope(h.q, &h.k, h.cos, h.sin, nullptr, h.o, h.qo, nullptr, nullptr),
                    "k and k_out must both be given or both be null");
}

TEST(RopeValidation, Devices) {
  Call c;
  c.k = cuda_view(BF16, {2, 16, 2, 64}, 1, uintptr_t{2} << 40);
  KF_EXPECT_INVALID(c.run(), "k must be on the same device as q (cuda:0), got cuda:1");
  Call d;
  d.cos.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(d.run(), "cos must be on the same device as q (cuda:0), got cpu");
  Call e;
  e.q.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(e.run(), "q must be a CUDA tensor, got cpu (use kernelforge::ref:: for CPU)");
}

TEST(RopeValidation, PositionIds) {
  Call c;
  TensorView pos = cuda_view(DType::kInt32, {2, 16}, 0, uintptr_t{7} << 40);
  c.pos = &pos;
  c.cos = cuda_view(F32, {4096, 64}), c.sin = cuda_view(F32, {4096, 64});
  KF_EXPECT_INVALID(c.run(), "position_ids must be an int64 tensor, got int32");
  pos = cuda_view(DType::kInt64, {2, 15}, 0, uintptr_t{7} << 40);
  KF_EXPECT_INVALID(c.run(), "position_ids must have shape [B, S] = [2, 16] (or [1, S]), got [2, 15]");
  pos = cuda_view(DType::kInt64, {2, 16}, 0, uintptr_t{7} << 40);
  c.cos = cuda_view(F32, {2, 16, 64}), c.sin = cuda_view(F32, {2, 16, 64});
  KF_EXPECT_INVALID(c.run(),
                    "with position_ids, cos and sin must be a cache of shape [max_pos, rotary_dim], got [2, 16, 64]");
}

TEST(RopeValidation, Aliasing) {
  Call c;
  c.qo = c.q;
  c.qo.data = static_cast<char*>(c.q.data) + 2;  // overlaps q, not q itself
  KF_EXPECT_INVALID(c.run(), "q_out overlaps q without being q itself");
  Call d;
  d.qo.strides[2] = 0;  // heads share memory
  KF_EXPECT_INVALID(d.run(), "q_out has overlapping elements");
  Call e;
  e.qo = e.q;
  e.qo.strides[0] = 16 * 8 * 64 + 64;  // same pointer, other strides: overlaps without being q
  KF_EXPECT_INVALID(e.run(), "q_out overlaps q");
}

// A valid in-place call passes validation (the CPU reference runs it).
TEST(RopeValidation, ValidCallsOnCpu) {
  HostTensor q(F32, {1, 2, 3, 4}), k(F32, {1, 2, 1, 4}), cos(F32, {2, 4}), sin(F32, {2, 4});
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, 0.5);
  for (int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.5);
  for (int64_t i = 0; i < cos.numel(); ++i) cos.set(i, 1.0), sin.set(i, 0.0);
  TensorView kv = k.view();
  KF_ASSERT_OK(ref::apply_rope(q.view(), &kv, cos.view(), sin.view(), nullptr, {}, q.view(), &kv));
  EXPECT_EQ(q.get(5), 0.5);
}

}  // namespace
