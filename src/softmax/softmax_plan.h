// Softmax family launch plans: Problem -> Plan, pure host code (no CUDA code; unit-tested without a
// GPU in tests/cpp/test_softmax_plan.cpp). The tables and the reasons for each row are in
// softmax_plan.cpp; notes/softmax.md describes the kernels and the measurements behind them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "kernelforge/status.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {

// One enumerator per __global__ kernel production can launch (src/softmax/kernels/<name>.cuh).
enum class SoftmaxKernel : uint8_t {
  kRegs,     // softmax_regs: a team of threads per row (several rows per block, or a row over a cluster)
  kFwdRow,   // softmax_fwd_row: forward, one row per CTA, team size and vectors per thread compiled in
  kStream,   // softmax_stream: one 1024-thread CTA (or cluster) per row, reads the row twice
  kBulkFwd,  // softmax_bulk_fwd: sm_90 cp.async.bulk pipeline, row slices held in registers
  kBulkBwd,  // softmax_bulk_bwd: sm_90 cp.async.bulk pipeline of g and y slices
};

// The forward algorithm of softmax_regs at one CTA per row group (the cluster form and the backward
// use kOnline):
//   kOnline            one (m, s) reduction; exp computed twice per element (for s, and for y)
//   kMaxThenSum        a max reduction, e = exp(x - M) once per element kept in float registers, a sum
//                      reduction, y = e / S (log_softmax: y = x - M - log S)
//   kMaxThenSumRepeat  (softmax) kMaxThenSum keeping x packed across the sum reduction, exp again for y
enum class SoftmaxRegsMode : uint8_t { kOnline = 0, kMaxThenSum = 1, kMaxThenSumRepeat = 4 };

// The kernel and every launch parameter. Grids that depend on occupancy (the persistent grids of the
// streaming and bulk kernels, the register cluster's residency) are computed by the launcher.
struct SoftmaxPlan {
  SoftmaxKernel kind = SoftmaxKernel::kRegs;
  int vec = 1;             // elements per access: 16 bytes' worth, or 1 (rows that do not allow 16-byte vectors)
  int iters = 1;           // vectors per thread held in registers (0: the kernel loops over the row)
  int threads = 0;         // threads per row per CTA (softmax_regs: a team; the others: the CTA)
  int rows_per_block = 1;  // softmax_regs: teams per block (short rows); 1 elsewhere
  int cluster = 1;         // CTAs per row (a thread-block cluster on sm_90)
  int stages = 0;          // bulk kernels: rows in flight per CTA (shared-memory stages)
  SoftmaxRegsMode mode = SoftmaxRegsMode::kOnline;  // softmax_regs only
  bool scalar_head = false;  // rows read as a scalar head up to a 16-byte boundary, then 16-byte vectors
};

const char* kernel_name(SoftmaxKernel k);
std::string to_string(const SoftmaxPlan& plan);  // e.g. "fwd_row vec=8 iters=2 threads=256"
bool operator==(const SoftmaxPlan& a, const SoftmaxPlan& b);

// What the plan depends on and nothing else.
struct SoftmaxProblem {
  bool log = false;       // log_softmax
  bool backward = false;  // *_backward
  int elem_size = 2;      // bytes per element: 4 (float32) or 2 (float16, bfloat16)
  int64_t rows = 0;
  int64_t n = 0;  // row length
  // 16-byte vectors: every base pointer and (with more than one row) every row stride in bytes is a
  // multiple of 16
  bool vec_ok = false;
  // every row of every tensor starts at the same offset from a 16-byte boundary (element-aligned
  // pointers that differ by multiples of 16 bytes, and so do their row strides): a scalar head per row
  // brings all of them to a 16-byte boundary
  bool head_ok = false;
};

// The problem of a validated call (`elem_size` of its dtype).
SoftmaxProblem make_softmax_problem(const SoftmaxParams& p, bool log, bool backward, int elem_size);

// Fixed launch constants, shared with the kernels (their __launch_bounds__ and shared-memory sizes).
constexpr int kSoftmaxMaxTeam = 512;                 // threads per row per CTA of softmax_regs / softmax_fwd_row
constexpr int kSoftmaxStreamThreads = 1024;          // threads of softmax_stream's CTA
constexpr int kSoftmaxBulkMaxThreads = 512;          // threads of a bulk kernel's CTA
constexpr int kSoftmaxBulkMaxStages = 4;             // shared-memory stages of a bulk kernel
constexpr int64_t kSoftmaxBulkMaxSmem = 200 * 1024;  // dynamic shared memory cap of a bulk kernel (bytes)
constexpr int kSoftmaxMaxCluster = 8;                // the portable cluster size limit

// The planner (tables in softmax_plan.cpp). No environment variables, no run-time switches.
SoftmaxPlan plan_softmax(const SoftmaxProblem& pr, const DeviceInfo& dev);

// Every plan that can run the problem on the device: the default plan first, then the alternatives
// (the other kernels, team sizes, vectors per thread, forward modes, cluster sizes, bulk stages).
std::vector<SoftmaxPlan> candidate_plans(const SoftmaxProblem& pr, const DeviceInfo& dev);

// Whether `plan` can run `pr` on `dev`; an unknown or impossible plan is an error naming what does not fit.
Status check_plan(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const DeviceInfo& dev);

// The plan the launcher runs instead when `plan`'s cluster (or, for the bulk kernels, its shared
// memory) cannot be resident on the device, which the occupancy query finds only at launch: the
// bulk kernels fall back to the plan without them, a register cluster to the streaming kernel, a
// streaming cluster to one CTA per row.
SoftmaxPlan fallback_plan(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const DeviceInfo& dev);

// Dynamic shared memory of a bulk plan (bytes; 0 for the other kernels).
int64_t plan_smem_bytes(const SoftmaxPlan& plan, const SoftmaxProblem& pr);

// ---- test and dev/ entries (softmax.cpp) -----------------------------------------------------------
// Runs one validated call with `plan` after check_plan (on the current device).
Status launch_with_plan(const SoftmaxPlan& plan, const SoftmaxCall& call, cudaStream_t stream);
// The candidate plans of a call on the current device (validates the call first).
Status softmax_candidate_plans(const SoftmaxCall& call, std::vector<SoftmaxPlan>* plans);

// CUDA launcher, one instantiation per dtype (softmax_<dtype>.cu; softmax_launch.cuh).
template <typename T>
Status launch_softmax(const SoftmaxPlan& plan, const SoftmaxProblem& pr, const SoftmaxParams& p, const DeviceInfo& dev,
                      cudaStream_t stream);

}  // namespace kernelforge
