// Internal description of one grouped_mm call, shared by the planner, the CUDA launchers and the
// float64 reference. validate_grouped_mm() fills it from the public TensorViews; it is the only place
// that checks arguments, so every error message comes from one file (grouped_mm_validate.cpp).
//
// Both products are written over three operands a, b, out (element strides, 64-bit offsets):
//   rows ops   a = x [T, K] (row r at a + r a_ld), b = w (element (e, n, k) at b + e b_batch + n b_sn
//              + k b_sk: b_sk = 1 row-major, b_sn = 1 column-major), out [T, N] (row r at out + r out_ld)
//   wgrad      a = dy [T, N] (a_ld), b = x [T, K] (b_ld = b_sn), out = dw (element (e, n, k) at
//              out + e out_batch + n out_ld + k)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "common/device.h"
#include "kernelforge/grouped_mm.h"

namespace kernelforge {

struct GmmParams {
  GroupedMmOp op = GroupedMmOp::kRowsWRow;
  const void* a = nullptr;
  const void* b = nullptr;
  const int* offsets = nullptr;
  void* out = nullptr;
  int groups = 0;  // E
  int64_t t = 0, n = 0, k = 0;
  int64_t a_ld = 0;
  int64_t b_batch = 0, b_sn = 0, b_sk = 0;
  int64_t out_ld = 0, out_batch = 0;
};

struct GmmCall {
  const char* name = "";
  bool wgrad = false;
  bool cuda = true;                     // false: the CPU reference (float32 / float64 also accepted)
  const TensorView* a = nullptr;        // x (rows) or dy (wgrad)
  const TensorView* b = nullptr;        // w (rows) or x (wgrad)
  const TensorView* offsets = nullptr;  // int32 [E]
  const TensorView* out = nullptr;      // out (rows) or dw (wgrad)
};

Status validate_grouped_mm(const GmmCall& c, GmmParams* p, DType* dtype);

// What the planner reads of a validated call.
struct GmmProblem {
  GroupedMmOp op = GroupedMmOp::kRowsWRow;
  int groups = 0;
  int64_t t = 0, n = 0, k = 0;
  int elem_bytes = 2;
  bool tma_aligned = false;  // 16-bit dtype, 16-byte aligned bases; N, K, row and batch strides multiples of 8
};

GmmProblem make_gmm_problem(const GmmParams& p, DType dtype);

// The production plan, every plan that can run the problem (production first), and the check a
// test-chosen plan passes before a launch. `wgmma_built`: grouped_mm_has_wgmma().
GroupedMmPlan plan_grouped_mm(const GmmProblem& problem, const DeviceInfo& dev, bool wgmma_built);
std::vector<GroupedMmPlan> candidate_plans(const GmmProblem& problem, const DeviceInfo& dev, bool wgmma_built);
Status check_plan(const GroupedMmPlan& plan, const GmmProblem& problem, const DeviceInfo& dev, bool wgmma_built);

// The mma kernel's launcher (grouped_mm_launch.cuh), one instantiation per dtype.
template <typename T>
Status launch_grouped_mm_mma(const GroupedMmPlan& plan, const GmmParams& p, const DeviceInfo& dev, cudaStream_t stream);

// The wgmma kernels (sm90/, built only with CUTLASS and sm_90a): their workspace for E groups, and the
// run (setup kernel + CUTLASS's grouped GEMM) on `workspace`, which the entry has checked holds that many bytes.
template <typename T, GroupedMmOp kOp>
size_t gmm_wgmma_workspace(int groups, int sm_count);
template <typename T, GroupedMmOp kOp>
Status gmm_wgmma_run(const GmmParams& p, int sm_count, void* workspace, cudaStream_t stream);

// Test-only entries: one call with a given plan, and a call's candidate plans on the current device.
Status gmm_launch_with_plan(const GroupedMmPlan& plan, const GmmCall& call, void* workspace, size_t* workspace_bytes,
                            cudaStream_t stream);
Status gmm_candidate_plans(const GmmCall& call, std::vector<GroupedMmPlan>* plans);

}  // namespace kernelforge
