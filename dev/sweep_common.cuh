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

#include "kernelforge/tensor.h"

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

// The arguments every plan sweep takes (key=value): shapes=a,b  dirs=fwd,bwd  dtype=bf16|fp16|fp32
// reps=N  all=1 (also the plans a sweep hides by default). take() applies one and returns false for a
// key it does not know; parse_args() feeds it argv and leaves other keys to `extra`.
struct SweepArgs {
  std::vector<std::string> shapes;
  std::vector<std::string> dirs = {"fwd", "bwd"};
  kernelforge::DType dtype = kernelforge::DType::kBFloat16;
  int reps = 15;
  bool all = false;
  bool take(const std::string& k, const std::string& v) {
    if (k == "shapes") {
      shapes = split(v);
    } else if (k == "dirs") {
      dirs = split(v);
    } else if (k == "dtype") {
      dtype = v == "fp32"   ? kernelforge::DType::kFloat32
              : v == "fp16" ? kernelforge::DType::kFloat16
                            : kernelforge::DType::kBFloat16;
    } else if (k == "reps") {
      reps = std::max(1, std::atoi(v.c_str()));
    } else if (k == "all") {
      all = v != "0";
    } else {
      return false;
    }
    return true;
  }
};

// key=value arguments: `args.take` first, then `extra(key, value)`; an argument neither knows exits 2.
template <typename Extra>
void parse_args(int argc, char** argv, SweepArgs* args, Extra&& extra) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (!args->take(k, v) && !extra(k, v)) {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
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
