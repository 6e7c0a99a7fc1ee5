// The decode attention planner's interface (decode_plan.cpp): host code only, unit-tested without a
// GPU. plan_decode picks the kDecodeTiles row and the key split; check_decode_plan refuses plans no
// kernel is built for; decode_workspace_bytes sizes the split partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decode/decode_problem.h"

namespace kernelforge {

struct DeviceInfo;
DecodePlan plan_decode(const DecodeParams& p, const DeviceInfo& dev);
Status check_decode_plan(const DecodePlan& plan, const DecodeParams& p);
size_t decode_workspace_bytes(const DecodePlan& plan, const DecodeParams& p);
// Row tiles per (sequence, kv head): ceil(rows / plan.rows).
inline int32_t decode_row_tiles(const DecodePlan& plan, const DecodeParams& p) {
  return (p.rows + plan.rows - 1) / plan.rows;
}

}  // namespace kernelforge
