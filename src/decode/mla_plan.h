// The MLA decode planner's interface (mla_plan.cpp): host code only, unit-tested without a GPU.
// plan_mla_decode picks the kMlaTiles row the device holds and the key split; check_mla_decode_plan
// refuses plans no kernel is built for or the device cannot run; mla_decode_workspace_bytes sizes the
// split partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decode/decode_problem.h"

namespace kernelforge {

struct DeviceInfo;
MlaDecodePlan plan_mla_decode(const DecodeParams& p, const DeviceInfo& dev);
Status check_mla_decode_plan(const MlaDecodePlan& plan, const DecodeParams& p, const DeviceInfo& dev);
size_t mla_decode_workspace_bytes(const MlaDecodePlan& plan, const DecodeParams& p);
// Row tiles per sequence: ceil(H * Lq / plan.rows).
inline int32_t mla_row_tiles(const MlaDecodePlan& plan, const DecodeParams& p) {
  return (p.rows + plan.rows - 1) / plan.rows;
}

}  // namespace kernelforge
