// The attention planner: AttentionProblem -> AttentionPlan, pure host code over the small tables in
// attention_plan.cpp (the mma kernel) and attention_plan_wgmma.cpp (the wgmma kernel), unit-tested
// on machines without a GPU. AttentionPlan itself is public (include/kernelforge/attention.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "common/device.h"
#include "kernelforge/status.h"

namespace kernelforge {

// What the plan depends on and nothing else.
struct AttentionProblem {
  int elem_bytes = 2;  // sizeof(T) of q / k / v
  bool bf16 = true;    // bfloat16 (else float16)
  int64_t batch = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int64_t seqlen_q = 0;  // per sequence, or the varlen upper bound
  int64_t seqlen_k = 0;
  int64_t total_q = 0;  // query rows over the batch (B * Sq, or Tq)
  int head_dim_qk = 0;
  int head_dim_v = 0;
  bool varlen = false;
  bool causal = false;  // window_right == 0 (folded)
  bool window = false;  // window_left >= 0, or window_right > 0
  bool softcap = false;
  bool sinks = false;
  bool lse = false;
  bool tma_ok = false;  // every base 16-byte aligned and every row stride a multiple of 16 bytes
  // backward only
  int64_t total_k = 0;  // key rows over the batch (B * Sk, or Tk)
  bool deterministic = false;
};

AttentionProblem make_attention_problem(const AttentionParams& p, DType dtype);
// The backward's problem: the forward's, with total_k and deterministic set (tma_ok covers dout and
// the gradients too).
AttentionProblem make_attention_bwd_problem(const AttentionGradParams& p, DType dtype);

// The plan production runs (problem non-empty).
AttentionPlan plan_attention_fwd(const AttentionProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem on the device (tests run them all; dev/ sweeps time them).
std::vector<AttentionPlan> candidate_plans(const AttentionProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const AttentionPlan& plan, const AttentionProblem& problem, const DeviceInfo& dev);

// The wgmma kernel's table (attention_plan_wgmma.cpp): its plans for a problem (empty when it
// cannot run it: not sm_90, unsupported head dims or features, unaligned tensors).
std::vector<AttentionPlan> wgmma_plans(const AttentionProblem& problem, const DeviceInfo& dev);
Status check_wgmma_plan(const AttentionPlan& plan, const AttentionProblem& problem, const DeviceInfo& dev);

// Bytes of workspace a plan needs (0 unless split over keys).
size_t workspace_bytes(const AttentionPlan& plan, const AttentionProblem& problem);

// Opt-in dynamic shared memory per block of a compute capability (attention_plan.cpp's table).
int64_t attention_smem_limit(int capability);

// ---- backward (attention_plan_bwd.cpp) -----------------------------------------------------------
AttentionPlan plan_attention_bwd(const AttentionProblem& problem, const DeviceInfo& dev);
std::vector<AttentionPlan> candidate_bwd_plans(const AttentionProblem& problem, const DeviceInfo& dev);
Status check_bwd_plan(const AttentionPlan& plan, const AttentionProblem& problem, const DeviceInfo& dev);
// Bytes of workspace a backward plan needs (the float32 dq accumulator, the row sums D, and whatever
// else the plan's passes keep there; the layout is the launcher's, attention_bwd_workspace.h).
size_t bwd_workspace_bytes(const AttentionPlan& plan, const AttentionProblem& problem);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device.
Status launch_with_plan(const AttentionPlan& plan, const AttentionCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);
Status attention_candidate_plans(const AttentionCall& call, std::vector<AttentionPlan>* plans);
Status launch_bwd_with_plan(const AttentionPlan& plan, const AttentionGradCall& call, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);
Status attention_candidate_bwd_plans(const AttentionGradCall& call, std::vector<AttentionPlan>* plans);

// The launcher (attention_launch.cuh): one switch over plan.kind, one instantiation per dtype
// (attention_<dtype>.cu). T is __half or __nv_bfloat16.
template <typename T>
Status launch_attention_fwd(const AttentionPlan& plan, const AttentionParams& p, const DeviceInfo& dev, void* workspace,
                            cudaStream_t stream);

// One launcher per kernel, each in its own translation units (kernel files are compiled apart so that
// the build runs them in parallel): attention_fwd_mma_<dtype>.cu and attention_fwd_wgmma_<dtype>.cu.
template <typename T>
Status launch_attention_fwd_mma(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream);
template <typename T>
Status launch_attention_fwd_wgmma(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream);

// The backward launcher (attention_bwd_launch.cuh, instantiated in attention_bwd_<dtype>.cu): one
// switch over plan.kind. `workspace` holds at least bwd_workspace_bytes(plan, problem), 256-byte
// aligned.
template <typename T>
Status launch_attention_bwd(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                            void* workspace, cudaStream_t stream);

}  // namespace kernelforge
