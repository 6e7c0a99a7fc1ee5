// Softmax family launcher: one switch over plan.kind, one launch per kernel. The plan (softmax_plan.h)
// holds the kernel and every launch parameter; the launcher adds what depends on the rows and on
// occupancy: grids (a persistent grid of the resident CTAs or clusters for the streaming and bulk
// kernels), the programmatic-dependent-launch trigger, and the residency check of a cluster shape.
// Instantiated once per dtype (softmax_<dtype>.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/launch.cuh"
#include "common/math.h"
#include "common/occupancy.h"
#include "common/plan_record.h"
#include "softmax/kernels/softmax_bulk_bwd.cuh"
#include "softmax/kernels/softmax_bulk_fwd.cuh"
#include "softmax/kernels/softmax_fwd_row.cuh"
#include "softmax/kernels/softmax_regs.cuh"
#include "softmax/kernels/softmax_stream.cuh"
#include "softmax/softmax_plan.h"

namespace kernelforge {
namespace softmax_detail {

// The streaming kernel's persistent grid: one 1024-thread CTA per SM. With one row per SM in flight
// the rows being worked on stay in L2 between the two passes (132 x 256 KB = 33 MB at 131072 bf16).
constexpr int kStreamBlocksPerSm = 1;

// Clusters (cluster > 1) of `kernel` resident at once for (cluster size, block, dynamic shared memory),
// cached (the runtime query costs microseconds, which a decode-sized call cannot afford); 0 when the
// shape cannot be resident. A kernel using dynamic shared memory gets its limit raised to the bulk cap
// on the first query (static + dynamic over 48 KB needs the attribute): one value for every shape, as
// the attribute belongs to the kernel, not to a launch (raising it per shape to that shape's size broke
// a later launch of a larger cached shape: "invalid argument"). One-CTA shapes: common/occupancy.h.
inline int cached_active_clusters(const void* kernel, int cluster, int block, const cudaLaunchConfig_t& cfg) {
  struct Key {
    const void* k;
    int c, b;
    size_t smem;
    int v;
  };
  static std::mutex mu;
  static std::vector<Key> cache;
  std::lock_guard<std::mutex> lock(mu);
  const size_t smem = cfg.dynamicSmemBytes;
  for (const Key& e : cache)
    if (e.k == kernel && e.c == cluster && e.b == block && e.smem == smem) return e.v;
  int v = 0;
  cudaError_t err = cudaSuccess;
  err = ensure_smem_limit(kernel, smem);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&v, kernel, &cfg);
  if (err != cudaSuccess) {
    cudaGetLastError();
    v = 0;
  }
  cache.push_back({kernel, cluster, block, smem, v});
  return v;
}

// Clusters of `cluster` CTAs (CTAs when cluster == 1) of `kernel` resident on the device at once.
template <typename... Params>
int resident_units(void (*kernel)(Params...), int cluster, int block, const Launch& probe, const DeviceInfo& dev) {
  if (cluster == 1) return blocks_per_sm(kernel, block, probe.cfg.dynamicSmemBytes) * dev.sm_count;
  return cached_active_clusters(reinterpret_cast<const void*>(kernel), cluster, block, probe.cfg);
}

// ---- kernel instances -----------------------------------------------------------------------------
// softmax_regs for plan.mode / plan.scalar_head at kIters vectors per thread: the two-reduction modes
// are compiled for the forward with <= 16 values per thread, the scalar head for the backward.
using RegsKernel = void (*)(SoftmaxParams, int, int);
template <typename T, bool kLog, bool kBwd, int kVec, int kIters>
RegsKernel regs_kernel_at(const SoftmaxPlan& plan) {
  using M = SoftmaxRegsMode;
  if constexpr (!kBwd && kIters * kVec <= 16) {
    if (plan.mode == M::kMaxThenSum) return softmax_regs<T, kLog, kBwd, kVec, kIters, M::kMaxThenSum>;
    if constexpr (!kLog) {
      if (plan.mode == M::kMaxThenSumRepeat) return softmax_regs<T, kLog, kBwd, kVec, kIters, M::kMaxThenSumRepeat>;
    }
  }
  if constexpr (kBwd && kVec > 1) {
    if (plan.scalar_head) return softmax_regs<T, kLog, kBwd, kVec, kIters, M::kOnline, true>;
  }
  return softmax_regs<T, kLog, kBwd, kVec, kIters, M::kOnline>;
}
template <typename T, bool kLog, bool kBwd, int kVec>
RegsKernel regs_kernel(const SoftmaxPlan& plan) {
  switch (plan.iters) {
    case 1:
      return regs_kernel_at<T, kLog, kBwd, kVec, 1>(plan);
    case 2:
      return regs_kernel_at<T, kLog, kBwd, kVec, 2>(plan);
    case 4:
      return regs_kernel_at<T, kLog, kBwd, kVec, 4>(plan);
    default:
      return regs_kernel_at<T, kLog, kBwd, kVec, 8>(plan);
  }
}

// softmax_fwd_row at the compiled (threads, iters) of softmax_plan.cpp's kFwdRowConfigs /
// kFwdHeadConfigs (check_plan has rejected the others).
using RowKernel = void (*)(SoftmaxParams);
template <typename T, bool kLog, int kVec>
RowKernel fwd_row_kernel(const SoftmaxPlan& plan) {
  if (plan.scalar_head) {
    if (plan.iters == 4) return softmax_fwd_row<T, kLog, kVec, 4, 512, true>;
    if (plan.threads == 128) return softmax_fwd_row<T, kLog, kVec, 2, 128, true>;
    if (plan.threads == 256) return softmax_fwd_row<T, kLog, kVec, 2, 256, true>;
    return softmax_fwd_row<T, kLog, kVec, 2, 512, true>;
  }
  if (plan.iters == 4) return softmax_fwd_row<T, kLog, kVec, 4, 512>;
  if (plan.iters == 1) {
    if (plan.threads == 128) return softmax_fwd_row<T, kLog, kVec, 1, 128>;
    if (plan.threads == 256) return softmax_fwd_row<T, kLog, kVec, 1, 256>;
    return softmax_fwd_row<T, kLog, kVec, 1, 512>;
  }
  if (plan.threads == 128) return softmax_fwd_row<T, kLog, kVec, 2, 128>;
  if (plan.threads == 256) return softmax_fwd_row<T, kLog, kVec, 2, 256>;
  return softmax_fwd_row<T, kLog, kVec, 2, 512>;
}

using BulkKernel = void (*)(SoftmaxParams, int, int);
template <typename T, bool kLog, bool kBwd, int kVec>
BulkKernel bulk_kernel(const SoftmaxPlan& plan) {
  if constexpr (kBwd) {
    return softmax_bulk_bwd<T, kLog, kVec>;
  } else {
    switch (plan.iters) {  // vectors per thread: at most 8 (64 KB slices, 512 threads)
      case 1:
        return softmax_bulk_fwd<T, kLog, kVec, 1>;
      case 2:
        return softmax_bulk_fwd<T, kLog, kVec, 2>;
      case 4:
        return softmax_bulk_fwd<T, kLog, kVec, 4>;
      default:
        return softmax_bulk_fwd<T, kLog, kVec, 8>;
    }
  }
}

// ---- launches (each: false in *resident when the plan's cluster shape cannot be resident) ---------
// softmax_regs: blocks of rows_per_block teams, or clusters of one team per CTA; the grid covers the
// rows (capped at 2^31 - 1 blocks; the kernel loops).
inline Status launch_regs(RegsKernel kernel, const SoftmaxPlan& plan, const SoftmaxParams& p, const DeviceInfo& dev,
                          bool pdl, cudaStream_t stream, bool* resident) {
  const int block = plan.threads * plan.rows_per_block;
  const int64_t units = std::min<int64_t>(ceil_div(p.rows, plan.rows_per_block), INT_MAX / plan.cluster);
  const dim3 grid(unsigned(units * plan.cluster));
  const int tpr_shift = log2_of(plan.threads);
  if (plan.cluster > 1) {
    Launch probe(grid, dim3(block), 0, stream, false, plan.cluster);
    if (resident_units(kernel, plan.cluster, block, probe, dev) < 1) return *resident = false, Status::Ok();
    Launch l(grid, dim3(block), 0, stream, pdl, plan.cluster);
    return launched(l(kernel, p, tpr_shift, plan.cluster), "softmax (cluster)");
  }
  SoftmaxParams q = p;  // at most one block per SM: the whole grid is resident, let the next kernel in
  q.trigger = pdl && units <= dev.sm_count;
  Launch l(grid, dim3(block), 0, stream, pdl);
  return launched(l(kernel, q, tpr_shift, 1), "softmax");
}

// softmax_fwd_row: one CTA per row (the grid capped at 2^31 - 1; the kernel loops).
inline Status launch_fwd_row(RowKernel kernel, const SoftmaxPlan& plan, const SoftmaxParams& p, const DeviceInfo& dev,
                             bool pdl, cudaStream_t stream) {
  const int64_t grid = std::min<int64_t>(p.rows, INT_MAX);
  SoftmaxParams q = p;  // the whole grid resident at once: let the next kernel in
  q.trigger = pdl && grid <= dev.sm_count;
  Launch l(dim3(unsigned(grid)), dim3(unsigned(plan.threads)), 0, stream, pdl);
  return launched(l(kernel, q), "softmax (row)");
}

// softmax_stream: a persistent grid of one CTA (or cluster) per SM, at most one per row; clusters as
// many as are resident at once (fewer than SMs / cluster where a GPC's SM count is not a multiple of
// the cluster size; a second wave doubled the time).
template <typename T, bool kLog, bool kBwd, int kVec>
Status launch_stream(const SoftmaxPlan& plan, const SoftmaxParams& p, const DeviceInfo& dev, bool pdl,
                     cudaStream_t stream, bool* resident) {
  auto kernel = softmax_stream<T, kLog, kBwd, kVec>;
  const int64_t blocks = int64_t(std::max(1, dev.sm_count)) * kStreamBlocksPerSm;
  if (plan.cluster > 1) {
    // (a cluster launch's grid is a multiple of the cluster size: 132 SMs hold 16 clusters of 8)
    Launch probe(dim3(unsigned(blocks / plan.cluster * plan.cluster)), dim3(kStreamTeam), 0, stream, false,
                 plan.cluster);
    const int active = resident_units(kernel, plan.cluster, kStreamTeam, probe, dev);
    const int64_t units = std::min<int64_t>({p.rows, blocks / plan.cluster, int64_t(active) * kStreamBlocksPerSm});
    if (units < 1) return *resident = false, Status::Ok();
    Launch l(dim3(unsigned(units * plan.cluster)), dim3(kStreamTeam), 0, stream, pdl, plan.cluster);
    return launched(l(kernel, p, plan.cluster), "softmax (streaming, cluster)");
  }
  const int64_t grid = std::min<int64_t>(p.rows, blocks);
  Launch l(dim3(unsigned(grid)), dim3(kStreamTeam), 0, stream, pdl);
  return launched(l(kernel, p, 1), "softmax (streaming)");
}

// The bulk kernels: as many clusters as are resident at once, at most one per row.
inline Status launch_bulk(BulkKernel kernel, const SoftmaxPlan& plan, const SoftmaxParams& p, int64_t smem,
                          const DeviceInfo& dev, bool pdl, cudaStream_t stream, bool* resident) {
  Launch probe(dim3(unsigned(plan.cluster)), dim3(unsigned(plan.threads)), size_t(smem), stream, false, plan.cluster);
  const int active = resident_units(kernel, plan.cluster, plan.threads, probe, dev);
  if (active < 1) return *resident = false, Status::Ok();
  const int64_t units = std::min<int64_t>(p.rows, active);
  Launch l(dim3(unsigned(units * plan.cluster)), dim3(unsigned(plan.threads)), size_t(smem), stream, pdl, plan.cluster);
  return launched(l(kernel, p, plan.cluster, plan.stages), "softmax (bulk)");
}

// The one switch over the kernel.
template <typename T, bool kLog, bool kBwd>
Status launch_kind(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const SoftmaxParams& p, const DeviceInfo& dev,
                   cudaStream_t stream, bool* resident) {
  constexpr int kVec = 16 / int(sizeof(T));
  const bool pdl = use_pdl(dev);
  const bool v16 = plan.vec != 1;
  switch (plan.kind) {
    case SoftmaxKernel::kRegs:
      return launch_regs(v16 ? regs_kernel<T, kLog, kBwd, kVec>(plan) : regs_kernel<T, kLog, kBwd, 1>(plan), plan, p,
                         dev, pdl, stream, resident);
    case SoftmaxKernel::kFwdRow:
      if constexpr (!kBwd) return launch_fwd_row(fwd_row_kernel<T, kLog, kVec>(plan), plan, p, dev, pdl, stream);
      break;
    case SoftmaxKernel::kStream:
      return v16 ? launch_stream<T, kLog, kBwd, kVec>(plan, p, dev, pdl, stream, resident)
                 : launch_stream<T, kLog, kBwd, 1>(plan, p, dev, pdl, stream, resident);
    case SoftmaxKernel::kBulkFwd:
    case SoftmaxKernel::kBulkBwd:
      return launch_bulk(bulk_kernel<T, kLog, kBwd, kVec>(plan), plan, p, plan_smem_bytes(plan, pr), dev, pdl, stream,
                         resident);
  }
  return Status::Invalid("softmax: plan " + to_string(plan) + " has no kernel for this op");
}

}  // namespace softmax_detail

// Runs `plan` (already checked by check_plan) and records it (kernelforge::last_plan()); a plan whose
// cluster shape the occupancy query finds not resident runs fallback_plan instead, which is recorded.
template <typename T>
Status launch_softmax(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const SoftmaxParams& params,
                      const DeviceInfo& dev, cudaStream_t stream) {
  if (pr.rows == 0 || pr.n == 0) return Status::Ok();
  SoftmaxParams p = params;
  p.trigger = false;
  p.scalar_head = plan.scalar_head;
  record_plan(plan);
  bool resident = true;
  Status st;
  if (pr.log) {
    st = pr.backward ? softmax_detail::launch_kind<T, true, true>(plan, pr, p, dev, stream, &resident)
                     : softmax_detail::launch_kind<T, true, false>(plan, pr, p, dev, stream, &resident);
  } else {
    st = pr.backward ? softmax_detail::launch_kind<T, false, true>(plan, pr, p, dev, stream, &resident)
                     : softmax_detail::launch_kind<T, false, false>(plan, pr, p, dev, stream, &resident);
  }
  if (!resident) return launch_softmax<T>(fallback_plan(plan, pr, dev), pr, params, dev, stream);
  return st;
}

}  // namespace kernelforge
