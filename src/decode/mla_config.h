// The compiled tiles of the MLA decode kernel (kernels/mla_decode.cuh) and their shared memory, shared
// by the launcher and the planner so that the instantiations and the plans agree.
//
// One tile shape: 64 query rows x 32 cache rows per stage, 8 warps; the tiles differ in pipeline depth
// only, the deepest one the device's shared memory per block holds.
// Shared memory (elements of T unless said; rows padded by 8 elements, 16 bytes, so that ldmatrix is
// free of bank conflicts):
//   Q tile      64 x (576 + 8)             74,752 bytes, loaded once
//   cache ring  stages x 32 x (576 + 8)    37,376 bytes per stage (keys; values = first 512 columns)
//   P tile      64 x (32 + 8)               5,120 bytes (the softmax weights of one stage)
//   float32     6 x 64                      1,536 bytes (row max of each key half, rescale, sums, max)
#pragma once

#include <cstdint>

#include "decode/decode_config.h"
#include "kernelforge/mla.h"

namespace kernelforge {

constexpr int kMlaRows = 64;
constexpr int kMlaBlockN = 32;
constexpr int kMlaWarps = 8;
constexpr int kMlaStride = kMlaHeadDimK + kDecodePad;  // shared cache / Q row, elements
constexpr int kMlaPStride = kMlaBlockN + kDecodePad;   // shared P row, elements

constexpr int64_t mla_smem_bytes(int stages) {
  return int64_t(kMlaRows) * kMlaStride * 2 + int64_t(stages) * kMlaBlockN * kMlaStride * 2 +
         int64_t(kMlaRows) * kMlaPStride * 2 + 6 * kMlaRows * 4;
}

struct MlaTile {
  int stages;
  int min_capability;  // sm_90: 227 KB of shared memory per block; sm_80: 163 KB
};
constexpr MlaTile kMlaTiles[] = {
    // 230,912 bytes: three stages (110 KB) in flight while one is consumed, one CTA per SM
    {4, 90},
    // 156,160 bytes (sm_80 / sm_87): one stage in flight while one is consumed
    {2, 80},
};
constexpr int kMlaTileCount = int(sizeof(kMlaTiles) / sizeof(kMlaTiles[0]));

// Opt-in shared memory per block of a compute capability (major * 10 + minor): 227 KB on the data-center
// parts sm_90 / sm_100 / sm_103, 163 KB on sm_80 / sm_87, 99 KB on the others from sm_86 on (sm_89,
// sm_120); 0 before sm_80, where MLA decode does not run.
constexpr int64_t mla_smem_limit(int capability) {
  return (capability == 90 || capability == 100 || capability == 103) ? 232448
         : (capability == 80 || capability == 87)                     ? 166912
         : capability >= 80                                           ? 101376
                                                                      : 0;
}

}  // namespace kernelforge
