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

// The pipeline's two steps, by thread 0 of the CTA (the others return at once):
//   start:  initialise `stages` barriers and issue(row_of(s), s) for s < stages (row_of < 0: no row);
//           a __syncthreads must follow before any thread waits on a barrier;
//   refill: after a __syncthreads that follows every read of stage s, issue(row, s) (row < 0: none).
template <typename RowOf, typename Issue>
__device__ __forceinline__ void bulk_pipeline_start(uint64_t* bars, int stages, RowOf row_of, Issue issue) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) mbar_init(&bars[s]);
  mbar_init_fence();
  for (int s = 0; s < stages; ++s) {
    const int64_t row = row_of(s);
    if (row >= 0) issue(row, s);
  }
}
template <typename Issue>
__device__ __forceinline__ void bulk_pipeline_refill(int64_t row, int s, Issue issue) {
  if (threadIdx.x != 0 || row < 0) return;
  fence_proxy_async();
  issue(row, s);
}

}  // namespace kernelforge
