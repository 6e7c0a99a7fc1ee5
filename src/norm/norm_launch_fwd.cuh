// Forward launches, one per plan kind (norm_launch.cuh switches over them). The plan fixes the
// kernel instantiation, block, rows per block, cluster and stages; persistent grids are sized here
// from the cached occupancy queries of common/occupancy.h.
#pragma once

#include <algorithm>
#include <climits>

#include "common/launch.cuh"
#include "common/math.h"
#include "common/occupancy.h"
#include "norm/kernels/fwd_bulk.cuh"
#include "norm/kernels/fwd_cluster.cuh"
#include "norm/kernels/fwd_row.cuh"
#include "norm/kernels/fwd_stream.cuh"
#include "norm/norm_launch.cuh"

namespace kernelforge {
namespace norm_detail {

// norm_fwd_row: one row group per block, grid ceil(rows / rows_per_block). The early-parameter
// kernel lets the next kernel launch at once (programmatic dependent launch) when its whole grid is
// resident (at most one block per SM).
template <typename T, NormOp kOp, int kVec, int kIters, bool kHead>
Status fwd_row(const NormPlan& pl, const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int shift = log2_of(pl.threads / pl.rows_per_block);
  const int64_t units = std::min<int64_t>(ceil_div(p.rows, pl.rows_per_block), INT_MAX);
  Launch row(dim3(unsigned(units)), dim3(pl.threads), 0, stream, use_pdl(dev));
  if (pl.threads > kFwdRowMaxBlock) {  // 512 threads x 2 vectors
    if constexpr (kIters == 2) {
      if constexpr (OpTraits<kOp>::kAda) {
        if (pl.plain_ada)
          return launched(row(norm_fwd_row<T, kOp, kVec, 2, false, true, kFwdRowBigBlock, kHead>, p, shift),
                          "norm forward");
      }
      return launched(row(norm_fwd_row<T, kOp, kVec, 2, false, false, kFwdRowBigBlock, kHead>, p, shift),
                      "norm forward");
    }
    return Status::Invalid("norm forward: fwd_row blocks over 256 threads take iters=2");
  }
  if (pl.early_params) {
    if constexpr (!kHead) {
      NormParams q = p;
      q.trigger = units <= dev.sm_count;
      return launched(row(norm_fwd_row<T, kOp, kVec, kIters, true>, q, shift), "norm forward");
    }
    return Status::Invalid("norm forward: no early-parameter kernel with a scalar head");
  }
  if constexpr (OpTraits<kOp>::kAda) {
    if (pl.plain_ada)
      return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, true, kFwdRowMaxBlock, kHead>, p, shift),
                      "norm forward");
  }
  return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, false, kFwdRowMaxBlock, kHead>, p, shift),
                  "norm forward");
}

// norm_fwd_cluster: a persistent grid, of resident blocks (cluster = 1) or of one cluster per row.
template <typename T, NormOp kOp, int kVec, int kIters>
Status fwd_cluster(const NormPlan& pl, const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  auto kernel = norm_fwd_cluster<T, kOp, kVec, kIters>;
  const int shift = log2_of(pl.threads / pl.rows_per_block);
  int64_t units = ceil_div(p.rows, pl.rows_per_block);
  if (pl.cluster == 1) {
    units = std::min<int64_t>(units, resident_blocks(kernel, pl.threads, dev));
    Launch persistent(dim3(unsigned(units)), dim3(pl.threads), 0, stream, use_pdl(dev));
    return launched(persistent(kernel, p, shift, 1), "norm forward");
  }
  units = std::min<int64_t>(units, INT_MAX / pl.cluster);
  Launch cl(dim3(unsigned(units * pl.cluster)), dim3(pl.threads), 0, stream, use_pdl(dev), pl.cluster);
  return launched(cl(kernel, p, shift, pl.cluster), "norm forward (cluster)");
}

// norm_fwd_bulk: a persistent grid of the CTAs (or clusters) resident at the plan's shared memory.
template <typename T, NormOp kOp>
Status fwd_bulk(const NormPlan& pl, const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  auto kernel = norm_fwd_bulk<T, kOp, kVec>;
  if constexpr (kOp == NormOp::kRms || kOp == NormOp::kLayer) {
    if (pl.params_in_regs) kernel = norm_fwd_bulk<T, kOp, kVec, 8>;
    if (pl.params_per_vector) kernel = norm_fwd_bulk<T, kOp, kVec, 0, 1>;
  }
  const int cluster = pl.cluster, nbuf = OpTraits<kOp>::kRes ? 2 : 1;
  const size_t smem = size_t(pl.stages) * nbuf * size_t(p.n / cluster) * sizeof(T);
  auto no_room = [&] {  // formatted only when it happens
    return Status::NotSupported("norm forward (bulk): " + to_string(pl) + " with " + std::to_string(smem) +
                                " bytes of shared memory cannot be resident");
  };
  const int per_sm = blocks_per_sm(kernel, pl.threads, smem);
  if (per_sm < 1) return no_room();
  int64_t ctas = int64_t(per_sm) * dev.sm_count;
  if (cluster > 1) {  // clusters must fit inside a GPC: size the persistent grid by resident clusters
    Launch cl(dim3(unsigned(std::max<int64_t>(cluster, (ctas / cluster) * cluster))), dim3(pl.threads), smem, stream,
              false, cluster);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cl.cfg) != cudaSuccess || clusters < 1) {
      cudaGetLastError();
      return no_room();
    }
    ctas = int64_t(clusters) * cluster;
  }
  ctas = std::min<int64_t>(ctas, p.rows * cluster);
  Launch bulk(dim3(unsigned(std::max<int64_t>(ctas, cluster))), dim3(pl.threads), smem, stream, use_pdl(dev), cluster);
  return launched(bulk(kernel, p, cluster, pl.stages), "norm forward (bulk)");
}

template <typename T>
Status launch_fwd_row(const NormPlan& pl, NormOp op, const NormParams& p, const DeviceInfo& dev, cudaStream_t s) {
  constexpr int kV = 16 / sizeof(T);
  return with_op(op, [&](auto opc) {
    constexpr NormOp kOp = decltype(opc)::value;
    if (pl.vec == 1)
      return with_iters<16>(pl.iters,
                            [&](auto it) { return fwd_row<T, kOp, 1, decltype(it)::value, false>(pl, p, dev, s); });
    if (pl.scalar_head)
      return with_iters<8>(pl.iters,
                           [&](auto it) { return fwd_row<T, kOp, kV, decltype(it)::value, true>(pl, p, dev, s); });
    return with_iters<8>(pl.iters,
                         [&](auto it) { return fwd_row<T, kOp, kV, decltype(it)::value, false>(pl, p, dev, s); });
  });
}

template <typename T>
Status launch_fwd_cluster(const NormPlan& pl, NormOp op, const NormParams& p, const DeviceInfo& dev, cudaStream_t s) {
  constexpr int kV = 16 / sizeof(T);
  return with_op(op, [&](auto opc) {
    constexpr NormOp kOp = decltype(opc)::value;
    if (pl.vec == 1)
      return with_iters<16>(pl.iters,
                            [&](auto it) { return fwd_cluster<T, kOp, 1, decltype(it)::value>(pl, p, dev, s); });
    return with_iters<8>(pl.iters,
                         [&](auto it) { return fwd_cluster<T, kOp, kV, decltype(it)::value>(pl, p, dev, s); });
  });
}

template <typename T>
Status launch_fwd_bulk(const NormPlan& pl, NormOp op, const NormParams& p, const DeviceInfo& dev, cudaStream_t s) {
  return with_op(op, [&](auto opc) { return fwd_bulk<T, decltype(opc)::value>(pl, p, dev, s); });
}

// norm_fwd_stream: one 1024-thread block per row.
template <typename T>
Status launch_fwd_stream(const NormPlan& pl, NormOp op, const NormParams& p, const DeviceInfo& dev, cudaStream_t s) {
  constexpr int kV = 16 / sizeof(T);
  return with_op(op, [&](auto opc) {
    constexpr NormOp kOp = decltype(opc)::value;
    const int64_t grid = std::min<int64_t>(p.rows, INT_MAX);
    Launch ls(dim3(unsigned(grid)), dim3(kFwdStreamThreads), 0, s, use_pdl(dev));
    if (pl.vec == 1) return launched(ls(norm_fwd_stream<T, kOp, 1>, p), "norm forward (streaming)");
    return launched(ls(norm_fwd_stream<T, kOp, kV>, p), "norm forward (streaming)");
  });
}

}  // namespace norm_detail
}  // namespace kernelforge
