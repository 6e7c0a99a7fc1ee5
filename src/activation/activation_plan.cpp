// The activation planner (see activation_plan.h): vector width from the alignment, vectors per
// thread from kActVecs, the grid from the row length and count.
#include "activation/activation_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

// Vectors per thread of the plan production runs, by kernel and access width ("wide" = 16-byte
// vectors; "narrow" = 4-byte or one-element accesses).
struct ActVecsRow {
  ActKernel kind;
  bool wide;
  int vecs;
};
constexpr ActVecsRow kActVecs[] = {
    // One 16-byte vector per input per thread (2 loads in flight, 8 blocks of 256 threads per SM:
    // 64 KB per SM, several times the ~14 KB Little's law asks at 3 TB/s). On the H100 (bf16
    // silu_and_mul, 16384 x I = 2048 / 4096 / 8192, L2 flushed) 1 vector takes 71.5 / 136.1 / 266.9 us
    // and 4 vectors 72.3 / 137.4 / 268.9: the shorter blocks fill the last wave better.
    {ActKernel::kFwd, true, 1},
    // Narrow accesses move fewer bytes each: 8 of them per thread keep the bytes in flight up.
    {ActKernel::kFwd, false, 8},
    // Backward: 3 inputs, so 2 vectors each put 6 x 16 B loads in flight per thread.
    {ActKernel::kBwd, true, 2},
    {ActKernel::kBwd, false, 4},
    // Bias gradient: 4 rows of dy and x per thread, 8 x 16 B loads in flight (the backward's 6 plus a
    // margin for the adds between rows); narrow accesses 8 rows.
    {ActKernel::kBiasGrad, true, 4},
    {ActKernel::kBiasGrad, false, 8},
};

// A problem smaller than one wave of blocks (decode rows) is latency-bound: the per-thread chain of
// `vecs` activations is the kernel's time, so the 16-byte path then takes one vector per thread
// (1 x 4096 bf16 backward: 2 blocks of 256 threads instead of 1 block of 256 x 2 vectors). On the
// H100 under CUDA-graph replay this brought silu_and_mul at 1 x 4096 / 64 x 4096 from 1.51 / 1.98 us
// to 1.21 / 1.51 us (with 4 forward vectors per thread then; torch's own copy_ of the row: 1.20 us).
constexpr int kActOneWaveVecs = 1;

// The vectors-per-thread values the kernels are built for (activation_launch.cuh instantiates
// exactly these): the kActVecs rows, the one-wave value, 4 forward vectors on the 16-byte path
// (the forward's previous value, kept as a candidate for sweeps and tests) and 2 bias-gradient rows
// on the 16-byte path (half the registers: a candidate to measure).
struct ActBuild {
  ActKernel kind;
  bool wide;
  int vecs;
};
constexpr ActBuild kActBuilds[] = {
    {ActKernel::kFwd, true, 1},      {ActKernel::kFwd, true, 4},      {ActKernel::kFwd, false, 8},
    {ActKernel::kBwd, true, 1},      {ActKernel::kBwd, true, 2},      {ActKernel::kBwd, false, 4},
    {ActKernel::kBiasGrad, true, 2}, {ActKernel::kBiasGrad, true, 4}, {ActKernel::kBiasGrad, false, 8},
};

bool is_built(ActKernel kind, bool wide, int vecs) {
  for (const ActBuild& b : kActBuilds)
    if (b.kind == kind && b.wide == wide && b.vecs == vecs) return true;
  return false;
}

int table_vecs(ActKernel kind, bool wide) {
  for (const ActVecsRow& r : kActVecs)
    if (r.kind == kind && r.wide == wide) return r.vecs;
  return 1;
}

ActKernel kind_of(const ActProblem& pr) {
  if (pr.bias_grad) return ActKernel::kBiasGrad;
  return pr.backward ? ActKernel::kBwd : ActKernel::kFwd;
}

// The grid of `vec`-element vectors, `vecs` per thread: tx covers a row's vectors in `vecs` passes
// (32..256 threads, a power of two), ty = 256 / tx rows per block (fewer when there are fewer rows),
// one block column per tx * vecs vectors of a row.
ActPlan with_grid(ActKernel kind, int vec, int vecs, const ActProblem& pr) {
  const int64_t nv = ceil_div(pr.n, vec);
  ActPlan plan;
  plan.kind = kind;
  plan.vec = vec;
  plan.vecs = vecs;
  plan.tx = std::max(32, pow2_ceil(std::min<int64_t>(ceil_div(nv, vecs), kActThreads)));
  plan.ty = std::min(kActThreads / plan.tx, pow2_ceil(std::min<int64_t>(pr.rows, kActThreads)));
  plan.grid_x = int(ceil_div(nv, int64_t(plan.tx) * vecs));
  plan.grid_y = int(std::min<int64_t>(ceil_div(pr.rows, plan.ty), kActMaxGridY));
  return plan;
}

// The bias gradient's grid: strips of kActBiasTx vectors by the size-fixed row chunks; `rows` rows'
// vectors in flight per thread.
ActPlan with_bias_grid(int vec, int rows, const ActProblem& pr) {
  ActPlan plan;
  plan.kind = ActKernel::kBiasGrad;
  plan.vec = vec;
  plan.vecs = rows;
  plan.tx = kActBiasTx;
  plan.ty = kActBiasTy;
  plan.grid_x = int(ceil_div(ceil_div(pr.n, vec), int64_t(kActBiasTx)));
  act_bias_chunking(pr.rows, pr.n, &plan.grid_y, &plan.chunk_rows);
  return plan;
}

ActPlan grid_for(ActKernel kind, int vec, int vecs, const ActProblem& pr) {
  return kind == ActKernel::kBiasGrad ? with_bias_grid(vec, vecs, pr) : with_grid(kind, vec, vecs, pr);
}

// The widest access (bytes) the problem's alignment allows: the planner's choice, with no allocation
// on the call path.
int widest(const ActProblem& pr) {
  if (pr.align_bytes >= 16) return 16;
  return pr.elem_bytes == 2 && pr.align_bytes >= 4 ? 4 : pr.elem_bytes;
}

// Every access width (bytes) the problem's alignment allows, widest first (candidates, check_plan).
std::vector<int> widths(const ActProblem& pr) {
  std::vector<int> w;
  if (pr.align_bytes >= 16) w.push_back(16);
  if (pr.elem_bytes == 2 && pr.align_bytes >= 4) w.push_back(4);
  w.push_back(pr.elem_bytes);
  return w;
}

bool same_plan(const ActPlan& a, const ActPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.vecs == b.vecs && a.tx == b.tx && a.ty == b.ty &&
         a.grid_x == b.grid_x && a.grid_y == b.grid_y && a.chunk_rows == b.chunk_rows;
}

}  // namespace

std::string to_string(const ActPlan& plan) {
  std::string s;
  switch (plan.kind) {
    case ActKernel::kFwd:
      s = "act_fwd";
      break;
    case ActKernel::kBwd:
      s = "act_bwd";
      break;
    case ActKernel::kBiasGrad:
      s = "act_bias_grad";
      break;
    default:
      s = "act_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  s += " vec=" + std::to_string(plan.vec) + " vecs=" + std::to_string(plan.vecs) + " block=" + std::to_string(plan.tx) +
       "x" + std::to_string(plan.ty) + " grid=" + std::to_string(plan.grid_x) + "x" + std::to_string(plan.grid_y);
  if (plan.kind == ActKernel::kBiasGrad) s += " chunk=" + std::to_string(plan.chunk_rows);
  return s;
}

bool act_empty(const ActProblem& pr) { return pr.n <= 0 || (!pr.bias_grad && pr.rows <= 0); }

// Chunks for about kActBiasTargetBlocks blocks at a nominal strip of kActBiasNominalTile columns, at
// most kActBiasMaxChunks, of at least kActBiasMinChunkRows rows; then as few chunks as cover the rows
// at that many rows each.
void act_bias_chunking(int64_t rows, int64_t n, int* chunks, int64_t* chunk_rows) {
  if (rows <= 0) {
    *chunks = 0;
    *chunk_rows = 1;
    return;
  }
  const int64_t tiles = std::max<int64_t>(1, ceil_div(n, kActBiasNominalTile));
  int64_t c = std::min<int64_t>(std::max<int64_t>(1, ceil_div(kActBiasTargetBlocks, tiles)), kActBiasMaxChunks);
  c = std::min<int64_t>(c, std::max<int64_t>(1, ceil_div(rows, kActBiasMinChunkRows)));
  const int64_t per = ceil_div(rows, c);
  *chunk_rows = per;
  *chunks = int(ceil_div(rows, per));
}

int64_t act_bias_workspace_floats(int64_t rows, int64_t n) {
  int chunks = 0;
  int64_t per = 1;
  act_bias_chunking(rows, n, &chunks, &per);
  return int64_t(chunks) * std::max<int64_t>(n, 0);
}

// Widest access (bytes) that every base pointer and row stride allows: 16, 4 (16-bit types) or the
// element size. Null pointers (absent tensors) and zero strides do not constrain it; with one row
// the strides are never used.
ActProblem make_act_problem(const ActParams& p, bool backward, int elem_bytes) {
  // (dbias is written element by element: it does not constrain the width)
  uintptr_t bits = reinterpret_cast<uintptr_t>(p.a) | reinterpret_cast<uintptr_t>(p.b);
  int64_t strides = p.a_stride | p.b_stride;
  if (backward) {
    bits |= reinterpret_cast<uintptr_t>(p.dy) | reinterpret_cast<uintptr_t>(p.da) | reinterpret_cast<uintptr_t>(p.db);
    strides |= p.dy_stride | p.da_stride | p.db_stride;
  } else {
    bits |= reinterpret_cast<uintptr_t>(p.y);
    strides |= p.y_stride;
  }
  if (p.rows > 1) bits |= static_cast<uintptr_t>(strides) * uintptr_t(elem_bytes);
  ActProblem pr;
  pr.backward = backward;
  pr.bias_grad = backward && p.dbias != nullptr;
  pr.elem_bytes = elem_bytes;
  pr.rows = p.rows;
  pr.n = p.n;
  pr.align_bytes = bits % 16 == 0 ? 16 : (elem_bytes < 4 && bits % 4 == 0) ? 4 : elem_bytes;
  return pr;
}

ActPlan plan_activation(const ActProblem& pr, const DeviceInfo& dev) {
  const ActKernel kind = kind_of(pr);
  const int bytes = widest(pr);
  const bool wide = bytes == 16;
  const int vec = bytes / pr.elem_bytes;
  if (kind == ActKernel::kBiasGrad) return with_bias_grid(vec, table_vecs(kind, wide), pr);
  const ActPlan plan = with_grid(kind, vec, table_vecs(kind, wide), pr);
  if (wide && plan.vecs > kActOneWaveVecs && int64_t(plan.grid_x) * plan.grid_y < dev.sm_count)
    return with_grid(kind, vec, kActOneWaveVecs, pr);
  return plan;
}

std::vector<ActPlan> candidate_plans(const ActProblem& pr, const DeviceInfo& dev) {
  std::vector<ActPlan> plans;
  if (act_empty(pr)) return plans;
  plans.push_back(plan_activation(pr, dev));
  const ActKernel kind = kind_of(pr);
  for (int bytes : widths(pr))
    for (const ActBuild& b : kActBuilds) {
      if (b.kind != kind || b.wide != (bytes == 16)) continue;
      const ActPlan plan = grid_for(kind, bytes / pr.elem_bytes, b.vecs, pr);
      bool seen = false;
      for (const ActPlan& q : plans) seen = seen || same_plan(q, plan);
      if (!seen) plans.push_back(plan);
    }
  return plans;
}

Status check_plan(const ActPlan& plan, const ActProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) {
    return Status::Invalid("activation plan " + to_string(plan) + ": " + why);
  };
  if (plan.kind != ActKernel::kFwd && plan.kind != ActKernel::kBwd && plan.kind != ActKernel::kBiasGrad)
    return fail("unknown kernel");
  if (act_empty(pr)) return fail("the problem is empty: nothing to launch");
  if (plan.kind != kind_of(pr))
    return fail(std::string("the problem is a ") +
                (pr.bias_grad  ? "bias-gradient"
                 : pr.backward ? "backward"
                               : "forward") +
                " call");
  const int64_t bytes = int64_t(plan.vec) * pr.elem_bytes;
  const std::vector<int> w = widths(pr);
  if (plan.vec < 1 || std::find(w.begin(), w.end(), bytes) == w.end())
    return fail("vectors of " + std::to_string(bytes) + " bytes do not fit rows aligned to " +
                std::to_string(pr.align_bytes) + " bytes");
  if (!is_built(plan.kind, bytes == 16, plan.vecs))
    return fail("the kernel is not built for " + std::to_string(plan.vecs) + " vectors per thread at this width");
  if (plan.kind == ActKernel::kBiasGrad) {
    if (plan.tx != kActBiasTx || plan.ty != kActBiasTy)
      return fail("the bias-gradient block is " + std::to_string(kActBiasTx) + "x" + std::to_string(kActBiasTy));
    if (plan.grid_x < 1 || int64_t(plan.grid_x) * plan.tx < ceil_div(pr.n, plan.vec))
      return fail("the grid does not cover the row's " + std::to_string(ceil_div(pr.n, plan.vec)) + " vectors");
    int chunks = 0;
    int64_t chunk_rows = 1;
    act_bias_chunking(pr.rows, pr.n, &chunks, &chunk_rows);
    if (plan.grid_y != chunks || plan.chunk_rows != chunk_rows)
      return fail("the row chunks must be the sizes' " + std::to_string(chunks) + " x " + std::to_string(chunk_rows) +
                  " rows (the workspace and the summation order follow them)");
    return Status::Ok();
  }
  if (plan.tx < 32 || plan.tx > kActThreads || (plan.tx & (plan.tx - 1)) != 0)
    return fail("tx must be a power of two in 32..256");
  if (plan.ty < 1 || plan.tx * plan.ty > kActThreads) return fail("a block holds at most 256 threads");
  if (plan.grid_x < 1 || int64_t(plan.grid_x) * plan.tx * plan.vecs < ceil_div(pr.n, plan.vec))
    return fail("the grid does not cover the row's " + std::to_string(ceil_div(pr.n, plan.vec)) + " vectors");
  if (plan.grid_y < 1 || plan.grid_y > kActMaxGridY) return fail("grid_y must be in 1..65535");
  return Status::Ok();
}

}  // namespace kernelforge
