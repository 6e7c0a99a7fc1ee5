// The K range of one split of the skinny linear kernels (linear_skinny.cuh, linear_skinny_tma.cuh):
// whole kBlockK tiles, ceil(tiles / splits) per split, the last split shorter (or empty).
#pragma once

#include <cstdint>

namespace kernelforge {
namespace skinny {

template <int kBlockK>
__device__ __forceinline__ void split_range(int64_t K, int split, int splits, int64_t* k0, int64_t* k1) {
  const int64_t tiles = (K + kBlockK - 1) / kBlockK;
  const int64_t per = (tiles + splits - 1) / splits;
  *k0 = min(K, split * per * kBlockK);
  *k1 = min(K, (split + 1) * per * kBlockK);
}

}  // namespace skinny
}  // namespace kernelforge
