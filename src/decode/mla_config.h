// The compiled tiles of the MLA decode kernels and their shared memory, shared by the launchers and
// the planner so that the instantiations and the plans agree: the mma.sync kernel (kernels/mla_decode.cuh,
// sm_80 on) and the wgmma kernel (kernels/mla_decode_wgmma.cuh, sm_90a only; MlaWgmmaSmem below).
//
// mma.sync kernel: one tile shape, 64 query rows x 32 cache rows per stage, 8 warps; the tiles differ
// in pipeline depth only, the deepest one the device's shared memory per block holds.
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

// ---- wgmma kernel (sm_90a) -------------------------------------------------------------------
// 64 query rows x 64 keys per tile, 3 warpgroups (TMA producer + two consumers), a 2-deep K ring.
constexpr int kMlaWgmmaBlockN = 64;
constexpr int kMlaWgmmaWarps = 12;
constexpr int kMlaWgmmaStages = 2;
constexpr int kMlaWgmmaProducerRegs = 24;  // setmaxnreg: 128 x 24 + 256 x 240 = 64,512 <= 65,536
constexpr int kMlaWgmmaConsumerRegs = 240;
// Paged caches need pages of at least 16 rows (a TMA box per page of a tile, 1024-byte aligned in the
// swizzled tile); smaller pages run the mma.sync kernel.
constexpr int kMlaWgmmaMinPage = 16;

// Shared memory of the wgmma kernel, byte offsets from a 1024-byte aligned base. Every operand tile is
// 64 columns (128 bytes) wide with the 128-byte swizzle (attention/kernels/sm90_wgmma.cuh):
//   Q      9 column tiles x 64 rows x 128 B     73,728   loaded once (cp.async, zero rows past the tile)
//   K ring 2 stages x 9 x 64 keys x 128 B      147,456   TMA; the values are column tiles 0-7 of a stage
//   P      64 rows x 64 keys x 2 B               8,192   the softmax weights of one tile (bf16 / fp16)
//   alpha  64 float32                              256   the rows' rescale 2^(m_old - m_new) of that tile
//   l, m   2 x 64 float32                          512   the rows' final sums and maxima (epilogue)
//   mbarriers 2 x 2 x 8 B                           32   K full / K empty per stage
// 230,176 bytes + 1,024 of alignment slack = 231,200 <= 232,448 (sm_90's 227 KB per block).
struct MlaWgmmaSmem {
  static constexpr int kTileBytes = 64 * 128;                       // one 64 x 64 16-bit tile
  static constexpr int kQBytes = (kMlaHeadDimK / 64) * kTileBytes;  // 73,728
  static constexpr int kKBytes = kQBytes;                           // 64 keys x 576 columns
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;  // stage s at kK + s * kKBytes
  static constexpr int kP = kK + kMlaWgmmaStages * kKBytes;
  static constexpr int kAlpha = kP + kTileBytes;
  static constexpr int kL = kAlpha + 64 * 4;
  static constexpr int kM = kL + 64 * 4;
  static constexpr int kBars = kM + 64 * 4;
  static constexpr int kBytes = kBars + 2 * kMlaWgmmaStages * 8 + 1024;
  static_assert(kMlaRows == 64 && kMlaWgmmaBlockN == 64, "one 64 x 64 tile for Q rows, keys and P");
  static_assert(kK % 1024 == 0 && kP % 1024 == 0, "swizzled tiles start 1024-byte aligned");
  static_assert(kBytes <= 232448, "shared memory of one CTA on sm_90");
};

// ---- wgmma seesaw kernel (sm_90a) -------------------------------------------------------------
// The same tile, warps and ring as the wgmma kernel (64 query rows x 64 keys, producer + two consumer
// warpgroups, 2 stages of 72 KB); the consumers alternate key tiles (kernels/mla_decode_wgmma_seesaw.cuh).
// Each stage has two halves with their own full / empty mbarriers: lo = column tiles 0-3 (value
// columns 0-255), hi = column tiles 4-8 (value columns 256-511 and the 64 rope columns).
// Shared memory (byte offsets from a 1024-byte aligned base; tiles as MlaWgmmaSmem):
//   Q        9 x 64 x 128 B                 73,728   loaded once
//   K ring   2 stages x 9 x 64 x 128 B     147,456   stage s holds the tiles t with t % 2 == s
//   P1       64 rows x 64 keys x 2 B          8,192   consumer 1's P of its odd tile (read by consumer 0)
//            (consumer 0's rescaled P of its even tile goes to stage 0's rope column tile, dead once
//            that tile's S is done: 8,192 bytes without a buffer of its own)
//   m0, scale0, m1, scale1, l0, l1   6 x 64 float32   1,536   the rows' running max / rescale per tile
//   mbarriers  2 stages x 2 halves x (full, empty) x 8 B   64
// 230,976 bytes + 1,024 of alignment slack = 232,000 <= 232,448 (sm_90's 227 KB per block).
constexpr int kMlaSeesawLoTiles = 4;  // column tiles 0-3: value columns 0-255 (consumer 0's output half)
struct MlaSeesawSmem {
  static constexpr int kTileBytes = MlaWgmmaSmem::kTileBytes;
  static constexpr int kKBytes = MlaWgmmaSmem::kKBytes;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + MlaWgmmaSmem::kQBytes;
  static constexpr int kP0 = kK + (kMlaHeadDimK / 64 - 1) * kTileBytes;  // stage 0's rope column tile
  static constexpr int kP1 = kK + kMlaWgmmaStages * kKBytes;
  static constexpr int kM0 = kP1 + kTileBytes;
  static constexpr int kScale0 = kM0 + 64 * 4;
  static constexpr int kM1 = kScale0 + 64 * 4;
  static constexpr int kScale1 = kM1 + 64 * 4;
  static constexpr int kL0 = kScale1 + 64 * 4;
  static constexpr int kL1 = kL0 + 64 * 4;
  static constexpr int kBars = kL1 + 64 * 4;
  static constexpr int kBytes = kBars + 2 * 2 * kMlaWgmmaStages * 8 + 1024;
  static_assert(kMlaWgmmaStages == 2, "one stage per consumer: tile t in stage t % 2");
  static_assert(kP0 % 1024 == 0 && kP1 % 1024 == 0, "swizzled tiles start 1024-byte aligned");
  static_assert(kBytes <= 232448, "shared memory of one CTA on sm_90");
};

}  // namespace kernelforge
