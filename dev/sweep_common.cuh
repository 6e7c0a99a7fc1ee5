// What the lab programs (dev/sweep_<family>.cu and the probes) share: a CUDA error check, a comma-list
// parser and the timer. Timing: before each timed call a 256 MB write flushes L2 (50 MB on the H100), then CUDA
// events around the one call; the median of `reps` calls after `warmup` untimed ones.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace kfdev {

// "a,b,,c" -> {"a", "b", "c"}
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

struct Timer {
  static constexpr size_t kFlushBytes = size_t(256) << 20;
  void* flush = nullptr;
  cudaEvent_t a, b;
  Timer() {
    CHECK_CUDA(cudaMalloc(&flush, kFlushBytes));
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaFree(flush);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  // Median microseconds of `call` (a callable returning true on success) on the default stream;
  // negative when a call fails.
  template <typename F>
  double median_us(int reps, int warmup, F&& call) {
    std::vector<float> ms;
    for (int i = 0; i < warmup + reps; ++i) {
      CHECK_CUDA(cudaMemsetAsync(flush, i & 0xff, kFlushBytes, 0));
      CHECK_CUDA(cudaEventRecord(a, 0));
      const bool ok = call();
      CHECK_CUDA(cudaEventRecord(b, 0));
      if (!ok) {
        CHECK_CUDA(cudaDeviceSynchronize());
        return -1.0;
      }
      CHECK_CUDA(cudaEventSynchronize(b));
      float t = 0.f;
      CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
      if (i >= warmup) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
  }
};

// Device buffers of one shape, freed together; each filled with a byte pattern (16-bit values near 1,
// float32 values of moderate size: the timings do not depend on the values).
__global__ void fill_pattern(void* p, size_t bytes) {
  unsigned char* b = static_cast<unsigned char*>(p);
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    b[i] = (i & 1) ? 0x3c : static_cast<unsigned char>(i * 13);
}

struct DeviceBuffers {
  std::vector<void*> all;
  void* get(size_t bytes) {
    void* p = nullptr;
    CHECK_CUDA(cudaMalloc(&p, bytes > 0 ? bytes : 16));
    if (bytes > 0) fill_pattern<<<1024, 256>>>(p, bytes);
    CHECK_CUDA(cudaGetLastError());
    all.push_back(p);
    return p;
  }
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : all) cudaFree(p);
  }
};

// copy@size: median microseconds of a device-to-device copy moving `bytes` in all (bytes / 2 read,
// bytes / 2 written), under the same timer as the kernels.
inline double copy_us(Timer& timer, size_t bytes, int reps) {
  const size_t half = std::max<size_t>(bytes / 2, 16);
  DeviceBuffers buf;
  void* src = buf.get(half);
  void* dst = buf.get(half);
  return timer.median_us(reps, 1,
                         [&] { return cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, 0) == cudaSuccess; });
}

// The lines of the new-family sweeps: a header per (shape, direction), then one line per plan:
// microseconds, GB/s of the minimum traffic, % of copy@size, the plan, "*" on the planner's default.
inline void shape_line(const char* what, double bytes, double copy) {
  std::printf("%s: %.1f MB, copy %.1f us %.0f GB/s\n", what, bytes / 1e6, copy, bytes / copy / 1e3);
}
inline void plan_line(double us, double bytes, double copy, const std::string& plan, bool is_default) {
  if (us < 0) {
    std::printf("  failed            %s%s\n", plan.c_str(), is_default ? " *" : "");
    return;
  }
  std::printf("  %7.1f us %5.0f GB/s %5.1f%% %s%s\n", us, bytes / us / 1e3, 100.0 * copy / us, plan.c_str(),
              is_default ? " *" : "");
}

// Median microseconds of 30 calls of `f` after 3 warm-up calls, L2 flushed before each, on one timer
// shared by the program (the probes' shorthand for Timer::median_us).
template <typename F>
float median_us(F&& f) {
  static Timer timer;
  return float(timer.median_us(30, 3, [&] {
    f();
    return true;
  }));
}

}  // namespace kfdev
