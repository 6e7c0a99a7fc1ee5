// The float64 CPU reference of the RoPE family (kernelforge::ref::apply_rope) checked on its own,
// without a GPU:
//  - hand values for both pairings;
//  - HF Llama's `q * cos + rotate_half(q) * sin` (full-width duplicated cos/sin, and per-column
//    values that are not duplicated: the formula is column by column), both layouts, GQA, partial
//    rotary as GPT-NeoX/Phi do it (rotate q[..., :R], concatenate q[..., R:]);
//  - diffusers' apply_rotary_emb(use_real=True, use_real_unbind_dim=-1) (interleaved);
//  - position_ids gather == the gathered cos/sin; [1, S, R] == [S, R]; in place == out of place;
//  - the backward is the transpose of the forward (<g, F x> == <B g, x>) and, with cos^2 + sin^2 = 1
//    and equal pair members (every model), its inverse;
//  - one rounding of each output; out-of-range position_ids are an error on CPU.
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace ref = kernelforge::ref;
using kernelforge::RopeLayout;
using kernelforge::RopeOptions;

constexpr DType F64 = DType::kFloat64;

HostTensor make(DType t, std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor h(t, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), h.numel());
  for (int64_t i = 0; i < h.numel() && i < static_cast<int64_t>(values.size()); ++i) h.set(i, values[i]);
  return h;
}

// Index of element (b, s, h, c) in a contiguous tensor of the layout.
int64_t idx(RopeLayout l, int64_t S, int64_t H, int64_t D, int64_t b, int64_t s, int64_t h, int64_t c) {
  return l == RopeLayout::kBSHD ? ((b * S + s) * H + h) * D + c : ((b * H + h) * S + s) * D + c;
}
std::vector<int64_t> shape_of(RopeLayout l, int64_t B, int64_t S, int64_t H, int64_t D) {
  return l == RopeLayout::kBSHD ? std::vector<int64_t>{B, S, H, D} : std::vector<int64_t>{B, H, S, D};
}

// HF: q_embed = q * cos + rotate_half(q) * sin on the first R columns, rotate_half(x) =
// cat(-x[R/2:], x[:R/2]); columns R.. concatenated unchanged (GPT-NeoX style partial rotary).
// cos/sin [B, S, R]. diffusers (interleaved): x_rotated[2i] = -x[2i+1], x_rotated[2i+1] = x[2i].
HostTensor library_formula(const HostTensor& x, RopeLayout l, int64_t H, const HostTensor& cos, const HostTensor& sin,
                           bool interleaved) {
  const int64_t B = x.shape[0], S = l == RopeLayout::kBSHD ? x.shape[1] : x.shape[2], D = x.shape[3];
  const int64_t R = cos.shape[2];
  HostTensor y(F64, x.shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c) {
          const double xc = x.get(idx(l, S, H, D, b, s, h, c));
          if (c >= R) {
            y.set(idx(l, S, H, D, b, s, h, c), xc);
            continue;
          }
          double rot;
          if (interleaved)
            rot = c % 2 == 0 ? -x.get(idx(l, S, H, D, b, s, h, c + 1)) : x.get(idx(l, S, H, D, b, s, h, c - 1));
          else
            rot = c < R / 2 ? -x.get(idx(l, S, H, D, b, s, h, c + R / 2)) : x.get(idx(l, S, H, D, b, s, h, c - R / 2));
          const int64_t ci = (b * S + s) * R + c;
          y.set(idx(l, S, H, D, b, s, h, c), xc * cos.get(ci) + rot * sin.get(ci));
        }
  return y;
}

// cos/sin [B, S, R] as the libraries build them: HF cat(freqs, freqs), diffusers repeat_interleave(2),
// freqs = pos / base^(2i/R); or (duplicated = false) independent random values per column.
void tables(int64_t B, int64_t S, int64_t R, bool interleaved, bool duplicated, Rng& rng, HostTensor* cos,
            HostTensor* sin) {
  *cos = HostTensor(F64, {B, S, R});
  *sin = HostTensor(F64, {B, S, R});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t c = 0; c < R; ++c) {
        const int64_t i = interleaved ? c / 2 : c % (R / 2);
        const double ang = double(s + 3 * b) / std::pow(10000.0, 2.0 * double(i) / double(R));
        const int64_t at = (b * S + s) * R + c;
        if (duplicated) {
          cos->set(at, std::cos(ang));
          sin->set(at, std::sin(ang));
        } else {
          cos->set(at, rng.uniform(-1.5, 1.5));
          sin->set(at, rng.uniform(-1.5, 1.5));
        }
      }
}

TEST(RopeReference, HandRotateHalf) {
  // D = 4, R = 4: pairs (0, 2), (1, 3)
  const double c0 = std::cos(0.5), s0 = std::sin(0.5), c1 = std::cos(0.25), s1 = std::sin(0.25);
  HostTensor q = make(F64, {1, 1, 1, 4}, {1, 2, 3, 4});
  HostTensor cos = make(F64, {1, 4}, {c0, c1, c0, c1}), sin = make(F64, {1, 4}, {s0, s1, s0, s1});
  HostTensor y(F64, {1, 1, 1, 4});
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, cos.view(), sin.view(), nullptr, {}, y.view(), nullptr));
  const std::vector<double> want = {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y.get(i), want[i], 1e-15) << i;
  // backward: the rotation by -angle
  HostTensor g(F64, {1, 1, 1, 4});
  KF_ASSERT_OK(ref::apply_rope_backward(y.view(), nullptr, cos.view(), sin.view(), nullptr, {}, g.view(), nullptr));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(g.get(i), q.get(i), 1e-15) << i;
}

TEST(RopeReference, HandInterleaved) {
  // D = 6, R = 4: pairs (0, 1), (2, 3); columns 4, 5 pass through
  const double c0 = std::cos(0.5), s0 = std::sin(0.5), c1 = std::cos(0.25), s1 = std::sin(0.25);
  HostTensor q = make(F64, {1, 1, 1, 6}, {1, 2, 3, 4, 5, 6});
  HostTensor cos = make(F64, {1, 4}, {c0, c0, c1, c1}), sin = make(F64, {1, 4}, {s0, s0, s1, s1});
  HostTensor y(F64, {1, 1, 1, 6});
  RopeOptions o;
  o.interleaved = true;
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, cos.view(), sin.view(), nullptr, o, y.view(), nullptr));
  const std::vector<double> want = {1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1, 5, 6};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(y.get(i), want[i], 1e-15) << i;
}

// Against the libraries' formulas: both pairings, both layouts, GQA (Hk != Hq), partial rotary,
// duplicated and non-duplicated cos/sin, [B, S, R] tables.
TEST(RopeReference, MatchesLibraryFormulas) {
  for (bool interleaved : {false, true})
    for (RopeLayout l : {RopeLayout::kBSHD, RopeLayout::kBHSD})
      for (bool dup : {true, false})
        for (int64_t R : {int64_t{8}, int64_t{4}}) {
          SCOPED_TRACE(std::string(interleaved ? "interleaved" : "rotate-half") +
                       (l == RopeLayout::kBSHD ? " bshd" : " bhsd") + (dup ? " duplicated" : " per-column") +
                       " R=" + std::to_string(R));
          const int64_t B = 2, S = 3, Hq = 4, Hk = 2, D = 8;
          Rng rng(hash_str("lib") + uint64_t(R) + (interleaved ? 7 : 0) + (dup ? 11 : 0) + int(l));
          HostTensor q = random_tensor(F64, shape_of(l, B, S, Hq, D), rng);
          HostTensor k = random_tensor(F64, shape_of(l, B, S, Hk, D), rng);
          HostTensor cos, sin;
          tables(B, S, R, interleaved, dup, rng, &cos, &sin);
          HostTensor qo(F64, q.shape), ko(F64, k.shape);
          RopeOptions o;
          o.layout = l;
          o.interleaved = interleaved;
          o.rotary_dim = R;
          TensorView kv = k.view(), kov = ko.view();
          KF_ASSERT_OK(ref::apply_rope(q.view(), &kv, cos.view(), sin.view(), nullptr, o, qo.view(), &kov));
          EXPECT_TRUE(all_close("q_out", qo, library_formula(q, l, Hq, cos, sin, interleaved), Tol{1e-14, 1e-14}));
          EXPECT_TRUE(all_close("k_out", ko, library_formula(k, l, Hk, cos, sin, interleaved), Tol{1e-14, 1e-14}));
        }
}

// <g, F x> == <Bwd g, x> for any cos/sin (the backward is the exact transpose), and Bwd(F x) == x
// when each pair's cos/sin are equal and cos^2 + sin^2 = 1.
TEST(RopeReference, BackwardIsTranspose) {
  for (bool interleaved : {false, true})
    for (bool dup : {true, false}) {
      SCOPED_TRACE(std::string(interleaved ? "interleaved" : "rotate-half") + (dup ? " duplicated" : " per-column"));
      const int64_t B = 2, S = 5, H = 3, D = 12, R = 8;
      Rng rng(hash_str("transpose") + (interleaved ? 1 : 0) + (dup ? 2 : 0));
      HostTensor x = random_tensor(F64, {B, S, H, D}, rng), g = random_tensor(F64, {B, S, H, D}, rng);
      HostTensor cos, sin;
      tables(B, S, R, interleaved, dup, rng, &cos, &sin);
      RopeOptions o;
      o.interleaved = interleaved;
      HostTensor fx(F64, x.shape), bg(F64, x.shape), bfx(F64, x.shape);
      KF_ASSERT_OK(ref::apply_rope(x.view(), nullptr, cos.view(), sin.view(), nullptr, o, fx.view(), nullptr));
      KF_ASSERT_OK(ref::apply_rope_backward(g.view(), nullptr, cos.view(), sin.view(), nullptr, o, bg.view(), nullptr));
      double lhs = 0, rhs = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        lhs += g.get(i) * fx.get(i);
        rhs += bg.get(i) * x.get(i);
      }
      EXPECT_NEAR(lhs, rhs, 1e-11 * (std::fabs(lhs) + 1));
      if (dup) {
        KF_ASSERT_OK(
            ref::apply_rope_backward(fx.view(), nullptr, cos.view(), sin.view(), nullptr, o, bfx.view(), nullptr));
        EXPECT_TRUE(all_close("bwd(fwd(x))", bfx, x, Tol{1e-13, 1e-13}));
      }
    }
}

// position_ids into a cache [max_pos, R] == the gathered [B, S, R] tables; [1, S, R] == [S, R].
TEST(RopeReference, PositionIdsAndBroadcast) {
  const int64_t B = 2, S = 4, H = 2, D = 8, R = 8, P = 10;
  Rng rng(hash_str("pos"));
  HostTensor q = random_tensor(F64, {B, S, H, D}, rng);
  HostTensor cache_c = random_tensor(F64, {P, R}, rng), cache_s = random_tensor(F64, {P, R}, rng);
  HostTensor pos(DType::kInt64, {B, S});
  int64_t* pv = reinterpret_cast<int64_t*>(pos.bytes.data());
  const int64_t ids[] = {0, 9, 3, 3, 7, 1, 2, 5};
  for (int i = 0; i < B * S; ++i) pv[i] = ids[i];
  HostTensor gc(F64, {B, S, R}), gs(F64, {B, S, R});
  for (int64_t i = 0; i < B * S; ++i)
    for (int64_t c = 0; c < R; ++c) {
      gc.set(i * R + c, cache_c.get(pv[i] * R + c));
      gs.set(i * R + c, cache_s.get(pv[i] * R + c));
    }
  HostTensor y1(F64, q.shape), y2(F64, q.shape);
  TensorView pview = pos.view();
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, cache_c.view(), cache_s.view(), &pview, {}, y1.view(), nullptr));
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, gc.view(), gs.view(), nullptr, {}, y2.view(), nullptr));
  EXPECT_TRUE(bit_equal("position_ids vs gathered", y1, y2));

  // [1, S, R] and [S, R]
  HostTensor c2 = random_tensor(F64, {S, R}, rng), s2 = random_tensor(F64, {S, R}, rng);
  HostTensor c3 = c2, s3 = s2;
  c3.shape = {1, S, R};
  s3.shape = {1, S, R};
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, c2.view(), s2.view(), nullptr, {}, y1.view(), nullptr));
  KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, c3.view(), s3.view(), nullptr, {}, y2.view(), nullptr));
  EXPECT_TRUE(bit_equal("[1, S, R] vs [S, R]", y1, y2));

  // out of range: an error naming the position
  pv[5] = P;
  const Status st = ref::apply_rope(q.view(), nullptr, cache_c.view(), cache_s.view(), &pview, {}, y1.view(), nullptr);
  EXPECT_TRUE(has_substrings(st, {"apply_rope: position_ids[1, 1] = 10 is outside the cos/sin cache [0, 10)"}));
  pv[5] = -1;
  EXPECT_FALSE(ref::apply_rope(q.view(), nullptr, cache_c.view(), cache_s.view(), &pview, {}, y1.view(), nullptr).ok());
}

// In place (q_out is q) == out of place; with float32 cos/sin and bfloat16 q each output is the
// float64 result rounded once.
TEST(RopeReference, InPlaceAndOneRounding) {
  const int64_t B = 1, S = 3, H = 2, D = 10, R = 6;
  Rng rng(hash_str("inplace"));
  for (bool interleaved : {false, true}) {
    HostTensor q = random_tensor(DType::kBFloat16, {B, S, H, D}, rng);
    HostTensor cos = random_tensor(DType::kFloat32, {S, R}, rng), sin = random_tensor(DType::kFloat32, {S, R}, rng);
    RopeOptions o;
    o.interleaved = interleaved;
    HostTensor out(DType::kBFloat16, q.shape), q64(F64, q.shape), out64(F64, q.shape);
    for (int64_t i = 0; i < q.numel(); ++i) q64.set(i, q.get(i));
    HostTensor c64(F64, cos.shape), s64(F64, sin.shape);
    for (int64_t i = 0; i < cos.numel(); ++i) c64.set(i, cos.get(i)), s64.set(i, sin.get(i));
    KF_ASSERT_OK(ref::apply_rope(q.view(), nullptr, cos.view(), sin.view(), nullptr, o, out.view(), nullptr));
    KF_ASSERT_OK(ref::apply_rope(q64.view(), nullptr, c64.view(), s64.view(), nullptr, o, out64.view(), nullptr));
    for (int64_t i = 0; i < q.numel(); ++i) EXPECT_EQ(out.get(i), round_to(DType::kBFloat16, out64.get(i))) << i;
    HostTensor inplace = q;
    KF_ASSERT_OK(ref::apply_rope(inplace.view(), nullptr, cos.view(), sin.view(), nullptr, o, inplace.view(), nullptr));
    EXPECT_TRUE(bit_equal("in place vs out of place", inplace, out));
  }
}

}  // namespace
