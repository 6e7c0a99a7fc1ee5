// Helpers shared by the kernel families' launchers and kernels: integer ceiling division, the guard
// for bf16 code on sm_75, launch-error reporting, programmatic dependent launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "common/device.h"
#include "common/math.h"
#include "kernelforge/status.h"

namespace kernelforge {

// bf16 kernels are not built for sm_75 (no bf16 there; the host rejects such calls): a kernel body
// is `if constexpr (!arch_supports<T>()) __trap(); else { ... }`.
template <typename T>
__device__ __forceinline__ constexpr bool arch_supports() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return !std::is_same<T, __nv_bfloat16>::value;
#else
  return true;
#endif
}

// Resident threads per SM of the architecture being compiled: a minimum block count asked of the
// compiler (__launch_bounds__) must fit it, or ptxas ignores it with a warning. sm_75 1024,
// sm_86/87/89 1536, sm_80/sm_90 2048.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kSmThreads = 1024;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ > 800 && __CUDA_ARCH__ < 900
constexpr int kSmThreads = 1536;
#else
constexpr int kSmThreads = 2048;
#endif

// The launch error of the last kernel launch, if any, as a Status naming `what`.
inline Status check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
  return Status::Ok();
}

// ---- programmatic dependent launch (sm_90) ------------------------------------------------------
// Every kernel is launched with the PDL attribute on sm_90 while the switch is on (Launch and use_pdl
// below, the switch in common/device.h): it may become resident while the previous kernel of the
// stream is still draining, which hides the launch latency (~1-2 µs per kernel boundary: the
// backward's column reductions, consecutive calls in a CUDA graph).
// pdl_wait() (griddepcontrol.wait) blocks until the previous kernel has completed and its writes are
// visible; without the attribute it returns at once. The rule: a kernel calls pdl_wait() before its
// first global read of anything an earlier kernel may have written and before its first global
// write. Before it a kernel may prefetch into L2 (the skinny linear kernels prefetch their weight's
// first stages: linear_skinny.cuh, linear_skinny_tma.cuh): L2 is the point of coherence, so a write
// of the previous kernel still in flight lands after the prefetch and the loads after the wait see
// it. The wait covers the full completion of the previous kernel, which could not complete before
// its own wait returned: the ordering is transitive along the stream.
// pdl_trigger() (griddepcontrol.launch_dependents) lets the next kernel launch before this one exits;
// only kernels whose whole grid is resident at once call it early (otherwise the next kernel's
// waiting blocks would take the slots of this kernel's later blocks), the pipelined ones after their
// last main-loop load; the others trigger implicitly as their blocks exit.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launch configuration for cudaLaunchKernelEx: grid, block, shared memory and stream, clusters of
// `cluster` CTAs along x when cluster > 1, and the programmatic-dependent-launch attribute when `pdl`.
struct Launch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2];
  Launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl, int cluster = 1) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (cluster > 1) {
      cudaLaunchAttribute& a = attr[cfg.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = unsigned(cluster);
      a.val.clusterDim.y = 1;
      a.val.clusterDim.z = 1;
    }
    if (pdl) {
      cudaLaunchAttribute& a = attr[cfg.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  template <typename... Params, typename... Args>
  cudaError_t operator()(void (*kernel)(Params...), Args&&... args) {
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  }
  Launch(const Launch&) = delete;  // cfg.attrs points into this object
  Launch& operator=(const Launch&) = delete;
};

// cudaLaunchKernelEx's error, or a failed launch reported by cudaGetLastError.
inline Status launched(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Cuda(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
  }
  return check_launch(what);
}

// Programmatic dependent launch for every kernel on sm_90 while the switch is on (common/device.h).
inline bool use_pdl(const DeviceInfo& dev) { return dev.capability >= 90 && pdl_switch(); }

}  // namespace kernelforge
