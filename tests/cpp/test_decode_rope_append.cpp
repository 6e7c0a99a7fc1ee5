// rope_kv_append: the float64 reference against a hand-computed case, the argument checks, and the
// kernel against the reference on the GPU.
//
// GPU cases: page sizes 1, 16, 64 and the contiguous cache (a static cache's padded head stride), Lq
// 1 to 8, GQA 1 to 7, rotary_dim = D and < D, bfloat16 / float16 with float32 and same-dtype tables, q
// rotated into a separate output or in place, q / k / v rows padded to strides that force the 4- and
// 2-byte paths, and out-of-range inputs (a length past the capacity, a negative one, positions past
// the table, a block-table entry outside the cache). q_out's allocation is poisoned with NaN (its
// padding must stay untouched); cache rows other than the appended ones must keep their bits.
// Tolerance: the kernel rounds its float32 result once, the reference its float64 one: at most one
// unit in the last place apart (u), plus float32's cancellation error near 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "decode/decode_problem.h"
#include "kernelforge/decode.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kf::RopeKvAppendTensors;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType F64 = DType::kFloat64;
constexpr DType I32 = DType::kInt32;

TensorView host_view(void* data, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides, bool cuda) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.device = Device{cuda ? DeviceType::kCUDA : DeviceType::kCPU, 0};
  v.ndim = int(shape.size());
  for (int d = 0; d < v.ndim; ++d) v.shape[d] = shape[d], v.strides[d] = strides[d];
  return v;
}

// ---- the reference by hand ---------------------------------------------------------------------
// One sequence, 2 new tokens at positions 1 and 2 (seq_lens 3), one q and one kv head, D = 6, R = 4:
// pairs (0, 2) and (1, 3), columns 4 and 5 passed through. Table rows (HF layout, halves equal):
//   row 0: cos [1, 1], sin [0, 0]; row 1: cos [0, 1], sin [1, 0]; row 2: cos [-1, 0.5], sin [0, 0.25].
struct HandCase {
  HostTensor q{F64, {1, 2, 1, 6}}, qo{F64, {1, 2, 1, 6}}, k{F64, {1, 2, 1, 6}}, v{F64, {1, 2, 1, 6}};
  HostTensor cos{F64, {3, 4}}, sin{F64, {3, 4}}, kc{F64, {1, 4, 1, 6}}, vc{F64, {1, 4, 1, 6}}, lens{I32, {1}};
  TensorView qv, qov, kv, vv, cv, sv, kcv, vcv, lv;
  HandCase(int32_t len) {
    const double qh[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    const double kh[12] = {2, 0, 0, 1, 7, 8, 1, 1, 1, 1, 9, 9};
    for (int i = 0; i < 12; ++i) q.set(i, qh[i]), k.set(i, kh[i]), v.set(i, 10 + i);
    const double c[3][2] = {{1, 1}, {0, 1}, {-1, 0.5}}, s[3][2] = {{0, 0}, {1, 0}, {0, 0.25}};
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 4; ++j) cos.set(r * 4 + j, c[r][j % 2]), sin.set(r * 4 + j, s[r][j % 2]);
    for (int i = 0; i < 24; ++i) kc.set(i, -7), vc.set(i, -7);
    lens.set(0, len);
    qv = q.view(), qov = qo.view(), kv = k.view(), vv = v.view(), cv = cos.view(), sv = sin.view();
    kcv = kc.view(), vcv = vc.view(), lv = lens.view();
  }
  RopeKvAppendTensors t() const {
    RopeKvAppendTensors x;
    x.q = &qv, x.q_out = &qov, x.k = &kv, x.v = &vv, x.cos = &cv, x.sin = &sv, x.k_cache = &kcv, x.v_cache = &vcv;
    x.seq_lens = &lv;
    return x;
  }
  std::vector<double> row(const HostTensor& h, int r) const {
    std::vector<double> o(6);
    for (int e = 0; e < 6; ++e) o[e] = h.get(r * 6 + e);
    return o;
  }
};

TEST(DecodeReferenceRopeAppend, HandComputed) {
  using Row = std::vector<double>;
  HandCase h(3);
  KF_ASSERT_OK(kf::ref::rope_kv_append(h.t()));
  EXPECT_EQ(h.row(h.qo, 0), (Row{-3, 2, 1, 4, 5, 6}));  // position 1: pair (0, 2) by 90 degrees
  EXPECT_EQ(h.row(h.qo, 1), (Row{-1, 0, -3, 2.5, 5, 6}));
  EXPECT_EQ(h.row(h.kc, 0), (Row{-7, -7, -7, -7, -7, -7}));  // row 0 is not a new token's
  EXPECT_EQ(h.row(h.kc, 1), (Row{0, 0, 2, 1, 7, 8}));
  EXPECT_EQ(h.row(h.kc, 2), (Row{-1, 0.25, -1, 0.75, 9, 9}));
  EXPECT_EQ(h.row(h.kc, 3), (Row{-7, -7, -7, -7, -7, -7}));
  EXPECT_EQ(h.row(h.vc, 1), (Row{10, 11, 12, 13, 14, 15}));  // v unrotated
  EXPECT_EQ(h.row(h.vc, 2), (Row{16, 17, 18, 19, 20, 21}));
  EXPECT_EQ(h.row(h.q, 0), (Row{1, 2, 3, 4, 5, 6}));  // q itself unchanged

  // in place: q_out is q
  HandCase in(3);
  RopeKvAppendTensors t = in.t();
  t.q_out = &in.qv;
  KF_ASSERT_OK(kf::ref::rope_kv_append(t));
  EXPECT_EQ(in.row(in.q, 1), (Row{-1, 0, -3, 2.5, 5, 6}));

  // seq_lens 5: positions 3 and 4 read the last table row (2); position 4 is past the capacity of 4
  HandCase over(5);
  KF_ASSERT_OK(kf::ref::rope_kv_append(over.t()));
  EXPECT_EQ(over.row(over.qo, 0), (Row{-1, 0, -3, 2.5, 5, 6}));
  EXPECT_EQ(over.row(over.kc, 3), (Row{-2, -0.25, 0, 0.5, 7, 8}));  // k token 0 = [2, 0, 0, 1] by row 2
  EXPECT_EQ(over.row(over.vc, 3), (Row{10, 11, 12, 13, 14, 15}));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(over.row(over.kc, r), (Row{-7, -7, -7, -7, -7, -7}));

  // an empty slot (seq_lens 0): no cache row, q rotated by row 0 (the identity here)
  HandCase empty(0);
  KF_ASSERT_OK(kf::ref::rope_kv_append(empty.t()));
  EXPECT_EQ(empty.row(empty.qo, 1), (Row{1, 2, 3, 4, 5, 6}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(empty.row(empty.kc, r), (Row{-7, -7, -7, -7, -7, -7}));
}

// ---- validation --------------------------------------------------------------------------------

struct RopeViews {
  TensorView q = cuda_view(BF16, {2, 1, 8, 128}, 0, uintptr_t{1} << 40);
  TensorView qo = cuda_view(BF16, {2, 1, 8, 128}, 0, uintptr_t{2} << 40);
  TensorView k = cuda_view(BF16, {2, 1, 2, 128}, 0, uintptr_t{3} << 40);
  TensorView v = cuda_view(BF16, {2, 1, 2, 128}, 0, uintptr_t{4} << 40);
  TensorView cos = cuda_view(F32, {4096, 128}, 0, uintptr_t{5} << 40);
  TensorView sin = cuda_view(F32, {4096, 128}, 0, uintptr_t{6} << 40);
  TensorView kc = cuda_view(BF16, {16, 16, 2, 128}, 0, uintptr_t{7} << 40);
  TensorView vc = cuda_view(BF16, {16, 16, 2, 128}, 0, uintptr_t{8} << 40);
  TensorView lens = cuda_view(I32, {2}, 0, uintptr_t{9} << 40);
  TensorView bt = cuda_view(I32, {2, 8}, 0, uintptr_t{10} << 40);
  RopeKvAppendTensors t() const {
    RopeKvAppendTensors x;
    x.q = &q, x.q_out = &qo, x.k = &k, x.v = &v, x.cos = &cos, x.sin = &sin, x.k_cache = &kc, x.v_cache = &vc;
    x.seq_lens = &lens, x.block_table = &bt;
    return x;
  }
};

kf::Status validate(const RopeKvAppendTensors& t) {
  kf::RopeKvAppendParams p;
  DType d, c;
  return kf::validate_rope_kv_append("rope_kv_append", true, t, &p, &d, &c);
}

TEST(DecodeValidationRopeAppend, AcceptsAndRejects) {
  RopeViews w;
  EXPECT_TRUE(validate(w.t()).ok()) << validate(w.t()).message();
  {
    RopeViews x;  // in place, same-dtype tables, a partial rotary dim, GQA 7
    x.qo = x.q, x.cos = cuda_view(BF16, {100, 64}, 0, uintptr_t{5} << 40);
    x.sin = cuda_view(BF16, {100, 64}, 0, uintptr_t{6} << 40);
    x.q = cuda_view(BF16, {2, 1, 7, 128}, 0, uintptr_t{1} << 40), x.qo = x.q;
    kf::RopeKvAppendParams p;
    DType d, c;
    KF_ASSERT_OK(kf::validate_rope_kv_append("rope_kv_append", true, x.t(), &p, &d, &c));
    EXPECT_TRUE(p.q_inplace);
    EXPECT_EQ(p.rot_dim, 64);
    EXPECT_EQ(p.max_pos, 100);
    EXPECT_EQ(c, BF16);
  }
  {
    RopeViews x;
    x.q = cuda_view(BF16, {2, 8, 128});
    KF_EXPECT_INVALID(validate(x.t()), "rope_kv_append: q must have 4 dimensions");
  }
  {
    RopeViews x;
    x.q.dtype = F16;
    KF_EXPECT_INVALID(validate(x.t()), "q must have k's dtype");
  }
  {
    RopeViews x;
    x.q = cuda_view(BF16, {2, 2, 8, 128}, 0, uintptr_t{1} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "q must have k's batch, new tokens and head dim [2, 1, Hq, 128]");
  }
  {
    RopeViews x;
    x.qo = cuda_view(BF16, {2, 1, 4, 128}, 0, uintptr_t{2} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "q_out must have q's shape");
  }
  {
    RopeViews x;
    x.qo.data = reinterpret_cast<void*>((uintptr_t{1} << 40) + 256);  // inside q, not q itself
    KF_EXPECT_INVALID(validate(x.t()), "q_out overlaps q without being q itself");
  }
  {
    RopeViews x;
    x.qo.strides[2] = 0;
    KF_EXPECT_INVALID(validate(x.t()), "q_out has overlapping elements");
  }
  {
    RopeViews x;
    x.cos = cuda_view(F32, {128}, 0, uintptr_t{5} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "cos must have 2 dimensions [max_pos, rotary_dim]");
  }
  {
    RopeViews x;
    x.sin = cuda_view(F32, {4096, 64}, 0, uintptr_t{6} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "sin must have cos's shape [4096, 128]");
  }
  {
    RopeViews x;
    x.cos.dtype = F16, x.sin.dtype = F16;
    KF_EXPECT_INVALID(validate(x.t()), "cos must be float32 or q's dtype (bfloat16), got float16");
  }
  {
    RopeViews x;
    x.sin.dtype = BF16;
    KF_EXPECT_INVALID(validate(x.t()), "sin must have cos's dtype");
  }
  for (int64_t rd : {0, 3, 130}) {
    RopeViews x;
    x.cos = cuda_view(F32, {4096, rd}, 0, uintptr_t{5} << 40);
    x.sin = cuda_view(F32, {4096, rd}, 0, uintptr_t{6} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "rotary_dim (dimension 1) must be even and within [2, 128]");
  }
  {
    RopeViews x;
    x.cos = cuda_view(F32, {0, 128}, 0, uintptr_t{5} << 40);
    x.sin = cuda_view(F32, {0, 128}, 0, uintptr_t{6} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "cos must have 1 to 2^31 - 1 positions");
  }
  {
    RopeViews x;  // kv_append's own checks come first, under this entry's name
    x.v = cuda_view(BF16, {2, 1, 2, 64}, 0, uintptr_t{4} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "rope_kv_append: v must have k's shape");
  }
  {
    RopeViews x;
    x.lens.dtype = DType::kInt64;
    KF_EXPECT_INVALID(validate(x.t()), "rope_kv_append: seq_lens must be int32");
  }
  {
    RopeViews x;
    RopeKvAppendTensors t = x.t();
    t.q_out = nullptr;
    KF_EXPECT_INVALID(validate(t), "q_out must not be null");
  }
}

// ---- GPU against the reference -------------------------------------------------------------------

struct RopeCase {
  std::string name;
  DType dtype = BF16;
  DType cs = F32;  // F32 or the dtype itself
  int64_t Lq = 1, Hq = 8, Hkv = 2, D = 128, R = 128;
  int64_t page = 16;  // 0: contiguous (a static cache's strides)
  std::vector<int64_t> lens = {5, 0, 17, 33};
  int64_t max_pos = 0;    // table rows (0: the capacity + 3)
  int64_t max_pages = 0;  // 0: enough for the longest sequence
  int64_t pad = 0;        // row padding of q, k, v, q_out and the tables (1: 2-byte path, 2: 4-byte path)
  bool inplace = false;
  int64_t bad_page_seq = -1;
};

void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.name; }

class DecodeGpuRopeAppend : public ::testing::TestWithParam<RopeCase> {};

// |got - want| <= u |want| + 2^-20 element by element, where `written` marks the elements the call
// may change; every other element must keep its bits.
::testing::AssertionResult rows_match(const char* what, const std::vector<unsigned char>& got,
                                      const std::vector<unsigned char>& want, const std::vector<bool>& written, DType t,
                                      double u) {
  const size_t es = kf::dtype_size(t);
  for (size_t i = 0; i < written.size(); ++i) {
    const bool same = std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0;
    if (same) continue;
    const double g = load(got.data(), t, int64_t(i)), w = load(want.data(), t, int64_t(i));
    if (!written[i])
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is no new row's and changed (" << g << ", was " << w << ")";
    if (!(std::fabs(g - w) <= u * std::fabs(w) + 1.0 / (1 << 20)))
      return ::testing::AssertionFailure() << what << ": element " << i << " is " << g << ", the reference " << w;
  }
  return ::testing::AssertionSuccess();
}

TEST_P(DecodeGpuRopeAppend, MatchesReference) {
  KF_NEED_GPU();
  const RopeCase& c = GetParam();
  if (c.dtype == BF16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
  const int64_t B = int64_t(c.lens.size()), Lq = c.Lq, Hq = c.Hq, Hkv = c.Hkv, D = c.D, R = c.R;
  Rng rng(hash_str(c.name));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(c.lens.begin(), c.lens.end()));

  // cache: paged [P, page, Hkv, D] with 2 spare pages, shuffled table; contiguous [B, cap, Hkv, D]
  // with the head stride padded by 8 (a transposed static cache). Every element starts random.
  const bool paged = c.page > 0;
  const int64_t page = paged ? c.page : longest + 5;
  const int64_t max_pages = !paged ? 1 : (c.max_pages > 0 ? c.max_pages : (longest + page - 1) / page + 1);
  const int64_t P = paged ? B * max_pages + 2 : B;
  const std::vector<int64_t> cshape = {P, page, Hkv, D};
  const std::vector<int64_t> cstr = paged ? std::vector<int64_t>{page * Hkv * D, Hkv * D, D, 1}
                                          : std::vector<int64_t>{Hkv * page * (D + 8), D + 8, page * (D + 8), 1};
  const int64_t celems = P * cstr[0];
  HostTensor kc(c.dtype, {celems}), vc(c.dtype, {celems});
  for (int64_t i = 0; i < celems; ++i)
    kc.set(i, round_to(c.dtype, rng.uniform(-3, 3))), vc.set(i, round_to(c.dtype, rng.uniform(-3, 3)));
  std::vector<int32_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = P - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint64_t(i + 1)]);
  HostTensor lens(I32, {B}), table(I32, {B, max_pages});
  for (int64_t i = 0; i < B * max_pages; ++i) table.set(i, perm[i]);
  if (c.bad_page_seq >= 0) table.set(c.bad_page_seq * max_pages + (c.lens[c.bad_page_seq] - 1) / page, P + 3);
  for (int64_t b = 0; b < B; ++b) lens.set(b, double(c.lens[b]));
  const int64_t capacity = paged ? max_pages * page : page;
  const int64_t max_pos = c.max_pos > 0 ? c.max_pos : capacity + 3;

  // HF tables: angle p * 10000^(-2i / R) for i < R / 2, the row's two halves equal
  HostTensor cos(c.cs, {max_pos, R}), sin(c.cs, {max_pos, R});
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t j = 0; j < R; ++j) {
      const double a = double(p) * std::pow(10000.0, -2.0 * double(j % (R / 2)) / double(R));
      cos.set(p * R + j, round_to(c.cs, std::cos(a))), sin.set(p * R + j, round_to(c.cs, std::sin(a)));
    }
  HostTensor q = random_tensor(c.dtype, {B, Lq, Hq, D}, rng), k = random_tensor(c.dtype, {B, Lq, Hkv, D}, rng),
             v = random_tensor(c.dtype, {B, Lq, Hkv, D}, rng);

  // reference on host copies
  HostTensor q_ref(c.dtype, {B, Lq, Hq, D}), kc_ref = kc, vc_ref = vc;
  {
    const TensorView hq = q.view(), hqo = q_ref.view(), hk = k.view(), hv = v.view(), hc = cos.view(), hs = sin.view(),
                     hkc = host_view(kc_ref.bytes.data(), c.dtype, cshape, cstr, false),
                     hvc = host_view(vc_ref.bytes.data(), c.dtype, cshape, cstr, false), hl = lens.view(),
                     hb = table.view();
    RopeKvAppendTensors rt;
    rt.q = &hq, rt.q_out = &hqo, rt.k = &hk, rt.v = &hv, rt.cos = &hc, rt.sin = &hs, rt.k_cache = &hkc;
    rt.v_cache = &hvc, rt.seq_lens = &hl, rt.block_table = paged ? &hb : nullptr;
    KF_ASSERT_OK(kf::ref::rope_kv_append(rt));
  }
  // the cache elements a call may change: the new tokens' rows (the reference's rule)
  std::vector<bool> written(static_cast<size_t>(celems), false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Lq; ++t) {
      const int64_t pos = c.lens[b] - Lq + t;
      if (pos < 0 || pos >= capacity) continue;
      const int64_t pg = paged ? int64_t(table.get(b * max_pages + pos / page)) : b;
      if (pg < 0 || pg >= P) continue;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t e = 0; e < D; ++e) written[size_t(pg * cstr[0] + (pos % page) * cstr[1] + h * cstr[2] + e)] = true;
    }

  const Layout lay{c.pad, 0};
  DeviceTensor dq(c.dtype, {B, Lq, Hq, D}, lay), dqo(c.dtype, {B, Lq, Hq, D}, Layout{c.pad, 8}),
      dk(c.dtype, {B, Lq, Hkv, D}, lay), dv(c.dtype, {B, Lq, Hkv, D}, lay), dc(c.cs, {max_pos, R}, lay),
      ds(c.cs, {max_pos, R}, lay), dl(I32, {B}), db(I32, {B, max_pages}), dkc(c.dtype, {celems}),
      dvc(c.dtype, {celems});
  ASSERT_TRUE(dq.ok() && dqo.ok() && dk.ok() && dv.ok() && dc.ok() && ds.ok() && dl.ok() && db.ok() && dkc.ok() &&
              dvc.ok());
  dq.upload(q), dk.upload(k), dv.upload(v), dc.upload(cos), ds.upload(sin), dl.upload(lens), db.upload(table);
  dkc.upload(kc), dvc.upload(vc);
  const TensorView gq = dq.view(), gqo = c.inplace ? dq.view() : dqo.view(), gk = dk.view(), gv = dv.view(),
                   gc = dc.view(), gs = ds.view(), gl = dl.view(), gb = db.view(),
                   gkc = host_view(dkc.view().data, c.dtype, cshape, cstr, true),
                   gvc = host_view(dvc.view().data, c.dtype, cshape, cstr, true);
  RopeKvAppendTensors t;
  t.q = &gq, t.q_out = &gqo, t.k = &gk, t.v = &gv, t.cos = &gc, t.sin = &gs, t.k_cache = &gkc, t.v_cache = &gvc;
  t.seq_lens = &gl, t.block_table = paged ? &gb : nullptr;
  KF_ASSERT_OK(kf::rope_kv_append(t, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());

  // one unit in the last place: the kernel rotates in float32 and rounds once, the reference in float64,
  // so a value near a rounding midpoint may land one ulp apart (2^-7 relative for bf16, 2^-10 for fp16)
  const double u = c.dtype == BF16 ? 1.0 / 128 : 1.0 / 1024;
  const HostTensor got_q = c.inplace ? dq.download() : dqo.download();
  EXPECT_TRUE(
      rows_match("q_out", got_q.bytes, q_ref.bytes, std::vector<bool>(size_t(q_ref.numel()), true), c.dtype, u));
  EXPECT_TRUE(c.inplace ? dq.check_untouched("q") : dqo.check_untouched("q_out"));
  if (!c.inplace) {
    EXPECT_TRUE(bit_equal("q", dq.download(), q));  // the input is not written
  }
  EXPECT_TRUE(rows_match("k_cache", dkc.download().bytes, kc_ref.bytes, written, c.dtype, u));
  EXPECT_TRUE(bit_equal("v_cache", dvc.download(), vc_ref));  // v is copied, every other row kept
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> v;
  for (DType t : {BF16, F16})
    for (DType cs : {F32, t}) {
      RopeCase c;
      c.dtype = t, c.cs = cs;
      c.name = std::string(t == BF16 ? "bf16" : "fp16") + (cs == F32 ? "_cosf32" : "_cossame") + "_p16";
      v.push_back(c);
      c.page = 1, c.Lq = 4, c.Hq = 32, c.Hkv = 8, c.R = 64, c.lens = {4, 9, 70};
      c.name += "_p1_q4_gqa4_rd64";
      v.push_back(c);
    }
  RopeCase c;
  c.page = 64, c.Lq = 8, c.Hq = 7, c.Hkv = 1, c.D = 64, c.R = 32, c.lens = {8, 130, 64};
  c.name = "p64_q8_group7_d64_rd32";
  v.push_back(c);
  c = RopeCase{};
  c.page = 0, c.Lq = 3, c.Hq = 16, c.Hkv = 4, c.D = 256, c.R = 256, c.lens = {3, 50, 11};
  c.name = "contiguous_q3_d256";
  v.push_back(c);
  for (int64_t lq : {2, 5, 6, 7}) {
    c = RopeCase{};
    c.Lq = lq, c.lens = {lq, 40, lq + 16};
    c.name = "p16_q" + std::to_string(lq);
    v.push_back(c);
  }
  c = RopeCase{};
  c.Lq = 2, c.inplace = true, c.name = "inplace_q2", c.lens = {2, 31, 18};
  v.push_back(c);
  c.page = 0, c.R = 96, c.name = "inplace_contiguous_rd96";
  v.push_back(c);
  c = RopeCase{};
  c.pad = 2, c.Lq = 2, c.name = "pad2_vec2", c.lens = {2, 31, 18};
  v.push_back(c);
  c.pad = 1, c.D = 64, c.R = 6, c.name = "pad1_vec1_rd6";
  v.push_back(c);
  c.pad = 0, c.D = 64, c.R = 20, c.cs = F16, c.dtype = F16, c.name = "fp16_rd20_vec2";  // R / 2 = 10: 4-byte path
  v.push_back(c);
  c = RopeCase{};  // 5000 > capacity (skipped), -3 (skipped, q at row 0), positions 60.. past a 64-row table
  c.Lq = 4, c.max_pages = 8, c.max_pos = 64, c.lens = {100, 5000, -3, 62}, c.name = "out_of_range";
  v.push_back(c);
  c.lens = {100, 40, 60}, c.bad_page_seq = 1, c.max_pos = 0, c.name = "page_out_of_range";
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeGpuRopeAppend, ::testing::ValuesIn(rope_cases()),
                         [](const ::testing::TestParamInfo<RopeCase>& i) { return i.param.name; });

}  // namespace
