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
