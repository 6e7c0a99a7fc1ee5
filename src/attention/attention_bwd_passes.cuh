// The passes every attention backward plan runs around its main kernel: the workspace regions
// (attention_bwd_workspace.h) as device pointers, pass 1 (kernels/attention_bwd_preprocess.cuh: D,
// lse2, the dQ accumulator and the semaphores zeroed, dsinks partials) and pass 3
// (kernels/attention_bwd_dq_convert.cuh: dq and dsinks), on `stream` with programmatic dependent
// launch on sm_90. Included by the main kernels' launchers (attention_bwd_<kernel>_launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_bwd_workspace.h"
#include "attention/attention_plan.h"
#include "attention/kernels/attention_bwd_dq_convert.cuh"
#include "attention/kernels/attention_bwd_preprocess.cuh"
#include "common/launch.cuh"

namespace kernelforge {
namespace attn_bwd {

constexpr const char* kName = "attention_backward";

// A gradient's base 4-byte aligned and its strides even: 2-element stores.
inline bool stores_pairs(const void* base, int64_t sb, int64_t ss, int64_t sh) {
  return reinterpret_cast<uintptr_t>(base) % 4 == 0 && (sb | ss | sh) % 2 == 0;
}

// The regions of `workspace` (bwd_workspace_bytes(plan, problem) bytes) for the plan's query tile.
inline AttnBwdWs workspace_regions(const AttentionPlan& plan, const AttentionGradParams& p, void* workspace) {
  const AttentionParams& f = p.f;
  const AttnBwdWorkspace layout = attn_bwd_workspace(plan.block_m, f.batch, f.heads_q, f.seqlen_q, f.total_q,
                                                     f.head_dim_qk, p.deterministic, f.sinks != nullptr);
  unsigned char* base = static_cast<unsigned char*>(workspace);
  AttnBwdWs ws;
  ws.dq_acc = reinterpret_cast<float*>(base + layout.dq_acc);
  ws.lse2 = reinterpret_cast<float*>(base + layout.lse2);
  ws.dsum = reinterpret_cast<float*>(base + layout.dsum);
  ws.sem = p.deterministic ? reinterpret_cast<int32_t*>(base + layout.sem) : nullptr;
  ws.sinks = f.sinks != nullptr ? reinterpret_cast<float*>(base + layout.sinks) : nullptr;
  ws.q_tiles = layout.q_tiles;
  ws.pre_tiles = layout.pre_tiles;
  return ws;
}

// Pass 1: D, lse2, dQ accumulator zeroed, semaphores zeroed (block_m: the main kernel's query tile),
// dsinks partials.
template <typename T>
Status launch_preprocess(const AttentionGradParams& p, const AttnBwdWs& ws, int block_m, const DeviceInfo& dev,
                         cudaStream_t stream) {
  const AttentionParams& f = p.f;
  if (ws.pre_tiles == 0 || f.heads_q == 0 || f.batch == 0) return Status::Ok();
  Launch l(dim3(unsigned(ws.pre_tiles), unsigned(f.heads_q), unsigned(f.batch)), dim3(kAttnBwdPreThreads), 0, stream,
           use_pdl(dev));
  return launched(l(attention_bwd_preprocess<T>, p, ws, block_m), kName);
}

// Pass 3: dq and dsinks. With sinks it runs even without query rows (dsinks = 0 then).
template <typename T>
Status launch_dq_convert(const AttentionGradParams& p, const AttnBwdWs& ws, const DeviceInfo& dev,
                         cudaStream_t stream) {
  const AttentionParams& f = p.f;
  const bool sinks = f.sinks != nullptr;
  const int64_t gx = sinks && ws.pre_tiles == 0 ? 1 : ws.pre_tiles;
  const int64_t gz = sinks && f.batch == 0 ? 1 : f.batch;
  if (gx == 0 || gz == 0 || f.heads_q == 0) return Status::Ok();
  Launch l(dim3(unsigned(gx), unsigned(f.heads_q), unsigned(gz)), dim3(kAttnBwdPreThreads), 0, stream, use_pdl(dev));
  return launched(l(attention_bwd_dq_convert<T>, p, ws, stores_pairs(p.dq, p.dq_sb, p.dq_ss, p.dq_sh)), kName);
}

}  // namespace attn_bwd
}  // namespace kernelforge
