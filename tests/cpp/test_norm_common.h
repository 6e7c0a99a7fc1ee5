// Shared pieces of the norm GPU tests (test_norm.cpp, test_norm_ada.cpp, test_norm_plans.cpp): the
// layouts every case runs in, the CUB-style workspace helper and the GPU fixture.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace kftest_norm {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::NormKind;

constexpr float kRmsEps = 1e-6f;
constexpr float kLayerEps = 1e-5f;

// layout of [..., N] row tensors (x, y, dy, dx, residual, sum)
inline Layout row_layout(LayoutKind l) {
  switch (l) {
    case LayoutKind::kMixed:  // (not a layout of this family's tests)
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};  // rows stay 16-byte aligned when N allows
    case LayoutKind::kOddStride:
      return {3, 0};  // every row starts at a different alignment
    case LayoutKind::kUnaligned:
      return {0, 1};  // base pointer one element past alignment
  }
  return {};
}
// layout of contiguous parameter tensors (weight, bias, scale, shift and their gradients)
inline Layout param_layout(LayoutKind l) { return {0, l == LayoutKind::kUnaligned ? 1 : 0}; }

inline const char* dtype_tag(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "other";
  }
}

inline DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// Runs a backward call the CUB way: query the workspace size, then run with a workspace of that
// size, itself poisoned so that a kernel relying on zeroed scratch fails.
template <class F>
Status with_workspace(F call) {
  size_t bytes = 0;
  Status st = call(nullptr, &bytes);
  if (!st.ok()) return st;
  void* ws = nullptr;
  if (cudaMalloc(&ws, bytes > 0 ? bytes : 16) != cudaSuccess) return Status::Cuda("test: workspace allocation failed");
  cudaMemset(ws, 0xFF, bytes > 0 ? bytes : 16);
  // cudaMemset runs on the legacy default stream and may return before it is done; the tests' streams
  // are non-blocking and do not wait for it (a late fill overwrote the backward's partial rows with
  // NaN when ctest ran several GPU tests at once: dweight / dshift all NaN). Wait here.
  cudaDeviceSynchronize();
  st = call(ws, &bytes);
  cudaDeviceSynchronize();
  cudaFree(ws);
  return st;
}

class GpuFixture {
 protected:
  cudaStream_t stream_ = nullptr;
  // returns false (and skips/fails) when the case cannot run here
  void gpu_setup(DType t) {
    KF_NEED_GPU();
    if (t == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void gpu_teardown() {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  // After a launch: wait on the test's stream and surface asynchronous kernel errors.
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
};

// ---- instantiation ---------------------------------------------------------------------------
inline const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
inline const LayoutKind kLayouts[] = {LayoutKind::kContiguous, LayoutKind::kRowPadded, LayoutKind::kOddStride,
                                      LayoutKind::kUnaligned};

// Every dtype x shape x layout, except that shapes of over a million elements (whose point is the
// many-row reduction, not the addressing) run contiguous and unaligned only: the host-side float64
// reference dominates the run time.
template <class Case, class Shape, size_t NS>
std::vector<Case> cases(const Shape (&shapes)[NS], int64_t (*elements)(const Shape&)) {
  std::vector<Case> out;
  for (DType t : kDtypes)
    for (const Shape& s : shapes)
      for (LayoutKind l : kLayouts)
        if (elements(s) <= (int64_t{1} << 20) || l == LayoutKind::kContiguous || l == LayoutKind::kUnaligned)
          out.emplace_back(t, s, l);
  return out;
}

}  // namespace kftest_norm
