// Occupancy queries, cached: cudaOccupancy* costs microseconds, which a decode-sized call cannot
// afford. Host code; included by the launchers (.cu files).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "common/device.h"

namespace kernelforge {

// Per (kernel, device) facts, cached for the same reason: the dynamic shared memory limit raised so
// far and the binary version of the code the device runs (cudaFuncGetAttributes).
struct KernelDeviceFacts {
  const void* kernel = nullptr;
  int device = -1;
  size_t smem_limit = 0;    // dynamic bytes allowed after a raise; 0: not raised
  int binary_version = -1;  // -1: not queried yet; 0: no image for this device
  size_t static_smem = 0;   // the kernel's static shared memory, bytes
};

inline KernelDeviceFacts& kernel_device_facts(const void* kernel, int device) {
  static std::vector<KernelDeviceFacts> facts;  // callers hold the mutex below
  for (KernelDeviceFacts& f : facts)
    if (f.kernel == kernel && f.device == device) return f;
  facts.push_back(KernelDeviceFacts{kernel, device});
  return facts.back();
}

inline std::mutex& kernel_device_facts_mutex() {
  static std::mutex mu;
  return mu;
}

// Fills f.binary_version and f.static_smem on the first query (cudaFuncGetAttributes).
inline void query_kernel_attributes(KernelDeviceFacts& f) {
  if (f.binary_version >= 0) return;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, f.kernel) == cudaSuccess) {
    f.binary_version = attr.binaryVersion;
    f.static_smem = attr.sharedSizeBytes;
  } else {
    cudaGetLastError();
    f.binary_version = 0;
  }
}

// Makes `kernel` launchable with `smem` bytes of dynamic shared memory on the current device. The
// first launch whose static + dynamic shared memory exceeds 48 KB raises the limit to the most the device allows beside
// the kernel's static shared memory (227 KB in all on the H100), once per (kernel, device); the limit never goes down,
// so no launcher can shrink another's.
inline cudaError_t ensure_smem_limit(const void* kernel, size_t smem) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(kernel_device_facts_mutex());
  KernelDeviceFacts& f = kernel_device_facts(kernel, device);
  if (smem <= f.smem_limit) return cudaSuccess;
  query_kernel_attributes(f);
  // without the attribute, static + dynamic shared memory may reach 48 KB
  if (f.smem_limit == 0 && smem + f.static_smem <= 48 * 1024) return cudaSuccess;
  int optin = 0;
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const size_t most = size_t(optin) > f.static_smem ? size_t(optin) - f.static_smem : 0;
  if (smem > most) return cudaErrorInvalidValue;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most));
  if (err == cudaSuccess) f.smem_limit = most;
  return err;
}

// The binary version (e.g. 90) of the image of `kernel` the current device runs; 0 when there is
// none (the build has no code for this device).
inline int kernel_binary_version(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(kernel_device_facts_mutex());
  KernelDeviceFacts& f = kernel_device_facts(kernel, device);
  query_kernel_attributes(f);
  return f.binary_version;
}

// Blocks of `kernel` resident per SM at `threads` threads and `smem` bytes of dynamic shared memory.
// The first call per (kernel, threads, smem) also raises the kernel's dynamic shared memory limit
// (static + dynamic shared memory over 48 KB needs the attribute). 0 when the kernel cannot run so.
inline int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  struct Key {
    const void* k;
    int t;
    size_t s;
    int v;
  };
  static std::mutex mu;
  static std::vector<Key> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Key& e : cache)
      if (e.k == kernel && e.t == threads && e.s == smem) return e.v;
  }
  int per_sm = 0;
  if (ensure_smem_limit(kernel, smem) != cudaSuccess) per_sm = -1;
  if (per_sm == 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    per_sm = -1;
  if (per_sm < 1) {
    cudaGetLastError();
    per_sm = 0;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({kernel, threads, smem, per_sm});
  return per_sm;
}

template <typename... Params>
cudaError_t ensure_smem_limit(void (*kernel)(Params...), size_t smem) {
  return ensure_smem_limit(reinterpret_cast<const void*>(kernel), smem);
}

template <typename... Params>
int kernel_binary_version(void (*kernel)(Params...)) {
  return kernel_binary_version(reinterpret_cast<const void*>(kernel));
}

template <typename... Params>
int blocks_per_sm(void (*kernel)(Params...), int threads, size_t smem = 0) {
  return blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);
}

// Resident blocks of `kernel` on the whole device at `threads` threads (at least one per SM).
template <typename... Params>
int resident_blocks(void (*kernel)(Params...), int threads, const DeviceInfo& dev, size_t smem = 0) {
  const int per_sm = blocks_per_sm(kernel, threads, smem);
  return (per_sm < 1 ? 1 : per_sm) * dev.sm_count;
}

}  // namespace kernelforge
