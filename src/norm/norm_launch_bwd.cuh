// Backward launches (norm_launch.cuh switches over the plan kinds; every backward kind ends in the same
// column reductions, so one function runs them all): the row kernel of the plan (after
// norm_bwd_rowstats for the split backward), then reduce_columns (and ada_group_grads for grouped
// AdaLN).
//
// Work split: G groups of R consecutive rows (G = 1, R = rows unless AdaLN has one scale row per R > 1
// rows). The grid is the resident blocks of the plan's kernel (occupancy, common/occupancy.h): with
// at least as many groups, each block owns whole groups (bpg = 1); else bpg blocks share a group.
// Workspace: float32 partial rows (one per block, or per group), per-group sums for grouped AdaLN
// shared by several blocks, and the split backward's row statistics; its size follows the grid, so
// the size query (workspace == nullptr) makes the same occupancy queries as the launch.
#pragma once

#include <algorithm>
#include <climits>
#include <string>

#include "common/launch.cuh"
#include "common/math.h"
#include "common/occupancy.h"
#include "norm/kernels/ada_group_grads.cuh"
#include "norm/kernels/bwd_chunk.cuh"
#include "norm/kernels/bwd_regs.cuh"
#include "norm/kernels/bwd_rowstats.cuh"
#include "norm/kernels/bwd_stream.cuh"
#include "norm/kernels/reduce_columns.cuh"
#include "norm/norm_launch.cuh"

namespace kernelforge {
namespace norm_detail {

// out_s = column sums of the slabs part_s (s < 2; an absent output or slab is skipped), one launch.
template <typename OutT, typename T>
Status reduce_into(const float* part_a, OutT* out_a, const float* part_d, OutT* out_d, int64_t n, int64_t ld,
                   int64_t rows_per_out, int64_t out_rows, int64_t out_ld, const T* scale, int64_t scale_stride,
                   bool pdl, cudaStream_t stream) {
  ColSums<OutT, T> a = {};
  int slabs = 0;
  if (part_a && out_a) {
    a.part[slabs] = part_a;
    a.out[slabs++] = out_a;
  }
  if (part_d && out_d) {
    a.part[slabs] = part_d;
    a.out[slabs++] = out_d;
  }
  if (slabs == 0) return Status::Ok();
  a.n = n;
  a.ld = ld;
  a.R = rows_per_out;
  a.out_rows = out_rows;
  a.out_ld = out_ld;
  a.scale = scale;
  a.scale_stride = scale_stride;
  const dim3 grid(unsigned(ceil_div(ld / 4, kColTileX)), unsigned(std::min<int64_t>(out_rows, 65535)), unsigned(slabs));
  Launch lr(grid, dim3(kColTileX, kColTileY), 0, stream, pdl);
  return launched(lr(reduce_columns<OutT, T>, a), "norm backward (column reduction)");
}

using BwdKernel = void (*)(const NormParams, const BwdWork, const int);

// The row kernel instantiation of a backward plan (nullptr: none).
template <typename T, NormOp kOp>
BwdKernel bwd_kernel(const NormPlan& pl) {
  constexpr int kV = 16 / sizeof(T);
  constexpr int kMaxIters = kV >= 16 ? 1 : 16 / kV;  // x, dy and accumulators: 16 elements per thread
  constexpr int kMaxHeadIters = kMaxIters < 4 ? kMaxIters : 4;
  BwdKernel k = nullptr;
  auto pick = [&](auto it) {
    constexpr int kIt = decltype(it)::value;
    if (pl.kind == NormKernel::kBwdRegsBulk)
      k = norm_bwd_regs<T, kOp, kV, kIt, true>;
    else if (pl.scalar_head)
      k = norm_bwd_regs<T, kOp, kV, kIt, false, false, true>;
    else
      k = norm_bwd_regs<T, kOp, kV, kIt, false>;
    return Status::Ok();
  };
  switch (pl.kind) {
    case NormKernel::kBwdRegs:
    case NormKernel::kBwdRegsBulk:
      if (pl.vec == 1) {
        with_iters<16>(pl.iters, [&](auto it) {
          k = norm_bwd_regs<T, kOp, 1, decltype(it)::value, false>;
          return Status::Ok();
        });
      } else if (pl.scalar_head) {
        with_iters<kMaxHeadIters>(pl.iters, pick);
      } else {
        with_iters<kMaxIters>(pl.iters, pick);
      }
      return k;
    case NormKernel::kBwdChunk:
      if (pl.iters == 1)
        return pl.chunk_rows <= 4 ? BwdKernel(norm_bwd_chunk<T, kOp, kV, 1, 4>)
                                  : BwdKernel(norm_bwd_chunk<T, kOp, kV, 1, 8>);
      return pl.chunk_rows <= 1 ? BwdKernel(norm_bwd_chunk<T, kOp, kV, 2, 1>)
                                : BwdKernel(norm_bwd_chunk<T, kOp, kV, 2, 2>);
    case NormKernel::kBwdSplit:
      return norm_bwd_regs<T, kOp, kV, kSplitIters, false, true>;
    case NormKernel::kBwdStream:
      return pl.vec == 1 ? BwdKernel(norm_bwd_stream<T, kOp, 1>) : BwdKernel(norm_bwd_stream<T, kOp, kV>);
    default:
      return nullptr;
  }
}

template <typename T, NormOp kOp>
Status bwd(const NormPlan& pl, const NormParams& p, const DeviceInfo& dev, void* workspace, size_t* workspace_bytes,
           cudaStream_t stream) {
  using Tr = OpTraits<kOp>;
  constexpr int kV = 16 / sizeof(T);
  const BwdKernel kernel = bwd_kernel<T, kOp>(pl);
  if (kernel == nullptr) return Status::Invalid("norm backward: no kernel for " + to_string(pl));
  const int64_t stage_bytes = int64_t(p.dsum ? 3 : 2) * p.n * int64_t(sizeof(T));  // x, dy (dsum) of one row
  const bool staged = pl.kind == NormKernel::kBwdRegsBulk || pl.kind == NormKernel::kBwdChunk;
  const bool split = pl.kind == NormKernel::kBwdSplit;
  const int64_t chunk = pl.kind == NormKernel::kBwdChunk ? pl.chunk_rows : 1;  // rows per work unit
  const size_t smem = staged ? size_t(pl.stages) * size_t(chunk * stage_bytes) : 0;
  const int stages = staged ? pl.stages : 1;
  const int64_t tiles = split ? ceil_div(p.n, int64_t(kSplitTeam) * kSplitIters * kV) : 1;

  BwdWork wk = {};
  wk.grouped = Tr::kAda && p.ada_rpg > 1;
  wk.groups = wk.grouped ? p.ada_groups : 1;
  wk.group_rows = wk.grouped ? p.ada_rpg : p.rows;
  wk.chunk = chunk;
  int64_t target;
  if (staged) {
    const int per_sm = blocks_per_sm(kernel, pl.threads, smem);
    if (per_sm < 1)
      return Status::Cuda("norm backward: cannot reserve " + std::to_string(smem) + " bytes of shared memory");
    target = int64_t(per_sm) * dev.sm_count;
  } else {
    target = resident_blocks(kernel, pl.threads, dev);
    if (split) target = std::max<int64_t>(1, ceil_div(target * 2, tiles));  // two waves of column tiles
  }
  // Scalar head: the rows of a block must share their head length. Row r's head follows the
  // misalignment of x + r·x_stride, periodic in r with period P; with blocks per group a multiple of P,
  // block b's rows (b % bpg) + k·bpg of its group all have the same.
  const int64_t period = pl.scalar_head ? row_misalignment_period(p, int(sizeof(T))) : 1;
  int64_t nblocks;
  if (wk.groups >= target && period == 1) {
    wk.bpg = 1;
    nblocks = std::min<int64_t>(target, INT_MAX);
  } else {  // blocks per group: at most one per work unit (row or chunk) of the group
    wk.bpg = std::max<int64_t>(1, std::min(ceil_div(wk.group_rows, chunk), ceil_div(target, wk.groups)));
    // rounded down: one more block than the resident ones would run a second wave of blocks (136
    // instead of 132 blocks doubled the time of a 16384x8191 RMSNorm backward)
    wk.bpg = std::max<int64_t>(period, wk.bpg / period * period);
    nblocks = wk.groups * wk.bpg;
    if (nblocks > INT_MAX) return Status::Invalid("norm backward: " + to_string(pl) + " needs more than 2^31-1 blocks");
  }
  // Partial rows: one per block, or one per group when a block owns whole groups. Grouped AdaLN
  // with bpg > 1 also needs the per-group sums A, D [G, N] before the final step.
  const int64_t prows = (wk.grouped && wk.bpg == 1) ? wk.groups : nblocks;
  const bool need_a = p.dweight || (wk.grouped && p.dscale);
  const bool need_d = ((Tr::kLayer || Tr::kAda) && p.dbias) || (wk.grouped && (p.dscale || p.dshift));
  const bool group_sums = wk.grouped && wk.bpg > 1;
  wk.ld = ceil_div(p.n, 4) * 4;  // 16-byte partial rows for the reduction
  const int64_t slab = prows * wk.ld, gslab = group_sums ? wk.groups * wk.ld : 0;
  const int64_t stats_floats = split ? 4 * p.rows : 0;  // row_stats: float4 per row
  // (+16 bytes: the partial rows start on a 16-byte boundary whatever the caller's alignment)
  const size_t need =
      size_t((need_a ? slab + gslab : 0) + (need_d ? slab + gslab : 0) + stats_floats) * sizeof(float) + 16;
  if (workspace == nullptr) {
    *workspace_bytes = need;
    return Status::Ok();
  }
  if (*workspace_bytes < need)
    return Status::Invalid("norm backward: workspace too small: need " + std::to_string(need) + " bytes, got " +
                           std::to_string(*workspace_bytes));
  float* ws = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(workspace) + 15) & ~uintptr_t(15));
  float* ga = nullptr;
  float* gd = nullptr;
  if (need_a) {
    wk.part_a = ws;
    ws += slab;
    ga = group_sums ? ws : wk.part_a;
    ws += gslab;
  }
  if (need_d) {
    wk.part_d = ws;
    ws += slab;
    gd = group_sums ? ws : wk.part_d;
    ws += gslab;
  }

  const bool pdl = use_pdl(dev);
  Status s;
  if (split) {
    float4* row_stats = reinterpret_cast<float4*>(ws);
    wk.row_stats = row_stats;
    auto sk = norm_bwd_rowstats<T, kOp, kV>;
    const int64_t sgrid = std::min<int64_t>(p.rows, resident_blocks(sk, kBwdStreamTeam, dev));
    Launch ls(dim3(unsigned(sgrid)), dim3(kBwdStreamTeam), 0, stream, pdl);
    if (!(s = launched(ls(sk, p, row_stats), "norm backward (row statistics)")).ok()) return s;
  }
  Launch lb(dim3(unsigned(nblocks), unsigned(tiles)), dim3(pl.threads), smem, stream, pdl);
  s = launched(lb(kernel, p, wk, stages), "norm backward");
  if (!s.ok()) return s;
  const T* no_scale = nullptr;
  T* dw = static_cast<T*>(p.dweight);
  T* db = static_cast<T*>(p.dbias);
  if (!wk.grouped)  // dw = Σ A, db = Σ D over the blocks' partial rows
    return reduce_into<T, T>(wk.part_a, dw, wk.part_d, (Tr::kLayer || Tr::kAda) ? db : nullptr, p.n, wk.ld, nblocks, 1,
                             p.n, no_scale, 0, pdl, stream);
  // Grouped AdaLN without weight and bias (DiT-style): dscale_g = A_g and dshift_g = D_g, so the
  // per-group reduction writes them directly (one kernel instead of two).
  if (group_sums && !p.weight && !p.bias)
    return reduce_into<T, T>(p.dscale ? wk.part_a : nullptr, static_cast<T*>(p.dscale), p.dshift ? wk.part_d : nullptr,
                             static_cast<T*>(p.dshift), p.n, wk.ld, wk.bpg, wk.groups, p.n, no_scale, 0, pdl, stream);
  // Grouped AdaLN: per-group sums (when several blocks shared a group), then the parameter grads.
  if (group_sums) {
    s = reduce_into<float, T>(wk.part_a, ga, wk.part_d, gd, p.n, wk.ld, wk.bpg, wk.groups, wk.ld, no_scale, 0, pdl,
                              stream);
    if (!s.ok()) return s;
  }
  if (p.dscale || p.dshift) {
    const int64_t total = wk.groups * p.n;
    const int64_t grid = std::min<int64_t>(ceil_div(total, 256), int64_t(dev.sm_count) * 16);
    Launch lg(dim3(unsigned(grid)), dim3(256), 0, stream, pdl);
    const float* cga = ga;
    const float* cgd = gd;
    s = launched(lg(ada_group_grads<T>, cga, cgd, p.n, wk.ld, total, static_cast<const T*>(p.weight),
                    static_cast<const T*>(p.bias), static_cast<T*>(p.dscale), static_cast<T*>(p.dshift)),
                 "ada_norm backward (scale/shift)");
    if (!s.ok()) return s;
  }
  const T* sc = static_cast<const T*>(p.scale);
  return reduce_into<T, T>(ga, dw, gd, db, p.n, wk.ld, wk.groups, 1, p.n, sc, p.scale_stride, pdl, stream);
}

template <typename T>
Status launch_bwd(const NormPlan& pl, NormOp op, const NormParams& p, const DeviceInfo& dev, void* workspace,
                  size_t* workspace_bytes, cudaStream_t stream) {
  return with_op(
      op, [&](auto opc) { return bwd<T, decltype(opc)::value>(pl, p, dev, workspace, workspace_bytes, stream); });
}

}  // namespace norm_detail
}  // namespace kernelforge
