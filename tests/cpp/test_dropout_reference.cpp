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

// Element i is lane i % 4 of the block at counter (offset / 4 lo, hi, i / 4 lo, hi), key = seed.
TEST(DropReference, ElementToCounterMapping) {
  const uint64_t seed = 0x0123456789abcdefull, offset = (uint64_t(5) << 32) + 12;
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(3), int64_t(4), int64_t(4099), (int64_t(1) << 34) + 6}) {
    const uint64_t g = uint64_t(i) / 4, c = offset / 4;
    const kf::philox::Block b = kf::philox::philox4x32_10(uint32_t(c), uint32_t(c >> 32), uint32_t(g),
                                                          uint32_t(g >> 32), 0x89abcdefu, 0x01234567u);
    EXPECT_EQ(ref::dropout_bits(seed, offset, i), b.v[i % 4]) << "element " << i;
  }
  // A new offset (step 4) or a new seed gives new bits.
  EXPECT_NE(ref::dropout_bits(seed, 0, 0), ref::dropout_bits(seed, 4, 0));
  EXPECT_NE(ref::dropout_bits(seed, 0, 0), ref::dropout_bits(seed + 1, 0, 0));
}

TEST(DropReference, KeepRuleEdges) {
  const kf::KeepRule k0 = kf::keep_rule(0.0), k1 = kf::keep_rule(1.0), kh = kf::keep_rule(0.5);
  EXPECT_TRUE(k0.all);
  EXPECT_EQ(k0.scale, 1.f);
  EXPECT_FALSE(k1.all);
  EXPECT_EQ(k1.threshold, 0u);
  EXPECT_FALSE(kh.all);
  EXPECT_EQ(kh.threshold, 0x80000000u);
  EXPECT_EQ(kh.scale, 2.f);
  EXPECT_EQ(kf::keep_rule(0.25).threshold, 0xC0000000u);
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

// Keep counts at p in {0.1, 0.5, 0.9} within 6 standard deviations of n (1 - p), for a few seeds.
TEST(DropReference, KeepRate) {
  const int64_t n = 200003;
  for (double p : {0.1, 0.5, 0.9}) {
    for (uint64_t seed : {uint64_t(0), uint64_t(42), ~uint64_t(0)}) {
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) kept += ref::dropout_keep(seed, 4 * seed % 64, i, p);
      const double mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
      EXPECT_LE(std::fabs(kept - mean), 6 * sd) << "p=" << p << " seed " << seed << ": kept " << kept;
    }
  }
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
