// The MLA decode planner's interface (mla_plan.cpp): host code only, unit-tested without a GPU.
// plan_mla_decode picks the kernel (the wgmma kernel where it runs, else the mma.sync kernel at the
// deepest kMlaTiles row the device holds) and the key split; check_mla_decode_plan refuses plans no
// kernel is built for or the device cannot run; mla_decode_workspace_bytes sizes the split partials.
// `wgmma_image`: the library holds the wgmma kernel's sm_90a image for the device (mla_decode_wgmma_image),
// a fact of the build the DeviceInfo does not carry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "decode/decode_problem.h"

namespace kernelforge {

struct DeviceInfo;
// seesaw: where the wgmma kernel runs, take its seesaw schedule (kernel=wgmma_seesaw) instead.
MlaDecodePlan plan_mla_decode(const DecodeParams& p, const DeviceInfo& dev, bool wgmma_image, bool seesaw = false);

// mla_decode_plan / mla_decode pass wgmma_image = kMlaWgmmaByDefault && the device and the build have
// the wgmma kernel. It is on: b64 x kv4k x 128 heads takes 204 us against 411 for mma.sync on the H200
// (1567 vs 777 GB/s). The environment's KF_MLA_WGMMA=0 (or 1) overrides it for the process.
inline constexpr bool kMlaWgmmaByDefault = true;
// mla_decode_plan / mla_decode pass seesaw = kMlaSeesawByDefault: the seesaw schedule of the wgmma
// kernel (kernels/mla_decode_wgmma_seesaw.cuh) is off: 195.7 against 204.8 us at b64 x kv4k x 128
// heads, 68.2 against 66.1 at b16 x kv8k x 16 heads on the H200; explicit plans with kernel =
// MlaKernel::kWgmmaSeesaw run it. The environment's KF_MLA_SEESAW=1 (or 0) overrides it for the process.
inline constexpr bool kMlaSeesawByDefault = false;
Status check_mla_decode_plan(const MlaDecodePlan& plan, const DecodeParams& p, const DeviceInfo& dev, bool wgmma_image);
size_t mla_decode_workspace_bytes(const MlaDecodePlan& plan, const DecodeParams& p);
// Why the wgmma kernel cannot run the call, or an empty string.
std::string mla_wgmma_unsupported(const DecodeParams& p, const DeviceInfo& dev, bool wgmma_image);
// The wgmma plan of the call (the key split from its 64-key tiles), whether or not it can run; seesaw:
// the same plan with the seesaw schedule.
MlaDecodePlan mla_wgmma_plan(const DecodeParams& p, const DeviceInfo& dev, bool seesaw = false);
// Row tiles per sequence: ceil(H * Lq / plan.rows).
inline int32_t mla_row_tiles(const MlaDecodePlan& plan, const DecodeParams& p) {
  return (p.rows + plan.rows - 1) / plan.rows;
}
// Whether this build holds the wgmma kernel's sm_90a image for the current device and q's dtype
// (cudaFuncGetAttributes; mla_decode.cpp).
bool mla_decode_wgmma_image(DType dtype);

}  // namespace kernelforge
