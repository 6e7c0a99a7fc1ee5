// The decode attention planner's interface (decode_plan.cpp): host code only, unit-tested without a
// GPU. plan_decode picks the kernel, the kDecodeTiles row and the key split; decode_candidate_plans
// lists every built tile that can run the call (tests and dev/ sweeps run each); check_decode_plan
// refuses plans no kernel is built for; decode_workspace_bytes sizes the split workspace and
// decode_workspace lays it out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/decode_problem.h"

namespace kernelforge {

struct DeviceInfo;
// `tma_built`: the build holds an sm_90a image of the TMA kernel (decode_tma_built()). `head_group`:
// page size 1 may take the head-group kernel (decode_config.h's kHeadGroup rows).
DecodePlan plan_decode(const DecodeParams& p, const DeviceInfo& dev, bool tma_built, bool head_group = false);

// decode_attention_plan / decode_attention pass head_group = kDecodeHeadGroupByDefault. It is off: the
// head-group kernel (kernels/decode_attention_heads.cuh), built and tested through the candidate plans,
// is slower at page size 1 than the cp.async kernel's page-1 tile (H200, b16 x kv4k, GQA 32/8 d128:
// 132.9 against 126.6 us). KF_DECODE_HEADS=1 (or 0) overrides it for the process.
inline constexpr bool kDecodeHeadGroupByDefault = false;

// decode_attention_plan / decode_attention pass tma_built = kDecodeTmaByDefault && the device and the
// build have the TMA kernel. It is on: at page size 16 the TMA kernel reads 3211 GB/s at b16 x kv4k
// (cp.async 2736) and 3808 at b8 x kv32k (3303) on the H200. The environment's KF_DECODE_TMA=0 (or 1)
// overrides it for the process.
inline constexpr bool kDecodeTmaByDefault = true;
std::vector<DecodePlan> decode_candidate_plans(const DecodeParams& p, const DeviceInfo& dev, bool tma_built);
// Why the TMA kernel cannot run the call on `dev`, or an empty string.
std::string decode_tma_unsupported(const DecodeParams& p, const DeviceInfo& dev, bool tma_built);
Status check_decode_plan(const DecodePlan& plan, const DecodeParams& p);
size_t decode_workspace_bytes(const DecodePlan& plan, const DecodeParams& p);
// Row tiles per (sequence, kv head): ceil(rows / plan.rows).
inline int32_t decode_row_tiles(const DecodePlan& plan, const DecodeParams& p) {
  return (p.rows + plan.rows - 1) / plan.rows;
}

// The workspace of a split plan (splits > 1), each part 256-byte aligned:
//   counters  int32 [B][Hkv]            the split merge's tickets, zero between calls (decode.h)
//   o         float32 [rows][splits][D] normalized partial outputs (rows = B * Lq * Hq)
//   lse       float32 [rows][splits]    their log2-sum-exp
// The counters come first so that their place depends on B and Hkv only: a workspace zeroed once
// keeps zero counters across plans that differ in the split or the tile.
struct DecodeWorkspace {
  int32_t* counters = nullptr;
  float* o = nullptr;
  float* lse = nullptr;
};
DecodeWorkspace decode_workspace(const DecodePlan& plan, const DecodeParams& p, void* workspace);

// Whether the current device runs an image of the TMA kernel (an sm_90 device and a 90a-real build);
// defined with the kernels (decode_tma_bf16.cu), needs the CUDA runtime.
bool decode_tma_built();

}  // namespace kernelforge
