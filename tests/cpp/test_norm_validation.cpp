// Argument validation: a bad call returns a failed Status whose message names the function, the
// argument and what was expected (e.g. "rms_norm: weight must have shape [4096] to match the last
// dimension of x, got [4095]"), and nothing is launched.
//
// Validation runs before any launch, so these tests need no GPU: without one the views point at
// a dummy address that is never dereferenced. If the library queries the device before it
// checks an argument, a machine without a GPU answers with a CUDA error; such a case is skipped
// there (and runs on a GPU machine, where the views are real allocations).
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::NormKind;
using kernelforge::StatusCode;

// Owns the device allocations behind the views of one test (when a GPU is present).
class Views {
 public:
  // A CUDA view of a contiguous tensor of `shape` (strides may be edited afterwards).
  TensorView cuda(DType t, std::vector<int64_t> shape) {
    const DType alloc_t = kf::dtype_size(t) ? t : DType::kFloat32;
    TensorView v;
    if (gpu_count() > 0) {
      // room for edited strides: four times the contiguous size
      std::vector<int64_t> big = shape;
      if (!big.empty()) big.back() = big.back() * 4 + 8;
      owned_.push_back(std::make_unique<DeviceTensor>(alloc_t, big));
      v = owned_.back()->view();
    }
    TensorView c = kf::make_view(gpu_count() > 0 ? v.data : dummy(), t, {});
    c.ndim = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int d = c.ndim - 1; d >= 0; --d) {
      c.shape[d] = shape[d];
      c.strides[d] = stride;
      stride *= shape[d];
    }
    c.device = Device{DeviceType::kCUDA, 0};
    return c;
  }
  // A CPU view of real host memory (for the reference and for "CPU tensor passed to CUDA").
  TensorView cpu(DType t, std::vector<int64_t> shape) {
    hosts_.push_back(std::make_unique<HostTensor>(kf::dtype_size(t) ? t : DType::kFloat32, shape));
    TensorView v = hosts_.back()->view();
    v.dtype = t;
    return v;
  }

 private:
  static void* dummy() { return reinterpret_cast<void*>(uintptr_t{1} << 40); }
  std::vector<std::unique_ptr<DeviceTensor>> owned_;
  std::vector<std::unique_ptr<HostTensor>> hosts_;
};

// Checks that `st` is a validation failure mentioning every needle. Without a GPU, a CUDA error
// means the library asked the device first: the case is skipped there.
#define EXPECT_INVALID(status_expr, ...)                                                      \
  do {                                                                                        \
    const ::kernelforge::Status _st = (status_expr);                                          \
    if (::kftest::gpu_count() == 0 && _st.code() == ::kernelforge::StatusCode::kCudaError)    \
      GTEST_SKIP() << "validation queried the device first (no GPU here): " << _st.message(); \
    EXPECT_EQ(_st.code(), ::kernelforge::StatusCode::kInvalidArgument) << _st.message();      \
    EXPECT_TRUE(::kftest::has_substrings(_st, {__VA_ARGS__}));                                \
  } while (0)

constexpr DType F32 = DType::kFloat32;
constexpr DType F16 = DType::kFloat16;
constexpr float kEps = 1e-6f;

// ---- rms_norm ----------------------------------------------------------------------------------
TEST(NormValidation, RmsNormWeightShapeNamesBothShapes) {
  Views v;
  TensorView x = v.cuda(F16, {2, 4096}), w = v.cuda(F16, {4095}), y = v.cuda(F16, {2, 4096});
  EXPECT_INVALID(kf::rms_norm(x, &w, kEps, y, nullptr), "rms_norm", "weight", "[4096]", "[4095]");
}

TEST(NormValidation, RmsNormWrongDtype) {
  Views v;
  TensorView x = v.cuda(DType::kInt64, {2, 64}), y = v.cuda(DType::kInt64, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "rms_norm", "x", "int64");
}

TEST(NormValidation, RmsNormUnknownDtype) {
  Views v;
  TensorView x = v.cuda(DType::kOther, {2, 64}), y = v.cuda(DType::kOther, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "rms_norm", "x");
}

TEST(NormValidation, RmsNormFloat64OnCudaIsRefused) {
  Views v;
  TensorView x = v.cuda(DType::kFloat64, {2, 64}), y = v.cuda(DType::kFloat64, {2, 64});
  const Status st = kf::rms_norm(x, nullptr, kEps, y, nullptr);
  if (gpu_count() == 0 && st.code() == StatusCode::kCudaError) GTEST_SKIP() << st.message();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), StatusCode::kCudaError) << st.message();
  EXPECT_TRUE(has_substrings(st, {"x", "float64"}));
}

TEST(NormValidation, RmsNormMismatchedWeightDtype) {
  Views v;
  TensorView x = v.cuda(F16, {2, 64}), w = v.cuda(F32, {64}), y = v.cuda(F16, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x, &w, kEps, y, nullptr), "weight", "float32", "float16");
}

TEST(NormValidation, RmsNormMismatchedOutputDtype) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), y = v.cuda(F16, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "y", "float16");
}

TEST(NormValidation, RmsNormOutputShape) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), y = v.cuda(F32, {2, 65});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "y", "65");
}

TEST(NormValidation, RmsNormNonContiguousLastDim) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), y = v.cuda(F32, {2, 64});
  x.strides[1] = 2;
  x.strides[0] = 128;
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "x", "stride");
}

TEST(NormValidation, RmsNormNonContiguousOutput) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), y = v.cuda(F32, {2, 64});
  y.strides[1] = 2;
  y.strides[0] = 128;
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "y", "stride");
}

TEST(NormValidation, RmsNormWeightNotContiguous) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), w = v.cuda(F32, {64}), y = v.cuda(F32, {2, 64});
  w.strides[0] = 2;
  EXPECT_INVALID(kf::rms_norm(x, &w, kEps, y, nullptr), "weight");
}

TEST(NormValidation, RmsNormLeadingDimsMustCollapse) {
  Views v;
  // x [2, 3, 64] whose batches are not 3 rows apart: no single row stride describes it
  TensorView x = v.cuda(F32, {2, 3, 64}), y = v.cuda(F32, {2, 3, 64});
  x.strides[0] = 3 * 64 + 5;
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "x");
}

TEST(NormValidation, RmsNormCpuTensorToCudaFunction) {
  Views v;
  TensorView x = v.cpu(F32, {2, 64}), y = v.cuda(F32, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "x", "CUDA");
  // the other arguments must be on x's device
  TensorView x2 = v.cuda(F32, {2, 64}), w = v.cpu(F32, {64});
  EXPECT_INVALID(kf::rms_norm(x2, &w, kEps, y, nullptr), "weight", "device", "cpu");
  TensorView y2 = v.cpu(F32, {2, 64});
  EXPECT_INVALID(kf::rms_norm(x2, nullptr, kEps, y2, nullptr), "y", "device", "cpu");
}

TEST(NormValidation, RmsNormScalarInput) {
  Views v;
  TensorView x = v.cuda(F32, {}), y = v.cuda(F32, {});
  EXPECT_INVALID(kf::rms_norm(x, nullptr, kEps, y, nullptr), "x");
}

// ---- add_rms_norm ------------------------------------------------------------------------------
TEST(NormValidation, AddRmsNormResidualShape) {
  Views v;
  TensorView x = v.cuda(F16, {4, 128}), r = v.cuda(F16, {4, 127});
  TensorView y = v.cuda(F16, {4, 128}), s = v.cuda(F16, {4, 128});
  EXPECT_INVALID(kf::add_rms_norm(x, r, nullptr, kEps, y, s, nullptr), "add_rms_norm", "residual");
}

TEST(NormValidation, AddRmsNormResidualDtype) {
  Views v;
  TensorView x = v.cuda(F16, {4, 128}), r = v.cuda(F32, {4, 128});
  TensorView y = v.cuda(F16, {4, 128}), s = v.cuda(F16, {4, 128});
  EXPECT_INVALID(kf::add_rms_norm(x, r, nullptr, kEps, y, s, nullptr), "residual", "float32");
}

TEST(NormValidation, AddRmsNormSumDtype) {
  Views v;
  TensorView x = v.cuda(F16, {4, 128}), r = v.cuda(F16, {4, 128});
  TensorView y = v.cuda(F16, {4, 128}), s = v.cuda(F32, {4, 128});
  EXPECT_INVALID(kf::add_rms_norm(x, r, nullptr, kEps, y, s, nullptr), "sum", "float32");
}

TEST(NormValidation, AddRmsNormWeightShape) {
  Views v;
  TensorView x = v.cuda(F16, {4, 4096}), r = v.cuda(F16, {4, 4096}), w = v.cuda(F16, {4095});
  TensorView y = v.cuda(F16, {4, 4096}), s = v.cuda(F16, {4, 4096});
  EXPECT_INVALID(kf::add_rms_norm(x, r, &w, kEps, y, s, nullptr), "weight", "[4096]", "[4095]");
}

// ---- layer_norm --------------------------------------------------------------------------------
TEST(NormValidation, LayerNormBiasShape) {
  Views v;
  TensorView x = v.cuda(F32, {2, 4096}), w = v.cuda(F32, {4096}), b = v.cuda(F32, {4095});
  TensorView y = v.cuda(F32, {2, 4096});
  EXPECT_INVALID(kf::layer_norm(x, &w, &b, 1e-5f, y, nullptr), "layer_norm", "bias", "[4095]");
}

TEST(NormValidation, LayerNormBiasDtype) {
  Views v;
  TensorView x = v.cuda(F32, {2, 64}), b = v.cuda(F16, {64}), y = v.cuda(F32, {2, 64});
  EXPECT_INVALID(kf::layer_norm(x, nullptr, &b, 1e-5f, y, nullptr), "bias", "float16");
}

// ---- ada_norm ----------------------------------------------------------------------------------
TEST(NormValidation, AdaNormScaleShape) {
  Views v;
  TensorView x = v.cuda(F32, {2, 3, 64}), sc = v.cuda(F32, {2, 2, 64}), sh = v.cuda(F32, {2, 1, 64});
  TensorView y = v.cuda(F32, {2, 3, 64});
  EXPECT_INVALID(kf::ada_norm(x, sc, sh, nullptr, nullptr, 1e-6f, NormKind::kLayer, y, nullptr), "ada_norm", "scale");
}

TEST(NormValidation, AdaNormShiftLastDim) {
  Views v;
  TensorView x = v.cuda(F32, {2, 3, 64}), sc = v.cuda(F32, {64}), sh = v.cuda(F32, {63});
  TensorView y = v.cuda(F32, {2, 3, 64});
  EXPECT_INVALID(kf::ada_norm(x, sc, sh, nullptr, nullptr, 1e-6f, NormKind::kLayer, y, nullptr), "shift", "63");
}

TEST(NormValidation, AdaNormShiftDtype) {
  Views v;
  TensorView x = v.cuda(F16, {2, 3, 64}), sc = v.cuda(F16, {2, 1, 64}), sh = v.cuda(F32, {2, 1, 64});
  TensorView y = v.cuda(F16, {2, 3, 64});
  EXPECT_INVALID(kf::ada_norm(x, sc, sh, nullptr, nullptr, 1e-6f, NormKind::kRms, y, nullptr), "shift", "float32");
}

TEST(NormValidation, AdaNormKind) {
  Views v;
  TensorView x = v.cuda(F32, {2, 3, 64}), sc = v.cuda(F32, {64}), sh = v.cuda(F32, {64});
  TensorView y = v.cuda(F32, {2, 3, 64});
  EXPECT_INVALID(kf::ada_norm(x, sc, sh, nullptr, nullptr, 1e-6f, static_cast<NormKind>(7), y, nullptr), "kind");
}

// ---- backward ----------------------------------------------------------------------------------
TEST(NormValidation, RmsNormBackwardDweightShape) {
  Views v;
  TensorView dy = v.cuda(F32, {2, 4096}), x = v.cuda(F32, {2, 4096}), w = v.cuda(F32, {4096});
  TensorView dx = v.cuda(F32, {2, 4096}), dw = v.cuda(F32, {4095});
  size_t bytes = 0;
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, &w, kEps, dx, &dw, nullptr, &bytes, nullptr), "rms_norm_backward",
                 "dweight", "[4095]");
}

TEST(NormValidation, RmsNormBackwardDweightWithoutWeight) {
  Views v;
  TensorView dy = v.cuda(F32, {2, 64}), x = v.cuda(F32, {2, 64});
  TensorView dx = v.cuda(F32, {2, 64}), dw = v.cuda(F32, {64});
  size_t bytes = 0;
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, nullptr, kEps, dx, &dw, nullptr, &bytes, nullptr), "dweight");
}

TEST(NormValidation, RmsNormBackwardDyShape) {
  Views v;
  TensorView dy = v.cuda(F32, {3, 64}), x = v.cuda(F32, {2, 64}), dx = v.cuda(F32, {2, 64});
  size_t bytes = 0;
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, nullptr, kEps, dx, nullptr, nullptr, &bytes, nullptr), "dy");
}

TEST(NormValidation, RmsNormBackwardDxDtype) {
  Views v;
  TensorView dy = v.cuda(F32, {2, 64}), x = v.cuda(F32, {2, 64}), dx = v.cuda(F16, {2, 64});
  size_t bytes = 0;
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, nullptr, kEps, dx, nullptr, nullptr, &bytes, nullptr), "dx", "float16");
}

TEST(NormValidation, BackwardNeedsWorkspaceBytes) {
  Views v;
  TensorView dy = v.cuda(F32, {2, 64}), x = v.cuda(F32, {2, 64}), w = v.cuda(F32, {64});
  TensorView dx = v.cuda(F32, {2, 64}), dw = v.cuda(F32, {64});
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, &w, kEps, dx, &dw, nullptr, nullptr, nullptr), "workspace");
}

TEST(NormValidation, BackwardWorkspaceTooSmall) {
  Views v;
  TensorView dy = v.cuda(F32, {256, 1024}), x = v.cuda(F32, {256, 1024}), w = v.cuda(F32, {1024});
  TensorView dx = v.cuda(F32, {256, 1024}), dw = v.cuda(F32, {1024});
  size_t bytes = 0;
  const Status q = kf::rms_norm_backward(dy, x, &w, kEps, dx, &dw, nullptr, &bytes, nullptr);
  if (gpu_count() == 0 && q.code() == StatusCode::kCudaError) GTEST_SKIP() << q.message();
  ASSERT_TRUE(q.ok()) << q.message();
  if (bytes == 0) GTEST_SKIP() << "this shape needs no workspace";
  TensorView ws = v.cuda(DType::kFloat32, {static_cast<int64_t>(bytes / 4 + 1)});
  size_t small = bytes - 1;
  EXPECT_INVALID(kf::rms_norm_backward(dy, x, &w, kEps, dx, &dw, ws.data, &small, nullptr), "workspace");
}

TEST(NormValidation, LayerNormBackwardDbiasShape) {
  Views v;
  TensorView dy = v.cuda(F16, {2, 64}), x = v.cuda(F16, {2, 64}), b = v.cuda(F16, {64});
  TensorView dx = v.cuda(F16, {2, 64}), db = v.cuda(F16, {32});
  size_t bytes = 0;
  EXPECT_INVALID(kf::layer_norm_backward(dy, x, nullptr, &b, 1e-5f, dx, nullptr, &db, nullptr, &bytes, nullptr),
                 "dbias");
}

TEST(NormValidation, AddRmsNormBackwardDsumShape) {
  Views v;
  TensorView dy = v.cuda(F16, {2, 64}), dsum = v.cuda(F16, {2, 32}), s = v.cuda(F16, {2, 64});
  TensorView dx = v.cuda(F16, {2, 64});
  size_t bytes = 0;
  EXPECT_INVALID(kf::add_rms_norm_backward(dy, &dsum, s, nullptr, kEps, dx, nullptr, nullptr, &bytes, nullptr), "dsum");
}

TEST(NormValidation, AdaNormBackwardDscaleShape) {
  Views v;
  TensorView dy = v.cuda(F32, {2, 3, 64}), x = v.cuda(F32, {2, 3, 64});
  TensorView sc = v.cuda(F32, {2, 1, 64}), sh = v.cuda(F32, {2, 1, 64});
  TensorView dx = v.cuda(F32, {2, 3, 64}), dsc = v.cuda(F32, {64}), dsh = v.cuda(F32, {2, 1, 64});
  size_t bytes = 0;
  EXPECT_INVALID(kf::ada_norm_backward(dy, x, sc, sh, nullptr, nullptr, 1e-6f, NormKind::kLayer, dx, &dsc, &dsh,
                                       nullptr, nullptr, nullptr, &bytes, nullptr),
                 "dscale");
}

// ---- the reference validates too ----------------------------------------------------------------
TEST(NormValidation, ReferenceWeightShape) {
  Views v;
  TensorView x = v.cpu(F32, {2, 4096}), w = v.cpu(F32, {4095}), y = v.cpu(F32, {2, 4096});
  const Status st = ref::rms_norm(x, &w, kEps, y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_TRUE(has_substrings(st, {"weight", "[4096]", "[4095]"}));
}

TEST(NormValidation, ReferenceRejectsCudaTensors) {
  Views v;
  TensorView x = v.cpu(F32, {2, 64}), y = v.cpu(F32, {2, 64});
  x.device = Device{DeviceType::kCUDA, 0};  // host memory, but claims to be on the GPU
  const Status st = ref::rms_norm(x, nullptr, kEps, y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_TRUE(has_substrings(st, {"x", "CPU"}));
}

TEST(NormValidation, ReferenceWrongDtype) {
  Views v;
  TensorView x = v.cpu(DType::kInt32, {2, 64}), y = v.cpu(DType::kInt32, {2, 64});
  const Status st = ref::layer_norm(x, nullptr, nullptr, 1e-5f, y);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_TRUE(has_substrings(st, {"x", "int32"}));
}

}  // namespace
