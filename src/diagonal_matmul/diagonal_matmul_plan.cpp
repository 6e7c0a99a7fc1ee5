// The diagonal_matmul planner (see diagonal_matmul_plan.h): access width from the alignment, vectors
// per thread from kDmVecs, the block and grid from the row length and count.
#include "diagonal_matmul/diagonal_matmul_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

// Vectors per thread of the plan production runs, by kernel and access width ("wide" = 16-byte
// vectors; "narrow" = 4-byte or one-element accesses).
struct DmVecsRow {
  DmKernel kind;
  bool wide;
  int vecs;
};
constexpr DmVecsRow kDmVecs[] = {
    // Forward, 16-byte vectors: 2 per thread. Measured on the H200 (dev/sweep_diagonal_matmul, bf16,
    // % of a copy of the same bytes): 16384x4096 96.2 % with 2, 94.2 % with 4, 88.0 % with 1;
    // 4096x4096 94.8 / 91.9 / 89.4 %; 8x2048x2048 96.1 / 94.5 / 88.4 %. One vector per thread leaves
    // the per-row work (64-bit offsets, the a index, the scalar head) on every 16 bytes.
    {DmKernel::kFwd, true, 2},
    // Narrow accesses move 4 or 2 bytes each: 4 of them per thread keep some bytes in flight.
    {DmKernel::kFwd, false, 4},
    // Backward, 16-byte vectors: a team loops over its row with 4 vectors each of dy and b per pass.
    // Measured on the H200 (bf16): 16384x4096 98.0 % with 4 against 89.1 % with 2; 4096x4096 91.1
    // against 84.3 %; 8x2048x2048 94.0 against 86.3 %.
    {DmKernel::kBwd, true, 4},
    {DmKernel::kBwd, false, 4},
};

// The (kernel, width, vectors per thread) the launcher builds: the rows of kDmVecs and the
// alternatives candidate_plans offers for measurement (dev/sweep_diagonal_matmul.cu). More vectors
// per thread spread the per-row work (64-bit row offsets, the a index, the scalar head) over more
// bytes; the forward's rows per thread are a grid choice (grid_y), not an instantiation.
constexpr DmVecsRow kDmBuilds[] = {
    {DmKernel::kFwd, true, 1}, {DmKernel::kFwd, true, 2}, {DmKernel::kFwd, true, 4},  {DmKernel::kFwd, false, 4},
    {DmKernel::kBwd, true, 2}, {DmKernel::kBwd, true, 4}, {DmKernel::kBwd, false, 4},
};

// The forward candidates that give each thread this many rows (grid_y cut by it; the kernel loops).
constexpr int kDmFwdRowsPerThread = 4;

int table_vecs(DmKernel kind, bool wide) {
  for (const DmVecsRow& r : kDmVecs)
    if (r.kind == kind && r.wide == wide) return r.vecs;
  return 1;
}

bool is_built(DmKernel kind, bool wide, int vecs) {
  for (const DmVecsRow& r : kDmBuilds)
    if (r.kind == kind && r.wide == wide && r.vecs == vecs) return true;
  return false;
}

DmKernel kind_of(const DmProblem& pr) { return pr.backward ? DmKernel::kBwd : DmKernel::kFwd; }

// The block and grid for `vec`-element vectors, `vecs` per thread: tx threads cover a row's vectors in
// `vecs` passes (dm_fwd) or per loop pass (dm_bwd) (a power of two, 1..256), ty rows per block fill
// the block up to 256 threads (fewer when there are fewer rows, but at least a warp).
DmPlan with_grid(const DmProblem& pr, int vec, int vecs) {
  const int64_t nv = ceil_div(pr.n, vec);
  DmPlan plan;
  plan.kind = kind_of(pr);
  plan.vec = vec;
  plan.vecs = vecs;
  plan.tx = pow2_ceil(std::min<int64_t>(ceil_div(nv, vecs), kDmThreads));
  const int fill = kDmThreads / plan.tx, warp = std::max(1, 32 / plan.tx);
  plan.ty = std::min(fill, std::max(warp, pow2_ceil(std::min<int64_t>(pr.rows, kDmThreads))));
  if (plan.kind == DmKernel::kFwd) {
    plan.grid_x = int(ceil_div(nv, int64_t(plan.tx) * vecs));
    plan.grid_y = int(std::min<int64_t>(ceil_div(pr.rows, plan.ty), kDmMaxGridY));
  } else {
    plan.grid_x = int(std::min<int64_t>(ceil_div(pr.rows, plan.ty), kDmMaxGrid));
    plan.grid_y = 1;
    plan.db = pr.db;
    if (pr.reduce) plan.reduce_grid = int(std::min<int64_t>(ceil_div(pr.a_rows, kDmReduceRowsPerBlock), kDmMaxGrid));
  }
  return plan;
}

// The widest access (bytes) the problem's alignment allows: the planner's choice.
int widest(const DmProblem& pr) {
  if (pr.align_bytes >= 16) return 16;
  return pr.elem_bytes == 2 && pr.align_bytes >= 4 ? 4 : pr.elem_bytes;
}

// Every access width (bytes) the problem's alignment allows, widest first (candidates, check_plan).
std::vector<int> widths(const DmProblem& pr) {
  std::vector<int> w;
  if (pr.align_bytes >= 16) w.push_back(16);
  if (pr.elem_bytes == 2 && pr.align_bytes >= 4) w.push_back(4);
  w.push_back(pr.elem_bytes);
  return w;
}

bool same_plan(const DmPlan& a, const DmPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.vecs == b.vecs && a.tx == b.tx && a.ty == b.ty &&
         a.grid_x == b.grid_x && a.grid_y == b.grid_y && a.db == b.db && a.reduce_grid == b.reduce_grid;
}

}  // namespace

std::string to_string(const DmPlan& plan) {
  std::string s;
  switch (plan.kind) {
    case DmKernel::kFwd:
      s = "dm_fwd";
      break;
    case DmKernel::kBwd:
      s = "dm_bwd";
      break;
    default:
      s = "dm_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  s += " vec=" + std::to_string(plan.vec) + " vecs=" + std::to_string(plan.vecs) + " block=" + std::to_string(plan.tx) +
       "x" + std::to_string(plan.ty) + " grid=" + std::to_string(plan.grid_x);
  if (plan.kind == DmKernel::kFwd) s += "x" + std::to_string(plan.grid_y);
  if (plan.db) s += " db";
  if (plan.reduce_grid > 0) s += " + dm_reduce grid=" + std::to_string(plan.reduce_grid);
  return s;
}

// Widest access (bytes) at which the row tensors the kernel touches share their misalignment: their
// base pointers, and with more than one row their row strides (in bytes), differ by multiples of it.
// Null pointers (absent tensors) do not constrain it.
DmProblem make_dm_problem(const DmParams& p, bool backward, int elem_bytes) {
  const void* lead = backward ? p.dy : p.b;
  const void* ptrs[] = {p.b, p.y, p.dy, p.db};
  const int64_t lead_stride = backward ? p.dy_stride : p.b_stride;
  const int64_t strides[] = {p.b_stride, p.y_stride, p.dy_stride, p.db_stride};
  const bool used[] = {true, !backward, backward, backward && p.db != nullptr};
  uintptr_t bits = 0;
  for (int k = 0; k < 4; ++k) {
    if (!used[k] || ptrs[k] == nullptr) continue;
    bits |= reinterpret_cast<uintptr_t>(ptrs[k]) - reinterpret_cast<uintptr_t>(lead);
    if (p.rows > 1) bits |= static_cast<uintptr_t>((strides[k] - lead_stride) * elem_bytes);
  }
  DmProblem pr;
  pr.backward = backward;
  pr.db = backward && p.db != nullptr;
  pr.reduce = backward && p.da_rows != nullptr;
  pr.elem_bytes = elem_bytes;
  pr.rows = p.rows;
  pr.n = p.n;
  pr.a_rows = p.a_rows;
  pr.align_bytes = bits % 16 == 0 ? 16 : (elem_bytes < 4 && bits % 4 == 0) ? 4 : elem_bytes;
  return pr;
}

bool dm_has_work(const DmProblem& pr) {
  if (!pr.backward) return pr.rows > 0 && pr.n > 0;
  return pr.rows > 0 || (pr.reduce && pr.a_rows > 0);
}

DmPlan plan_diagonal_matmul(const DmProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  const int bytes = widest(pr);
  return with_grid(pr, bytes / pr.elem_bytes, table_vecs(kind_of(pr), bytes == 16));
}

std::vector<DmPlan> candidate_plans(const DmProblem& pr, const DeviceInfo& dev) {
  std::vector<DmPlan> plans;
  if (!dm_has_work(pr)) return plans;
  auto add = [&](const DmPlan& plan) {
    for (const DmPlan& q : plans)
      if (same_plan(q, plan)) return;
    plans.push_back(plan);
  };
  add(plan_diagonal_matmul(pr, dev));
  const DmKernel kind = kind_of(pr);
  for (int bytes : widths(pr)) {
    for (const DmVecsRow& b : kDmBuilds) {
      if (b.kind != kind || b.wide != (bytes == 16)) continue;
      DmPlan plan = with_grid(pr, bytes / pr.elem_bytes, b.vecs);
      add(plan);
      if (kind == DmKernel::kFwd && plan.grid_y > 1) {  // several rows per thread
        plan.grid_y = int(ceil_div(int64_t(plan.grid_y), int64_t(kDmFwdRowsPerThread)));
        add(plan);
      }
    }
  }
  return plans;
}

Status check_plan(const DmPlan& plan, const DmProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) {
    return Status::Invalid("diagonal_matmul plan " + to_string(plan) + ": " + why);
  };
  if (plan.kind != DmKernel::kFwd && plan.kind != DmKernel::kBwd) return fail("unknown kernel");
  if (!dm_has_work(pr)) return fail("the problem is empty: nothing to launch");
  if (plan.kind != kind_of(pr))
    return fail(std::string("the problem is a ") + (pr.backward ? "dm_bwd" : "dm_fwd") + " call");
  const int64_t bytes = int64_t(plan.vec) * pr.elem_bytes;
  const std::vector<int> w = widths(pr);
  if (plan.vec < 1 || std::find(w.begin(), w.end(), bytes) == w.end())
    return fail("vectors of " + std::to_string(bytes) + " bytes do not fit rows that share their alignment only to " +
                std::to_string(pr.align_bytes) + " bytes");
  if (!is_built(plan.kind, bytes == 16, plan.vecs))
    return fail("the kernel is not built for " + std::to_string(plan.vecs) + " vectors per thread at this width");
  if (plan.tx < 1 || plan.tx > kDmThreads || (plan.tx & (plan.tx - 1)) != 0)
    return fail("tx must be a power of two in 1..256");
  if (plan.ty < 1 || plan.tx * plan.ty > kDmThreads || (plan.tx * plan.ty) % 32 != 0)
    return fail("a block holds a multiple of 32 threads, at most 256");
  const int64_t nv = ceil_div(pr.n, plan.vec);
  if (plan.kind == DmKernel::kFwd) {
    if (plan.grid_x < 1 || int64_t(plan.grid_x) * plan.tx * plan.vecs < nv)
      return fail("the grid does not cover the row's " + std::to_string(nv) + " vectors");
    if (plan.grid_y < 1 || plan.grid_y > kDmMaxGridY) return fail("grid_y must be in 1..65535");
    if (plan.db || plan.reduce_grid != 0) return fail("dm_fwd has no db or dm_reduce part");
  } else {
    if (plan.grid_x < (pr.rows > 0 ? 1 : 0) || plan.grid_x > kDmMaxGrid || (pr.rows == 0 && plan.grid_x != 0))
      return fail("grid must be in 1.." + std::to_string(kDmMaxGrid) + " (0 without rows)");
    if (plan.grid_y != 1) return fail("dm_bwd runs on a 1-D grid");
    if (plan.db != pr.db) return fail(pr.db ? "the call wants db" : "the call has no db");
    if (pr.reduce != (plan.reduce_grid > 0) || plan.reduce_grid > kDmMaxGrid)
      return fail(pr.reduce ? "a broadcast a needs dm_reduce (reduce_grid in 1.." + std::to_string(kDmMaxGrid) + ")"
                            : "a per-row a has no dm_reduce");
  }
  return Status::Ok();
}

}  // namespace kernelforge
