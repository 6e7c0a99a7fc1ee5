// The dropout reference (kernelforge::ref) and its Philox, on the CPU: Philox4x32-10 against the
// published known answers, the element -> (counter, lane) mapping, the keep rule at p = 0 and 1,
// keep rates within binomial bounds, dropout_add and the backward against the forward's mask, and
// the (seed, offset) written to rng_state.
#include <cmath>
#include <cstdint>
#include <vector>

#include "dropout/dropout_problem.h"
#include "dropout/kernels/philox.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::PhiloxState;

// Random123's kat_vectors for philox4x32 with 10 rounds: counter, key -> output.
TEST(DropReference, PhiloxKnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const kf::philox::Block b = kf::philox::philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int l = 0; l < 4; ++l) EXPECT_EQ(b.v[l], k.out[l]) << "lane " << l;
  }
}

// Element i takes 16 bits of the block at counter (offset / 4 lo, hi, i / 8 lo, hi), key = seed:
// the low half (even i % 8) or the high half (odd) of word (i % 8) / 2.
TEST(DropReference, ElementToCounterMapping) {
  const uint64_t seed = 0x0123456789abcdefull, offset = (uint64_t(5) << 32) + 12;
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(2), int64_t(3), int64_t(6), int64_t(7), int64_t(8), int64_t(4099),
                    (int64_t(1) << 35) + 13}) {
    const uint64_t g = uint64_t(i) / 8, c = offset / 4;
    const kf::philox::Block b = kf::philox::philox4x32_10(uint32_t(c), uint32_t(c >> 32), uint32_t(g),
                                                          uint32_t(g >> 32), 0x89abcdefu, 0x01234567u);
    const uint32_t word = b.v[(i % 8) / 2];
    const uint32_t want = i % 2 == 0 ? word & 0xFFFFu : word >> 16;
    EXPECT_EQ(ref::dropout_bits(seed, offset, i), want) << "element " << i;
  }
  // Known answer: Random123's all-zero philox4x32-10 block 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8
  // is group 0 at (seed 0, offset 0): its 8 elements in order.
  const uint32_t kat[8] = {0xe8d5, 0x6627, 0xc58d, 0xe169, 0xac4c, 0xbc57, 0xdbd8, 0x9b00};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ref::dropout_bits(0, 0, i), kat[i]) << "element " << i;
  // A new offset (step 4) or a new seed gives new bits.
  EXPECT_NE(ref::dropout_bits(seed, 0, 0), ref::dropout_bits(seed, 4, 0));
  EXPECT_NE(ref::dropout_bits(seed, 0, 0), ref::dropout_bits(seed + 1, 0, 0));
}

// threshold = round((1 - p) 2^16) in [0, 65536]: 65536 keeps every 16-bit value, 0 none.
TEST(DropReference, KeepRuleEdges) {
  const kf::KeepRule k0 = kf::keep_rule(0.0), k1 = kf::keep_rule(1.0), kh = kf::keep_rule(0.5);
  EXPECT_EQ(k0.threshold, 65536u);
  EXPECT_EQ(k0.scale, 1.f);
  EXPECT_EQ(k1.threshold, 0u);
  EXPECT_EQ(kh.threshold, 32768u);
  EXPECT_EQ(kh.scale, 2.f);
  EXPECT_EQ(kf::keep_rule(0.25).threshold, 49152u);
  EXPECT_EQ(kf::keep_rule(0.1).threshold, 58982u);   // 58982.4 rounded: keep probability 0.8999939
  EXPECT_EQ(kf::keep_rule(1e-6).threshold, 65536u);  // below 2^-17: keeps everything
  EXPECT_EQ(kf::keep_rule(1.0 - 1e-6).threshold, 0u);
  // p = 0 and p = 1 hold whatever the bits: check every 16-bit value through the mapping's extremes.
  for (int64_t i = 0; i < 4096; ++i) {
    EXPECT_TRUE(ref::dropout_keep(77, 8, i, 0.0));
    EXPECT_FALSE(ref::dropout_keep(77, 8, i, 1.0));
  }
}

// The keep test is exactly `bits < threshold`: over many elements, kept iff the 16-bit value is below.
TEST(DropReference, KeepIsBitsBelowThreshold) {
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    const uint32_t t = kf::keep_rule(p).threshold;
    for (int64_t i = 0; i < 20000; ++i)
      ASSERT_EQ(ref::dropout_keep(5, 12, i, p), ref::dropout_bits(5, 12, i) < t) << "p=" << p << " element " << i;
  }
}

struct RefRun {
  HostTensor y;
  std::vector<uint8_t> mask;
  int64_t state[2] = {-1, -1};
};

RefRun run_dropout(const HostTensor& x, double p, PhiloxState rng, const HostTensor* residual = nullptr) {
  RefRun r;
  r.y = HostTensor(x.dtype, x.shape);
  r.mask.assign(size_t(x.numel()), 7);
  TensorView st = kf::make_view(r.state, DType::kInt64, {2}, Device{DeviceType::kCPU, 0});
  Status s = residual ? ref::dropout_add(x.view(), residual->view(), p, rng, r.y.view(), &st)
                      : ref::dropout(x.view(), p, rng, r.y.view(), &st, r.mask.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

TEST(DropReference, FormulaAndMask) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (double p : {0.0, 0.1, 0.5, 0.9, 1.0}) {
      SCOPED_TRACE(std::string(kf::dtype_name(t)) + " p=" + std::to_string(p));
      Rng rng(hash_str("formula") + uint64_t(p * 100) + uint64_t(t));
      HostTensor x = random_tensor(t, {7, 131}, rng);
      PhiloxState st;
      st.seed = 1234 + uint64_t(t);
      st.offset = 8;
      const RefRun r = run_dropout(x, p, st);
      EXPECT_EQ(r.state[0], int64_t(st.seed));
      EXPECT_EQ(r.state[1], int64_t(st.offset));
      const double s = p < 1 ? 1.0 / (1.0 - p) : 0.0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const bool keep = ref::dropout_keep(st.seed, st.offset, i, p);
        ASSERT_EQ(r.mask[i], keep ? 1 : 0) << "element " << i;
        const double want = round_to(t, x.get(i) * (keep ? s : 0.0));
        ASSERT_EQ(r.y.get(i), want) << "element " << i;
        if (p == 0.0) {
          ASSERT_EQ(r.y.get(i), x.get(i));
        }
        if (p == 1.0) {
          ASSERT_EQ(r.y.get(i), 0.0);
        }
      }
    }
  }
}

// Keep counts at p in {0.1, 0.5, 0.9} within 6 standard deviations of n q, q = round((1 - p) 2^16) /
// 2^16 the quantized keep probability, for a few seeds; the 16-bit values are uniform (each of 16
// buckets of the value range holds n / 16 within 6 sd), and both halves of a word are.
TEST(DropReference, KeepRate) {
  const int64_t n = 200003;
  for (double p : {0.1, 0.5, 0.9}) {
    for (uint64_t seed : {uint64_t(0), uint64_t(42), ~uint64_t(0)}) {
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) kept += ref::dropout_keep(seed, 4 * seed % 64, i, p);
      const double q = kf::keep_rule(p).threshold / 65536.0;
      const double mean = n * q, sd = std::sqrt(n * q * (1 - q));
      EXPECT_LE(std::fabs(kept - mean), 6 * sd) << "p=" << p << " seed " << seed << ": kept " << kept;
    }
  }
}

TEST(DropReference, BitsUniform) {
  const int64_t n = 1 << 18;
  int64_t bucket[2][16] = {};
  for (int64_t i = 0; i < n; ++i) ++bucket[i % 2][ref::dropout_bits(9, 4, i) >> 12];
  const double mean = n / 32.0, sd = std::sqrt(mean * (1 - 1.0 / 16));
  for (int h = 0; h < 2; ++h)
    for (int b = 0; b < 16; ++b)
      EXPECT_LE(std::fabs(bucket[h][b] - mean), 6 * sd) << "half " << h << " bucket " << b << ": " << bucket[h][b];
}

TEST(DropReference, DropoutAddAndBackward) {
  const DType t = DType::kFloat32;
  Rng rng(7);
  HostTensor x = random_tensor(t, {3, 1001}, rng), res = random_tensor(t, {3, 1001}, rng),
             dy = random_tensor(t, {3, 1001}, rng);
  PhiloxState st;
  st.seed = 99;
  st.offset = 40;
  const double p = 0.3, s = 1.0 / 0.7;
  const RefRun fwd = run_dropout(x, p, st, &res);
  const RefRun plain = run_dropout(x, p, st);  // same stream: same mask
  HostTensor dx(t, x.shape);
  TensorView stv = kf::make_view(const_cast<int64_t*>(fwd.state), DType::kInt64, {2}, Device{DeviceType::kCPU, 0});
  KF_ASSERT_OK(ref::dropout_backward(dy.view(), stv, p, dx.view()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double f = plain.mask[i] ? s : 0.0;
    ASSERT_EQ(fwd.y.get(i), round_to(t, res.get(i) + x.get(i) * f)) << i;
    ASSERT_EQ(dx.get(i), round_to(t, dy.get(i) * f)) << i;
  }
}

// Dropped non-finite inputs give x * 0 = NaN, as F.dropout; kept ones scale.
TEST(DropReference, NonFinite) {
  HostTensor x(DType::kFloat32, {64});
  for (int64_t i = 0; i < 64; ++i) x.set(i, i % 2 ? INFINITY : NAN);
  PhiloxState st;
  const RefRun r = run_dropout(x, 0.5, st);
  for (int64_t i = 0; i < 64; ++i) {
    if (i % 2 == 0 || !r.mask[i]) {
      EXPECT_TRUE(std::isnan(r.y.get(i))) << i;
    } else {
      EXPECT_EQ(r.y.get(i), INFINITY) << i;
    }
  }
}

TEST(DropReference, EmptyWritesState) {
  HostTensor x(DType::kFloat32, {0, 5});
  PhiloxState st;
  st.seed = 3;
  st.offset = 16;
  const RefRun r = run_dropout(x, 0.5, st);
  EXPECT_EQ(r.state[0], 3);
  EXPECT_EQ(r.state[1], 16);
}

}  // namespace
