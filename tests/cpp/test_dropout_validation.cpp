// Argument checks of the dropout family: every bad input gives InvalidArgument with a message that
// names the op, the argument and the expectation (no GPU needed: validation runs before the device
// check and never dereferences the views).
#include <cmath>
#include <cstdint>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kernelforge::PhiloxState;

TensorView state_view(DType t = DType::kInt64, std::vector<int64_t> shape = {2}) {
  return cuda_view(t, shape, 0, uintptr_t{9} << 40);
}

TEST(DropValidation, ProbabilityRange) {
  const TensorView x = cuda_view(DType::kBFloat16, {4, 64}), y = cuda_view(DType::kBFloat16, {4, 64}, 0, 2ull << 40);
  for (double p : {-0.1, 1.5, double(NAN)})
    KF_EXPECT_INVALID(kf::dropout(x, p, PhiloxState{}, y, nullptr, nullptr, nullptr), "dropout: p must lie in [0, 1]");
  const TensorView st = state_view();
  KF_EXPECT_INVALID(kf::dropout_backward(x, st, 2.0, y, nullptr), "dropout_backward: p must lie in [0, 1]");
}

TEST(DropValidation, DtypeDeviceShape) {
  const TensorView x = cuda_view(DType::kFloat16, {4, 64}), y = cuda_view(DType::kFloat16, {4, 64}, 0, 2ull << 40);
  KF_EXPECT_INVALID(kf::dropout(cuda_view(DType::kInt32, {4, 64}), 0.5, PhiloxState{}, y, nullptr, nullptr, nullptr),
                    "dropout: x must be a float32/float16/bfloat16 tensor, got int32");
  KF_EXPECT_INVALID(
      kf::dropout(x, 0.5, PhiloxState{}, cuda_view(DType::kFloat32, {4, 64}, 0, 2ull << 40), nullptr, nullptr, nullptr),
      "dropout: y must have the same dtype as x (float16), got float32");
  KF_EXPECT_INVALID(
      kf::dropout(x, 0.5, PhiloxState{}, cuda_view(DType::kFloat16, {4, 63}, 0, 2ull << 40), nullptr, nullptr, nullptr),
      "dropout: y must have the shape of x [4, 64], got [4, 63]");
  KF_EXPECT_INVALID(
      kf::dropout(x, 0.5, PhiloxState{}, cuda_view(DType::kFloat16, {4, 64}, 1, 2ull << 40), nullptr, nullptr, nullptr),
      "dropout: y must be on the same device as x (cuda:0), got cuda:1");
  KF_EXPECT_INVALID(
      kf::dropout_add(x, cuda_view(DType::kFloat16, {64}, 0, 3ull << 40), 0.5, PhiloxState{}, y, nullptr, nullptr),
      "dropout_add: residual must have the shape of x [4, 64], got [64]");
  TensorView cpu = x;
  cpu.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(kf::dropout(cpu, 0.5, PhiloxState{}, y, nullptr, nullptr, nullptr),
                    "dropout: x must be a CUDA tensor, got cpu");
  KF_EXPECT_INVALID(kf::ref::dropout(x, 0.5, PhiloxState{}, y, nullptr, nullptr),
                    "dropout: x must be a CPU tensor for the reference, got cuda:0");
}

TEST(DropValidation, Contiguity) {
  TensorView x = cuda_view(DType::kFloat32, {4, 64});
  const TensorView y = cuda_view(DType::kFloat32, {4, 64}, 0, 2ull << 40);
  x.strides[0] = 128;  // a row-strided view: the family takes contiguous tensors only
  KF_EXPECT_INVALID(kf::dropout(x, 0.5, PhiloxState{}, y, nullptr, nullptr, nullptr),
                    "dropout: x must be contiguous (shape [4, 64], strides [128, 1])");
  TensorView t = cuda_view(DType::kFloat32, {64, 4});
  t.shape[0] = 4, t.shape[1] = 64, t.strides[0] = 1, t.strides[1] = 4;  // a transpose
  KF_EXPECT_INVALID(kf::dropout_backward(t, state_view(), 0.5, y, nullptr), "dropout_backward: dy must be contiguous");
}

TEST(DropValidation, RngState) {
  const TensorView x = cuda_view(DType::kFloat32, {4, 64}), y = cuda_view(DType::kFloat32, {4, 64}, 0, 2ull << 40);
  TensorView st = state_view(DType::kInt32);
  KF_EXPECT_INVALID(kf::dropout(x, 0.5, PhiloxState{}, y, &st, nullptr, nullptr),
                    "dropout: rng_state must be an int64 tensor, got int32");
  st = state_view(DType::kInt64, {3});
  KF_EXPECT_INVALID(kf::dropout_backward(x, st, 0.5, y, nullptr),
                    "dropout_backward: rng_state must hold 2 elements (seed, offset), got shape [3]");
  st = state_view();
  st.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(kf::dropout_backward(x, st, 0.5, y, nullptr),
                    "dropout_backward: rng_state must be on the same device as dy (cuda:0), got cpu");
}

TEST(DropValidation, PhiloxState) {
  const TensorView x = cuda_view(DType::kFloat32, {4, 64}), y = cuda_view(DType::kFloat32, {4, 64}, 0, 2ull << 40);
  PhiloxState s;
  s.offset = 6;
  KF_EXPECT_INVALID(kf::dropout(x, 0.5, s, y, nullptr, nullptr, nullptr),
                    "dropout: PhiloxState offset must be a multiple of 4", "got 6");
  s = PhiloxState{};
  s.captured = true;
  KF_EXPECT_INVALID(kf::dropout(x, 0.5, s, y, nullptr, nullptr, nullptr),
                    "dropout: a captured PhiloxState needs seed_ptr and offset_ptr");
  const int64_t cell[2] = {0, 0};
  s.seed_ptr = &cell[0];
  s.offset_ptr = &cell[1];
  s.offset_intragraph = 2;
  KF_EXPECT_INVALID(kf::dropout(x, 0.5, s, y, nullptr, nullptr, nullptr),
                    "dropout: PhiloxState offset_intragraph must be a multiple of 4");
  s.offset_intragraph = 4;
  TensorView hx = x, hy = y;
  hx.device = hy.device = Device{DeviceType::kCPU, 0};
  KF_EXPECT_INVALID(kf::ref::dropout(hx, 0.5, s, hy, nullptr, nullptr),
                    "dropout: a captured PhiloxState (device pointers) cannot drive the CPU reference");
}

}  // namespace
