// Backward row statistics (pass 1 of plan kind kBwdSplit): {mean, rstd, mean(dn), mean(dn·xh)} of
// every row (kernels/common.cuh row_bwd_stats), 16 bytes per row. Traffic: read x and dy once.
// Why it exists: rows too long for one block's registers; pass 2 (norm_bwd_regs with kColumnTile)
// then needs no reduction.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Split backward for long rows, pass 1: the statistics of every row, {mean, rstd, mdn, mdnxh} into
// wk.row_stats (16 B per row). Pass 2 is norm_bwd_regs<..., kTile = true>: a 2-D grid of column tiles
// and row sets, each thread owning fixed columns (column sums in registers, no read-modify-write of
// partial rows). Traffic: x, dy read twice, dx written once (5 passes instead of the ideal 3, but at
// streaming speed; norm_bwd_stream read-modify-wrote a float32 partial row per row: 1281 GB/s
// effective fwd+bwd at 4096x65536).
template <typename T, NormOp kOp, int kVec>
__global__ void __launch_bounds__(kBwdStreamTeam) norm_bwd_rowstats(const NormParams p, float4* row_stats) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    constexpr int kS = OpTraits<kOp>::kLayer ? 4 : 2;
    __shared__ ReduceSmem<kS> sm;
    int slot = 0;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const BwdStats bs = row_bwd_stats<T, kOp, kVec, kS, 4>(p, row, sm, slot);
      if (threadIdx.x == 0) row_stats[row] = make_float4(bs.mean, bs.rstd, bs.mdn, bs.mdnxh);
    }
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
