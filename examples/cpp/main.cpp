// kernelforge from C++: RMSNorm over a [rows, hidden] float32 tensor on the GPU, checked against
// the float64 CPU reference. Without a GPU it runs only the reference and says so (it fails
// instead when KF_REQUIRE_GPU=1).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernelforge/kernelforge.h"

namespace kf = kernelforge;

#define CHECK_CUDA(expr)                                                      \
  do {                                                                        \
    cudaError_t e_ = (expr);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

#define CHECK_KF(expr)                                                      \
  do {                                                                      \
    kf::Status s_ = (expr);                                                 \
    if (!s_.ok()) {                                                         \
      std::fprintf(stderr, "%s failed: %s\n", #expr, s_.message().c_str()); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main() {
  const int64_t rows = 64, hidden = 4096;
  const float eps = 1e-6f;
  std::printf("kernelforge %d.%d.%d: rms_norm on [%lld, %lld] float32\n", KERNELFORGE_VERSION_MAJOR,
              KERNELFORGE_VERSION_MINOR, KERNELFORGE_VERSION_PATCH, static_cast<long long>(rows),
              static_cast<long long>(hidden));

  std::mt19937 gen(0);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(rows * hidden), w(hidden), y_ref(rows * hidden), y(rows * hidden);
  for (float& v : x) v = dist(gen);
  for (float& v : w) v = 1.0f + 0.25f * dist(gen);

  // The float64 reference: CPU views of the host buffers.
  const kf::Device cpu{kf::DeviceType::kCPU, 0};
  kf::TensorView hx = kf::make_view(x.data(), kf::DType::kFloat32, {rows, hidden}, cpu);
  kf::TensorView hw = kf::make_view(w.data(), kf::DType::kFloat32, {hidden}, cpu);
  kf::TensorView hy = kf::make_view(y_ref.data(), kf::DType::kFloat32, {rows, hidden}, cpu);
  CHECK_KF(kf::ref::rms_norm(hx, &hw, eps, hy));

  int capability = 0;
  const kf::Status gpu = kf::device_capability(0, &capability);
  if (!gpu.ok()) {
    std::printf("no GPU found (%s): ran the CPU reference only, y[0] = %.6f\n", gpu.message().c_str(), y_ref[0]);
    const char* req = std::getenv("KF_REQUIRE_GPU");
    if (req && std::strcmp(req, "1") == 0) {
      std::fprintf(stderr, "KF_REQUIRE_GPU=1 but no GPU was found\n");
      return 1;
    }
    return 0;
  }

  // The CUDA kernel: device buffers, views tagged with the CUDA device, one stream.
  void *dx = nullptr, *dw = nullptr, *dy = nullptr;
  const size_t bytes = x.size() * sizeof(float);
  CHECK_CUDA(cudaMalloc(&dx, bytes));
  CHECK_CUDA(cudaMalloc(&dw, w.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dy, bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(cudaMemcpyAsync(dx, x.data(), bytes, cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaMemcpyAsync(dw, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice, stream));

  kf::TensorView vx = kf::make_view(dx, kf::DType::kFloat32, {rows, hidden});  // CUDA device 0
  kf::TensorView vw = kf::make_view(dw, kf::DType::kFloat32, {hidden});
  kf::TensorView vy = kf::make_view(dy, kf::DType::kFloat32, {rows, hidden});
  CHECK_KF(kf::rms_norm(vx, &vw, eps, vy, stream));
  CHECK_CUDA(cudaMemcpyAsync(y.data(), dy, bytes, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));

  double max_err = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(static_cast<double>(y[i]) - y_ref[i]);
    if (std::isnan(err)) {
      max_err = err;  // a NaN output is a failure
      break;
    }
    max_err = std::fmax(max_err, err);
  }
  std::printf("GPU sm_%d: max |y - reference| = %.3g\n", capability, max_err);
  cudaStreamDestroy(stream);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  if (!(max_err <= 1e-5)) {
    std::fprintf(stderr, "mismatch against the reference\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
