// The dropout planner (see dropout_plan.h): the kernel from the alignment, items per thread from
// kDropUnroll, the grid from the item count.
#include "dropout/dropout_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

// Items per thread of the plan production runs, by kernel. Little's law at the H100's ~3 TB/s and
// ~1 us DRAM latency asks ~23 KB in flight per SM; with 2 x 16-byte loads per thread (4 with a
// residual) and 1536-2048 resident threads that is 48-128 KB. Two vectors also give each thread 2
// independent Philox chains to overlap (each is ~80 dependent integer instructions).
struct DropUnrollRow {
  DropKernel kind;
  int unroll;
};
constexpr DropUnrollRow kDropUnroll[] = {
    {DropKernel::kVec, 2}, {DropKernel::kScalar, 2},  // 16 element loads in flight, as 2 vectors of 8
};

// A problem smaller than one wave of blocks (decode-sized) is latency-bound: one item per thread
// spreads it over more blocks.
constexpr int kDropOneWaveUnroll = 1;

// The unrolls the kernels are built for (dropout_launch.cuh instantiates exactly these).
constexpr DropUnrollRow kDropBuilds[] = {
    {DropKernel::kVec, 1},    {DropKernel::kVec, 2},    {DropKernel::kVec, 4},
    {DropKernel::kScalar, 1}, {DropKernel::kScalar, 2},
};

constexpr int64_t kDropMaxGrid = int64_t(1) << 30;  // larger problems take the grid-stride loop

bool is_built(DropKernel kind, int unroll) {
  for (const DropUnrollRow& b : kDropBuilds)
    if (b.kind == kind && b.unroll == unroll) return true;
  return false;
}

int table_unroll(DropKernel kind) {
  for (const DropUnrollRow& r : kDropUnroll)
    if (r.kind == kind) return r.unroll;
  return 1;
}

// A vector (4 or 8 elements), or one Philox group of 8 elements.
int item_elems(DropKernel kind, int elem_bytes) { return kind == DropKernel::kVec ? 16 / elem_bytes : 8; }

int64_t items_of(DropKernel kind, const DropProblem& pr) { return ceil_div(pr.numel, item_elems(kind, pr.elem_bytes)); }

// The grid that covers the problem in one pass (capped at kDropMaxGrid).
DropPlan with_grid(DropKernel kind, int unroll, const DropProblem& pr) {
  DropPlan plan;
  plan.kind = kind;
  plan.vec = item_elems(kind, pr.elem_bytes);
  plan.unroll = unroll;
  plan.grid = int(std::min(ceil_div(items_of(kind, pr), int64_t(kDropThreads) * unroll), kDropMaxGrid));
  return plan;
}

bool same_plan(const DropPlan& a, const DropPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.unroll == b.unroll && a.grid == b.grid;
}

}  // namespace

std::string to_string(const DropPlan& plan) {
  std::string s;
  switch (plan.kind) {
    case DropKernel::kVec:
      s = "dropout_vec";
      break;
    case DropKernel::kScalar:
      s = "dropout_scalar";
      break;
    default:
      s = "dropout_unknown(" + std::to_string(int(plan.kind)) + ")";
  }
  return s + " vec=" + std::to_string(plan.vec) + " unroll=" + std::to_string(plan.unroll) +
         " grid=" + std::to_string(plan.grid);
}

// 16-byte vectors need every tensor pointer 16-byte aligned and the mask aligned to one vector's
// keep bytes (16 / sizeof(T)). Null pointers (absent tensors) do not constrain it.
DropProblem make_drop_problem(const DropParams& p, int elem_bytes) {
  const uintptr_t bits =
      reinterpret_cast<uintptr_t>(p.in) | reinterpret_cast<uintptr_t>(p.add) | reinterpret_cast<uintptr_t>(p.out);
  DropProblem pr;
  pr.elem_bytes = elem_bytes;
  pr.numel = p.numel;
  pr.vec_ok = bits % 16 == 0 && reinterpret_cast<uintptr_t>(p.mask) % uintptr_t(16 / elem_bytes) == 0;
  return pr;
}

DropPlan plan_dropout(const DropProblem& pr, const DeviceInfo& dev) {
  const DropKernel kind = pr.vec_ok ? DropKernel::kVec : DropKernel::kScalar;
  DropPlan plan = with_grid(kind, table_unroll(kind), pr);
  if (plan.unroll > kDropOneWaveUnroll && plan.grid < dev.sm_count) return with_grid(kind, kDropOneWaveUnroll, pr);
  // Past one resident wave the vector kernel runs as one wave with its grid-stride loop: measured on
  // the H200 (dev/sweep_dropout, bf16 16384x4096, unroll 2) 77.1 % of copy@size with 1056 blocks
  // against 72.8 % with 16384 (block launch and tail cost on a kernel that is Philox-bound).
  const int wave = dev.sm_count * std::max(1, dev.max_threads_per_sm / kDropThreads);
  if (kind == DropKernel::kVec && plan.grid > wave) plan.grid = wave;
  return plan;
}

std::vector<DropPlan> candidate_plans(const DropProblem& pr, const DeviceInfo& dev) {
  std::vector<DropPlan> plans;
  if (pr.numel <= 0) return plans;
  auto add = [&](const DropPlan& plan) {
    for (const DropPlan& q : plans)
      if (same_plan(q, plan)) return;
    plans.push_back(plan);
  };
  add(plan_dropout(pr, dev));
  for (const DropUnrollRow& b : kDropBuilds) {
    if (b.kind == DropKernel::kVec && !pr.vec_ok) continue;
    DropPlan plan = with_grid(b.kind, b.unroll, pr);
    const int cover = plan.grid;
    add(plan);
    // the grid-stride loop: one resident wave (every SM full), and one block per SM
    const int wave = dev.sm_count * std::max(1, dev.max_threads_per_sm / kDropThreads);
    plan.grid = std::max(1, std::min(cover, wave));
    add(plan);
    plan.grid = std::max(1, std::min(cover, dev.sm_count));
    add(plan);
  }
  return plans;
}

Status check_plan(const DropPlan& plan, const DropProblem& pr, const DeviceInfo& dev) {
  (void)dev;
  auto fail = [&](const std::string& why) { return Status::Invalid("dropout plan " + to_string(plan) + ": " + why); };
  if (plan.kind != DropKernel::kVec && plan.kind != DropKernel::kScalar) return fail("unknown kernel");
  if (pr.numel <= 0) return fail("the problem is empty: nothing to launch");
  if (plan.kind == DropKernel::kVec && !pr.vec_ok) return fail("16-byte vectors do not fit the pointers' alignment");
  if (plan.vec != item_elems(plan.kind, pr.elem_bytes))
    return fail("vec must be " + std::to_string(item_elems(plan.kind, pr.elem_bytes)) + " for this kernel and dtype");
  if (!is_built(plan.kind, plan.unroll))
    return fail("the kernel is not built for " + std::to_string(plan.unroll) + " items per thread");
  if (plan.grid < 1 || int64_t(plan.grid) > kDropMaxGrid) return fail("grid must be in 1..2^30");
  return Status::Ok();
}

}  // namespace kernelforge
