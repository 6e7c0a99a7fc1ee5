// The TMA decode attention launcher (kernels/decode_attention_tma.cuh): the tensor maps of k_cache and
// v_cache, then the kDecodeTiles kTma row the plan names, one launch. Included by decode_tma_<dtype>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_tma_map.h"
#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/decode_config.h"
#include "decode/decode_launch.cuh"
#include "decode/decode_plan.h"
#include "decode/kernels/decode_attention_tma.cuh"

namespace kernelforge {
namespace decode {

template <typename T, int kTile>
constexpr auto tma_kernel() {
  constexpr DecodeTile c = kDecodeTiles[kTile];
  static_assert(c.kernel == DecodeKernel::kTma, "a TMA row");
  return decode_attention_tma_kernel<T, c.head_dim, c.rows / 16, c.warps, c.stages, c.ctas_per_sm>;
}

// The first kTma row of kDecodeTiles (the image every TMA tile shares).
constexpr int first_tma_tile() {
  for (int i = 0; i < kDecodeTileCount; ++i)
    if (kDecodeTiles[i].kernel == DecodeKernel::kTma) return i;
  return -1;
}

template <typename T, int kTile>
Status launch_tma_tile(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  constexpr DecodeTile c = kDecodeTiles[kTile];
  constexpr int64_t smem = decode_tma_smem_bytes(c.head_dim, c.rows, c.warps, c.stages);
  constexpr int kBlockN = 16 * c.warps;
  auto kernel = tma_kernel<T, kTile>();
  if (kernel_binary_version(kernel) != 90)
    return Status::NotSupported("decode_attention: the TMA kernel needs an sm_90 device and a build with 90a-real");
  const DeviceInfo* dev = nullptr;
  DecodeWorkspace ws;
  Status st = launch_setup(kernel, smem, plan, p, workspace, &dev, &ws);
  if (!st.ok()) return st;
  // (column, row, head, page) maps; a paged tile of kBlockN keys is kBlockN / box_rows whole pages
  const int box_rows = p.block_table != nullptr && p.page_size < kBlockN ? p.page_size : kBlockN;
  CUtensorMap tk, tv;
  st = encode_attention_map<T>(&tk, p.k_cache, p.head_dim, p.page_size, p.heads_kv, p.pages, p.k_st, p.k_sh, p.k_sp,
                               box_rows, "k_cache", "decode_attention");
  if (!st.ok()) return st;
  st = encode_attention_map<T>(&tv, p.v_cache, p.head_dim, p.page_size, p.heads_kv, p.pages, p.v_st, p.v_sh, p.v_sp,
                               box_rows, "v_cache", "decode_attention");
  if (!st.ok()) return st;
  const unsigned row_tiles = unsigned(decode_row_tiles(plan, p));
  Launch l(dim3(unsigned(plan.splits), row_tiles * unsigned(p.heads_kv), unsigned(p.batch)), dim3(32u * (c.warps + 1)),
           size_t(smem), stream, use_pdl(*dev));
  return launched(l(kernel, tk, tv, p, plan.splits, ws.o, ws.lse, ws.counters), "decode_attention (TMA)");
}

}  // namespace decode

template <typename T>
Status launch_decode_tma(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  return decode::match_tile<DecodeKernel::kTma>(
      plan, [&](auto tile) { return decode::launch_tma_tile<T, decltype(tile)::value>(plan, p, workspace, stream); });
}

}  // namespace kernelforge
