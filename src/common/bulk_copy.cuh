// Hopper (sm_90) bulk copies global -> shared memory, shared by the kernel families' pipelined
// kernels: cp.async.bulk (the copy engine; no registers, no threads beyond the one that issues it)
// completing on a shared-memory mbarrier with a transaction byte count.
//   issue:   mbar_expect(bar, bytes) then bulk_load(dst, src, bytes, bar) (16-byte aligned src and dst,
//            bytes a multiple of 16), by one thread;
//   consume: mbar_wait(bar, parity) by every thread, parity = (uses of this barrier so far) & 1;
//   reuse:   after a __syncthreads that follows the last read of dst, fence_proxy_async() by the
//            issuing thread, then issue again (the async proxy must see the generic-proxy reads done).
// Compiled to nothing below sm_90 (kHasBulk false there): callers keep those paths off sm_80/sm_75.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernelforge {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kHasBulk = false;
#else
constexpr bool kHasBulk = true;
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One-arrival barrier (the issuing thread's expect_tx); then fence so the async proxy sees it.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void bulk_load_row(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "KF_WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra KF_WAIT_%=;\n}" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Orders this thread's earlier generic-proxy shared-memory accesses before later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

}  // namespace kernelforge
