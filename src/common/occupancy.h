// Occupancy queries, cached: cudaOccupancy* costs microseconds, which a decode-sized call cannot
// afford. Host code; included by the launchers (.cu files).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "common/device.h"

namespace kernelforge {

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
  std::lock_guard<std::mutex> lock(mu);
  for (const Key& e : cache)
    if (e.k == kernel && e.t == threads && e.s == smem) return e.v;
  int per_sm = 0;
  if (smem > 0 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) != cudaSuccess)
    per_sm = -1;
  if (per_sm == 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    per_sm = -1;
  if (per_sm < 1) {
    cudaGetLastError();
    per_sm = 0;
  }
  cache.push_back({kernel, threads, smem, per_sm});
  return per_sm;
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
