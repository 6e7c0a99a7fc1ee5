// The fused_linear_rowsum launcher: one switch over plan.kind, each kind a fixed sequence of launches
// (fused_linear_rowsum_plan.h). plan.vec (16-byte vectors or one element), plan.col_rows and
// plan.dot_rows pick the instantiation (kFlrsColRowsBuilt x kFlrsDotRowsBuilt); check_plan has
// accepted the plan before a launch. Included by fused_linear_rowsum_<dtype>.cu. With 16-byte vectors,
// a pass over rows that do not all start on a 16-byte boundary (base or row stride) runs the kShift
// instance of its kernel (shifted 16-byte loads, kernels/row_cols.cuh): same columns per thread, same
// sums, same bits; aligned calls keep the plain instance and its registers.
//
// Workspace (floats): partials [chunks, K + 1] at 0, then the reduced [K + 1] (g and sum dy; forward:
// only its element K, b_sum) at flrs_partial_floats(planned chunks, K).
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/kernels/broadcast_rows.cuh"
#include "fused_linear_rowsum/kernels/column_partials.cuh"
#include "fused_linear_rowsum/kernels/column_reduce.cuh"
#include "fused_linear_rowsum/kernels/row_dot.cuh"

namespace kernelforge {
namespace flrs_detail {

// Whether every row of a tensor (base, row stride in elements, rows) starts on a 16-byte boundary.
template <typename T>
bool rows_aligned(const void* base, int64_t stride, int64_t rows) {
  const uintptr_t bytes = rows > 1 ? uintptr_t(stride) * sizeof(T) : 0;
  return ((reinterpret_cast<uintptr_t>(base) | bytes) & 15) == 0;
}

// The column pass and row_dot instances for the rows they read: kShift only with 16-byte vectors.
template <typename T, int kVec, bool kBwd, bool kPartials, int kRows>
auto column_kernel(bool aligned) {
  if constexpr (kVec > 1)
    if (!aligned) return column_partials<T, kVec, kBwd, kPartials, kRows, true>;
  return column_partials<T, kVec, kBwd, kPartials, kRows, false>;
}
template <typename T, int kVec, int kRows>
auto dot_kernel(bool aligned) {
  if constexpr (kVec > 1)
    if (!aligned) return row_dot<T, kVec, kRows, true>;
  return row_dot<T, kVec, kRows, false>;
}

template <typename T, int kVec, int kColRows, int kDotRows>
Status run(const FlrsPlan& plan, const FlrsParams& p, bool pdl, float* ws, cudaStream_t stream) {
  const bool w_aligned = rows_aligned<T>(p.w, p.w_stride, p.o);
  const bool x_aligned = rows_aligned<T>(p.x, p.x_stride, p.tokens);
  float* partials = ws;
  float* sums = ws + flrs_workspace_floats(p.tokens, p.k, p.o) - flrs_partial_floats(1, p.k);
  const dim3 col_block(kFlrsColTx, kFlrsColTy);
  const dim3 col_grid(unsigned(plan.grid_x), unsigned(plan.chunks));
  const dim3 red_block(kFlrsReduceTx, kFlrsReduceTy);
  Status s;
  switch (plan.kind) {
    case FlrsKernel::kForward: {
      Launch a(col_grid, col_block, 0, stream, pdl);
      s = launched(a(column_kernel<T, kVec, false, true, kColRows>(w_aligned), p, plan.chunk_rows, partials),
                   "fused_linear_rowsum (weight column sums)");
      if (!s.ok()) return s;
      Launch b(dim3(unsigned(plan.reduce_blocks)), red_block, 0, stream, pdl);
      s = launched(b(column_reduce<T>, static_cast<const float*>(partials), plan.chunks, p.k, p.w_sum, sums + p.k),
                   "fused_linear_rowsum (chunk reduction)");
      if (!s.ok()) return s;
      Launch c(dim3(unsigned(plan.final_blocks)), dim3(kFlrsDotWarps * 32), 0, stream, pdl);
      return launched(c(dot_kernel<T, kVec, kDotRows>(x_aligned), p, static_cast<const float*>(sums + p.k)),
                      "fused_linear_rowsum (rows)");
    }
    case FlrsKernel::kBackward: {
      Launch a(col_grid, col_block, 0, stream, pdl);
      s = launched(a(column_kernel<T, kVec, true, true, kColRows>(x_aligned), p, plan.chunk_rows, partials),
                   "fused_linear_rowsum_backward (x pass)");
      if (!s.ok()) return s;
      Launch b(dim3(unsigned(plan.reduce_blocks)), red_block, 0, stream, pdl);
      s = launched(b(column_reduce<T>, static_cast<const float*>(partials), plan.chunks, p.k, sums, sums + p.k),
                   "fused_linear_rowsum_backward (chunk reduction)");
      if (!s.ok()) return s;
      const int64_t tiles = ceil_div(p.k, int64_t(kFlrsBcastTx) * kVec);
      Launch c(dim3(unsigned(tiles > 0 ? tiles : 1), unsigned(plan.final_blocks)), dim3(kFlrsBcastTx, kFlrsBcastTy), 0,
               stream, pdl);
      return launched(c(broadcast_rows<T, kVec>, p, static_cast<const float*>(sums)),
                      "fused_linear_rowsum_backward (weight and bias gradients)");
    }
    case FlrsKernel::kBackwardDx: {
      Launch a(col_grid, col_block, 0, stream, pdl);
      return launched(a(column_partials<T, kVec, true, false, kColRows, false>, p, plan.chunk_rows, partials),
                      "fused_linear_rowsum_backward (dx)");
    }
  }
  return Status::Invalid("fused_linear_rowsum: unknown kernel in plan " + to_string(plan));
}

// The run for the plan's (col_rows, dot_rows): the pairs of kFlrsColRowsBuilt x kFlrsDotRowsBuilt.
template <typename T, int kVec>
Status run_rows(const FlrsPlan& plan, const FlrsParams& p, bool pdl, float* ws, cudaStream_t stream) {
  if (plan.col_rows == 4 && plan.dot_rows == 4) return run<T, kVec, 4, 4>(plan, p, pdl, ws, stream);
  if (plan.col_rows == 8 && plan.dot_rows == 4) return run<T, kVec, 8, 4>(plan, p, pdl, ws, stream);
  if (plan.col_rows == 4 && plan.dot_rows == 2) return run<T, kVec, 4, 2>(plan, p, pdl, ws, stream);
  if (plan.col_rows == 8 && plan.dot_rows == 2) return run<T, kVec, 8, 2>(plan, p, pdl, ws, stream);
  return Status::Invalid("fused_linear_rowsum: no kernel built for " + to_string(plan));
}

}  // namespace flrs_detail

template <typename T>
Status launch_fused_linear_rowsum(const FlrsPlan& plan, const FlrsParams& p, const DeviceInfo& dev, float* workspace,
                                  cudaStream_t stream) {
  record_plan(plan);
  constexpr int kWide = 16 / int(sizeof(T));
  const bool pdl = use_pdl(dev);
  if (plan.vec == kWide) return flrs_detail::run_rows<T, kWide>(plan, p, pdl, workspace, stream);
  if (plan.vec == 1) return flrs_detail::run_rows<T, 1>(plan, p, pdl, workspace, stream);
  return Status::Invalid("fused_linear_rowsum: no kernel built for " + to_string(plan));
}

}  // namespace kernelforge
