// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, 4 x 32 random bits per (128-bit counter, 64-bit key). Host and device:
// the float64 reference and every kernel call this one function, so their masks are identical.
// Cost per call: 10 rounds of 2 32x32->64 multiplies, 2 three-way xors and a key bump (~80 integer
// instructions for 4 values). Known answers (Random123's kat_vectors) are in test_dropout_reference.cpp.
#pragma once

#include <cstdint>

#include "common/math.h"

namespace kernelforge {
namespace philox {

constexpr uint32_t kM0 = 0xD2511F53u;  // round multipliers
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // key schedule (Weyl) increments
constexpr uint32_t kW1 = 0xBB67AE85u;

struct Block {
  uint32_t v[4];
};

// One round: (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)).
KF_HOST_DEVICE inline void round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t(kM0) * c0;  // one mul.wide.u32 each on the device
  const uint64_t p1 = uint64_t(kM1) * c2;
  const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
  const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
  c1 = uint32_t(p1);
  c3 = uint32_t(p0);
  c0 = n0;
  c2 = n2;
}

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1): 10 rounds, the key bumped between them.
KF_HOST_DEVICE inline Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                          uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    round(c0, c1, c2, c3, k0, k1);
  }
  return Block{{c0, c1, c2, c3}};
}

// Dropout takes 16 random bits per element: one Philox call (4 x 32 bits) covers the 8 elements of
// group g = i / 8, element i taking the 16-bit half (i % 8) % 2 (0 = low) of word (i % 8) / 2.
constexpr int kGroupElems = 8;

// The block of group g (elements 8g .. 8g + 7) of a dropout call at (seed, offset): curand's Philox
// at subsequence g, skipped ahead by `offset` values (counter low half offset / 4, high half g),
// i.e. the first 4 values of the stream PyTorch's curand_init(seed, g, offset) starts.
KF_HOST_DEVICE inline Block dropout_group(uint64_t seed, uint64_t offset, uint64_t g) {
  const uint64_t c = offset / 4;
  return philox4x32_10(uint32_t(c), uint32_t(c >> 32), uint32_t(g), uint32_t(g >> 32), uint32_t(seed),
                       uint32_t(seed >> 32));
}

// The 16 random bits of element j (0 .. 7) of a group's block.
KF_HOST_DEVICE inline uint32_t bits16(const Block& b, int j) { return (b.v[j >> 1] >> (16 * (j & 1))) & 0xFFFFu; }

}  // namespace philox
}  // namespace kernelforge
