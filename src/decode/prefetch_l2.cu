// prefetch_l2's launcher (contract: include/kernelforge/decode.h): one thread per 16 KB of the range,
// 128 threads per block. No programmatic-dependent-launch attribute: the prefetch depends on no
// kernel's result (a weight is already in memory), and its callers run it on a branch of their own.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/launch.cuh"
#include "common/math.h"
#include "decode/kernels/prefetch_l2.cuh"
#include "kernelforge/decode.h"

namespace kernelforge {

Status prefetch_l2(const void* ptr, int64_t bytes, cudaStream_t stream) {
  if (bytes < 0) return Status::Invalid("prefetch_l2: bytes must be >= 0, got " + std::to_string(bytes));
  if (bytes == 0) return Status::Ok();
  if (ptr == nullptr) {
    return Status::Invalid("prefetch_l2: ptr is null with bytes = " + std::to_string(bytes) +
                           " (a range needs device memory)");
  }
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Cuda(std::string("prefetch_l2: cannot query ptr: ") + cudaGetErrorString(err));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return Status::Invalid(std::string("prefetch_l2: ptr must point to device or managed memory, got ") +
                           (attr.type == cudaMemoryTypeHost ? "page-locked host memory" : "unregistered host memory"));
  }
  int device = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) {
    cudaGetLastError();
    return Status::Cuda(std::string("prefetch_l2: cudaGetDevice: ") + cudaGetErrorString(err));
  }
  if (attr.type == cudaMemoryTypeDevice && attr.device != device) {
    return Status::Invalid("prefetch_l2: ptr is memory of device " + std::to_string(attr.device) +
                           ", the current device is " + std::to_string(device));
  }
  const int64_t threads = ceil_div(bytes, decode::kPrefetchChunk);
  const int64_t blocks = ceil_div(threads, int64_t(decode::kPrefetchThreads));
  Launch l(dim3(unsigned(blocks)), dim3(decode::kPrefetchThreads), 0, stream, /*pdl=*/false);
  return launched(l(decode::prefetch_l2_kernel, static_cast<const char*>(ptr), bytes), "prefetch_l2");
}

}  // namespace kernelforge
