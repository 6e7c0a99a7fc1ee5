// Hopper (sm_90a) helpers of the warp-specialized kernels beyond common/bulk_copy.cuh: TMA tile loads
// (cp.async.bulk.tensor, 2-D and 4-D, completing on an mbarrier with a transaction byte count) and
// reduce-adds (3-D, completing in bulk groups), mbarriers with several arrivals, named barriers
// between warp groups, and the register reallocation between producer and consumer warpgroups.
// Host side: common/tma_map.h builds the CUtensorMap descriptors. Compiled to nothing outside sm_90a.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; no driver library is linked)
#include <cuda_runtime.h>

#include <cstdint>

#include "common/bulk_copy.cuh"
#include "common/sm90a.h"

namespace kernelforge {

// Barrier completing after `count` arrivals (plus the transactions of an expect_tx, if any).
__device__ __forceinline__ void mbar_init_count(uint64_t* bar, uint32_t count) {
#if KF_SM90A
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
  (void)bar, (void)count;
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if KF_SM90A
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
#else
  (void)bar;
#endif
}

__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
#if KF_SM90A
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#else
  (void)map;
#endif
}

// Prefetches the box of `map` at element coordinates (c0, c1) from global memory into L2; nothing is
// written to shared memory and nothing completes on a barrier.
__device__ __forceinline__ void tma_prefetch_l2_2d(const CUtensorMap* map, int c0, int c1) {
#if KF_SM90A
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1)
               : "memory");
#else
  (void)map, (void)c0, (void)c1;
#endif
}

// Loads the box of `map` at element coordinates (c0, c1) (c0 the contiguous one) into `dst`, as
// tma_load_4d below.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
#if KF_SM90A
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
#else
  (void)dst, (void)map, (void)bar, (void)c0, (void)c1;
#endif
}

// Loads the box of `map` at element coordinates (c0, c1, c2, c3) (c0 the contiguous one) into `dst`
// (shared memory, laid out and swizzled as the map says); elements outside the tensor read as zero and
// still count toward the transaction bytes. Completes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
#if KF_SM90A
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
#else
  (void)dst, (void)map, (void)bar, (void)c0, (void)c1, (void)c2, (void)c3;
#endif
}

// Adds the box at `src` (shared memory, laid out and swizzled as the map says) into the tensor of `map`
// at element coordinates (c0, c1, c2), in the map's element type; elements outside the tensor are
// skipped. Completes in this thread's bulk group (bulk_commit, then bulk_wait / bulk_wait_read).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
#if KF_SM90A
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#else
  (void)map, (void)src, (void)c0, (void)c1, (void)c2;
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if KF_SM90A
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
// Until at most kPending of this thread's bulk groups have not finished reading shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
#if KF_SM90A
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
#endif
}
// Until at most kPending of this thread's bulk groups are incomplete (their writes performed), then
// orders them before this thread's later generic-proxy global accesses.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
#if KF_SM90A
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Named barriers (id 0 is __syncthreads): `threads` counts every thread that arrives or syncs.
__device__ __forceinline__ void named_sync(int id, int threads) {
#if KF_SM90A
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
  (void)id, (void)threads;
#endif
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
#if KF_SM90A
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
#else
  (void)id, (void)threads;
#endif
}

// Register reallocation, executed by every thread of a warpgroup.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if KF_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if KF_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}

}  // namespace kernelforge
