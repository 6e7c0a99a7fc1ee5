// The fused_linear_rowsum planner (see fused_linear_rowsum_plan.h): access width from the alignment,
// row chunks from the sizes, grids from the sizes and the width.
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

int64_t pass_rows(const FlrsProblem& pr) { return pr.kind == FlrsKernel::kForward ? pr.o : pr.tokens; }

FlrsPlan with_grid(const FlrsProblem& pr, int vec, int chunks, int64_t chunk_rows, int col_rows = kFlrsRowsInFlight,
                   int dot_rows = kFlrsDotRows) {
  FlrsPlan plan;
  plan.kind = pr.kind;
  plan.vec = vec;
  plan.col_rows = col_rows;
  plan.dot_rows = dot_rows;
  plan.grid_x = int(std::max<int64_t>(1, ceil_div(pr.k, int64_t(kFlrsColTx) * vec)));
  plan.chunks = chunks;
  plan.chunk_rows = chunk_rows;
  switch (pr.kind) {
    case FlrsKernel::kForward:
      plan.reduce_blocks = int(ceil_div(pr.k + 1, kFlrsReduceTx));
      plan.final_blocks = ceil_div(pr.tokens, int64_t(kFlrsDotWarps) * dot_rows);
      break;
    case FlrsKernel::kBackward:
      plan.reduce_blocks = int(ceil_div(pr.k + 1, kFlrsReduceTx));
      plan.final_blocks = std::min<int64_t>(ceil_div(pr.o, int64_t(kFlrsBcastTy) * kFlrsBcastRows), kFlrsMaxGridY);
      break;
    case FlrsKernel::kBackwardDx:
      plan.reduce_blocks = 0;
      plan.final_blocks = 0;
      break;
  }
  return plan;
}

// Every access width (bytes) the alignment allows, widest first.
std::vector<int> widths(const FlrsProblem& pr) {
  std::vector<int> w;
  if (pr.align_bytes >= 16 && pr.elem_bytes < 16) w.push_back(16);
  w.push_back(pr.elem_bytes);
  return w;
}

bool same_plan(const FlrsPlan& a, const FlrsPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.grid_x == b.grid_x && a.chunks == b.chunks &&
         a.chunk_rows == b.chunk_rows && a.col_rows == b.col_rows && a.reduce_blocks == b.reduce_blocks &&
         a.final_blocks == b.final_blocks && a.dot_rows == b.dot_rows;
}

template <size_t N>
bool built(const int (&table)[N], int v) {
  for (int t : table)
    if (t == v) return true;
  return false;
}

}  // namespace

std::string to_string(const FlrsPlan& plan) {
  std::string s;
  switch (plan.kind) {
    case FlrsKernel::kForward:
      s = "flrs_fwd";
      break;
    case FlrsKernel::kBackward:
      s = "flrs_bwd";
      break;
    case FlrsKernel::kBackwardDx:
      s = "flrs_bwd_dx";
      break;
    default:
      s = "flrs_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  s += " vec=" + std::to_string(plan.vec) + " cols=" + std::to_string(plan.grid_x) +
       " chunks=" + std::to_string(plan.chunks) + "x" + std::to_string(plan.chunk_rows) +
       " inflight=" + std::to_string(plan.col_rows);
  if (plan.kind == FlrsKernel::kForward)
    s += " reduce=" + std::to_string(plan.reduce_blocks) + " dot=" + std::to_string(plan.final_blocks) + "x" +
         std::to_string(plan.dot_rows);
  if (plan.kind == FlrsKernel::kBackward)
    s += " reduce=" + std::to_string(plan.reduce_blocks) + " bcast=" + std::to_string(plan.final_blocks);
  return s;
}

void flrs_chunking(int64_t rows, int64_t k, int* chunks, int64_t* chunk_rows) {
  const int64_t tiles = std::max<int64_t>(1, ceil_div(k, kFlrsNominalTile));
  int64_t c = std::min<int64_t>(std::max<int64_t>(1, ceil_div(kFlrsTargetBlocks, tiles)), kFlrsMaxChunks);
  c = std::min<int64_t>(c, std::max<int64_t>(1, ceil_div(rows, kFlrsMinChunkRows)));
  const int64_t per = std::max<int64_t>(1, ceil_div(rows, c));
  *chunk_rows = per;
  *chunks = int(std::max<int64_t>(1, ceil_div(rows, per)));
}

int64_t flrs_workspace_floats(int64_t tokens, int64_t k, int64_t o) {
  int cf = 1, cb = 1;
  int64_t rf = 1, rb = 1;
  flrs_chunking(o, k, &cf, &rf);
  flrs_chunking(tokens, k, &cb, &rb);
  return flrs_partial_floats(std::max(cf, cb), k) + flrs_partial_floats(1, k);
}

// Widest access (bytes) the call allows. Row tensors do not constrain it: the passes read rows at any
// alignment in 16-byte loads (shifted, kernels/row_cols.cuh) and store 16 bytes wide on 16-byte
// aligned rows, element by element on the others. Only the forward's w_sum does: row_dot reads it
// kVec floats at a time (float4) at columns that are multiples of kVec.
FlrsProblem make_flrs_problem(const FlrsParams& p, bool backward, int elem_bytes) {
  FlrsProblem pr;
  pr.elem_bytes = elem_bytes;
  pr.tokens = p.tokens;
  pr.k = p.k;
  pr.o = p.o;
  if (!backward) {
    pr.kind = FlrsKernel::kForward;
    pr.align_bytes = reinterpret_cast<uintptr_t>(p.w_sum) % 16 == 0 ? 16 : elem_bytes;
  } else {
    pr.kind = (p.o > 0 && (p.dw != nullptr || p.db != nullptr)) ? FlrsKernel::kBackward : FlrsKernel::kBackwardDx;
    pr.align_bytes = 16;
  }
  return pr;
}

bool flrs_has_work(const FlrsProblem& pr, const FlrsParams& p) {
  switch (pr.kind) {
    case FlrsKernel::kForward:
      return pr.tokens > 0;
    case FlrsKernel::kBackward:
      return true;  // dweight / dbias hold O > 0 rows (zeros when T == 0)
    case FlrsKernel::kBackwardDx:
      return p.dx != nullptr && pr.tokens > 0 && pr.k > 0;
  }
  return false;
}

FlrsPlan plan_fused_linear_rowsum(const FlrsProblem& pr, const DeviceInfo& dev) {
  (void)dev;  // the plan is a function of the problem only (see the header)
  int chunks = 1;
  int64_t chunk_rows = 1;
  flrs_chunking(pass_rows(pr), pr.k, &chunks, &chunk_rows);
  return with_grid(pr, widths(pr).front() / pr.elem_bytes, chunks, chunk_rows);
}

std::vector<FlrsPlan> candidate_plans(const FlrsProblem& pr, const DeviceInfo& dev) {
  std::vector<FlrsPlan> plans;
  auto add = [&](const FlrsPlan& plan) {
    for (const FlrsPlan& q : plans)
      if (same_plan(q, plan)) return;
    plans.push_back(plan);
  };
  add(plan_fused_linear_rowsum(pr, dev));
  const int64_t rows = pass_rows(pr);
  int chunks = 1;
  int64_t chunk_rows = 1;
  flrs_chunking(rows, pr.k, &chunks, &chunk_rows);
  const bool fwd = pr.kind == FlrsKernel::kForward;
  for (int bytes : widths(pr)) {
    const int vec = bytes / pr.elem_bytes;
    for (int col_rows : kFlrsColRowsBuilt)
      for (int dot_rows : kFlrsDotRowsBuilt)
        if (fwd || dot_rows == kFlrsDotRows) add(with_grid(pr, vec, chunks, chunk_rows, col_rows, dot_rows));
    add(with_grid(pr, vec, 1, std::max<int64_t>(1, rows)));
  }
  return plans;
}

Status check_plan(const FlrsPlan& plan, const FlrsProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) {
    return Status::Invalid("fused_linear_rowsum plan " + to_string(plan) + ": " + why);
  };
  if (plan.kind != FlrsKernel::kForward && plan.kind != FlrsKernel::kBackward && plan.kind != FlrsKernel::kBackwardDx)
    return fail("unknown kernel");
  if (plan.kind != pr.kind) return fail("the problem needs another kernel sequence");
  const int64_t bytes = int64_t(plan.vec) * pr.elem_bytes;
  const std::vector<int> w = widths(pr);
  if (plan.vec < 1 || std::find(w.begin(), w.end(), bytes) == w.end())
    return fail("vectors of " + std::to_string(bytes) + " bytes do not fit pointers and strides aligned to " +
                std::to_string(pr.align_bytes) + " bytes");
  if (plan.grid_x < 1 || int64_t(plan.grid_x) * kFlrsColTx * plan.vec < pr.k)
    return fail("the column tiles do not cover the " + std::to_string(pr.k) + " columns");
  int planned = 1;
  int64_t planned_rows = 1;
  flrs_chunking(pass_rows(pr), pr.k, &planned, &planned_rows);
  if (plan.chunks < 1 || plan.chunks > planned || plan.chunks > kFlrsMaxGridY)
    return fail("chunks must be in 1.." + std::to_string(planned) + " (the workspace holds that many partial rows)");
  if (plan.chunk_rows < 1 || int64_t(plan.chunks) * plan.chunk_rows < pass_rows(pr))
    return fail("the chunks do not cover the " + std::to_string(pass_rows(pr)) + " rows");
  if (!built(kFlrsColRowsBuilt, plan.col_rows))
    return fail("the column pass is not built for " + std::to_string(plan.col_rows) + " rows in flight");
  if (!built(kFlrsDotRowsBuilt, plan.dot_rows))
    return fail("row_dot is not built for " + std::to_string(plan.dot_rows) + " rows per warp");
  if (plan.kind != FlrsKernel::kBackwardDx && int64_t(plan.reduce_blocks) * kFlrsReduceTx < pr.k + 1)
    return fail("the reduction blocks do not cover the K + 1 columns");
  if (plan.kind == FlrsKernel::kForward &&
      (plan.final_blocks * kFlrsDotWarps * plan.dot_rows < pr.tokens || plan.final_blocks > INT32_MAX))
    return fail("the row_dot blocks do not cover the " + std::to_string(pr.tokens) + " rows");
  if (plan.kind == FlrsKernel::kBackward && (plan.final_blocks < 1 || plan.final_blocks > kFlrsMaxGridY))
    return fail("the broadcast row groups must be in 1..65535");
  return Status::Ok();
}

}  // namespace kernelforge
