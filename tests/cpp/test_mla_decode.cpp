// MLA decode (kernelforge::mla_decode, include/kernelforge/mla.h) on the GPU against the float64
// reference (kernelforge::ref::mla_decode), plus the planner and the argument checks.
//
// Every GPU case draws q in [-1, 1) and the cache rows in [-2, 2), fills the rows no sequence uses
// with NaN (a read of one would poison the output), shuffles the block table, and runs the public
// entry (the default plan) and then the same call with the key split forced to 1, 3 and 16 for every
// kernel the GPU runs (each kMlaTiles pipeline depth of the mma.sync kernel it holds; the wgmma kernel
// and its seesaw schedule on sm_90 with the sm_90a image, where the page size allows), each on outputs
// poisoned with NaN. Cases cover page sizes 1, 16, 32, 64, 128 and the contiguous cache (with a padded
// row stride; shorter than one 64-key TMA box), ragged lengths with 0, 1, 7, 4097 and multiples of 64,
// q_len 1 to 8, H = 1, 7 (rows that do not fill a 16-row block), 16, 24 (Lq = 3: a token's rows
// across two row tiles), 32, 64 and 128 (two row tiles; with Lq = 8 sixteen), lengths below Lq and
// beyond the capacity, and block-table entries outside the cache (read as zeros, as the reference does).
//
// Tolerance (u: 2^-8 bfloat16, 2^-11 float16; |v| < 2): out is a convex combination of value rows
// with P rounded to the dtype before P V (at most u |v| = 2u) and rounded once more (u |out| / 2);
// float32 logits over 576 columns are exact to ~2^-16. lse: float32 sums over up to 4097 keys, 2e-3.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "common/device.h"
#include "decode/mla_config.h"
#include "decode/mla_plan.h"
#include "kernelforge/mla.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kf::MlaDecodeOptions;
using kf::MlaDecodePlan;
using kf::MlaDecodeTensors;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType I32 = DType::kInt32;
constexpr int64_t Dk = kf::kMlaHeadDimK, Dv = kf::kMlaHeadDimV;

struct MlaCase {
  std::string name;
  DType dtype = BF16;
  int64_t Lq = 1, H = 16;
  int64_t page = 16;  // 0: contiguous cache
  std::vector<int64_t> lens;
  bool lse = true;
  int64_t bad_page_seq = -1;  // this sequence's first block-table entry points outside the cache
  int64_t max_pages = 0;      // block-table columns (0: enough for the longest sequence)
  float scale = 0.0f;
};

void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }

struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(size_t n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
  }
  ~Buffer() {
    if (ptr) cudaFree(ptr);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

TensorView make_view(void* data, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides, bool cuda) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.device = Device{cuda ? DeviceType::kCUDA : DeviceType::kCPU, 0};
  v.ndim = int(shape.size());
  for (int d = 0; d < v.ndim; ++d) v.shape[d] = shape[d], v.strides[d] = strides[d];
  return v;
}

class MlaDecodeGpu : public ::testing::TestWithParam<MlaCase> {};

TEST_P(MlaDecodeGpu, MatchesReference) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "MLA decode needs sm_80";
  const MlaCase& c = GetParam();
  const int64_t B = int64_t(c.lens.size()), Lq = c.Lq, H = c.H;
  const size_t es = kf::dtype_size(c.dtype);
  Rng rng(hash_str(c.name));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(c.lens.begin(), c.lens.end()));

  // cache geometry: paged [P, page, 576] with 2 spare pages; contiguous [B, cap, 576] with the row
  // stride padded by 8 elements
  const bool paged = c.page > 0;
  const int64_t page = paged ? c.page : longest + 5;
  const int64_t max_pages = !paged ? 1 : (c.max_pages > 0 ? c.max_pages : (longest + page - 1) / page + 1);
  const int64_t P = paged ? B * max_pages + 2 : B;
  const std::vector<int64_t> cshape = {P, page, Dk};
  const std::vector<int64_t> cstr =
      paged ? std::vector<int64_t>{page * Dk, Dk, 1} : std::vector<int64_t>{page * (Dk + 8), Dk + 8, 1};
  const int64_t celems = P * cstr[0];
  std::vector<double> kvh(size_t(celems), std::nan(""));
  std::vector<int32_t> bt(size_t(B * max_pages), 0);
  std::vector<int32_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = P - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint64_t(i + 1)]);
  for (int64_t i = 0; i < B * max_pages; ++i) bt[i] = perm[i];
  if (c.bad_page_seq >= 0) bt[c.bad_page_seq * max_pages] = int32_t(P + 3);
  const int64_t capacity = paged ? max_pages * page : page;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < std::min(c.lens[b], capacity); ++j) {
      const int64_t pg = paged ? bt[b * max_pages + j / page] : b;
      if (pg < 0 || pg >= P) continue;
      for (int64_t e = 0; e < Dk; ++e)
        kvh[pg * cstr[0] + (j % page) * cstr[1] + e] = round_to(c.dtype, rng.uniform(-2.0, 2.0));
    }
  HostTensor kv(c.dtype, {celems});
  for (int64_t i = 0; i < celems; ++i) kv.set(i, kvh[i]);
  HostTensor q = random_tensor(c.dtype, {B, Lq, H, Dk}, rng, -1.0, 1.0);
  HostTensor lens(I32, {B}), table(I32, {B, max_pages});
  for (int64_t b = 0; b < B; ++b) lens.set(b, double(c.lens[b]));
  for (size_t i = 0; i < bt.size(); ++i) table.set(int64_t(i), bt[i]);

  HostTensor out_ref(c.dtype, {B, Lq, H, Dv}), lse_ref(F32, {B, Lq, H});
  const TensorView hq = q.view(), hkv = make_view(kv.bytes.data(), c.dtype, cshape, cstr, false), hl = lens.view(),
                   hb = table.view(), ho = out_ref.view(), hlse = lse_ref.view();
  MlaDecodeTensors rt;
  rt.q = &hq, rt.kv_cache = &hkv, rt.seq_lens = &hl, rt.block_table = paged ? &hb : nullptr;
  rt.out = &ho, rt.lse = c.lse ? &hlse : nullptr;
  MlaDecodeOptions o;
  o.scale = c.scale;
  KF_ASSERT_OK(kf::ref::mla_decode(rt, o));

  DeviceTensor dq(c.dtype, {B, Lq, H, Dk}), dl(I32, {B}), db(I32, {B, max_pages}), dout(c.dtype, {B, Lq, H, Dv}),
      dlse(F32, {B, Lq, H});
  Buffer kvbuf(size_t(celems) * es);
  ASSERT_TRUE(dq.ok() && dl.ok() && db.ok() && dout.ok() && dlse.ok() && kvbuf.ptr);
  dq.upload(q), dl.upload(lens), db.upload(table);
  KF_CUDA_CHECK(cudaMemcpy(kvbuf.ptr, kv.bytes.data(), size_t(celems) * es, cudaMemcpyHostToDevice));
  const TensorView gq = dq.view(), gkv = make_view(kvbuf.ptr, c.dtype, cshape, cstr, true), gl = dl.view(),
                   gb = db.view(), go = dout.view(), glse = dlse.view();
  MlaDecodeTensors t;
  t.q = &gq, t.kv_cache = &gkv, t.seq_lens = &gl, t.block_table = paged ? &gb : nullptr;
  t.out = &go, t.lse = c.lse ? &glse : nullptr;

  const double u = c.dtype == BF16 ? 1.0 / 256 : 1.0 / 2048;
  const Tol tol_out{2 * u, 4 * u + 1e-4};
  const Tol tol_lse{2e-3, 2e-3};

  // the public entry with the default plan first
  {
    dout.poison(), dlse.poison();
    size_t bytes = 0;
    KF_ASSERT_OK(kf::mla_decode(t, o, nullptr, &bytes, nullptr));
    Buffer ws(bytes > 0 ? bytes : 16);
    KF_ASSERT_OK(kf::mla_decode(t, o, ws.ptr, &bytes, nullptr));
    KF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(all_close("out (default plan)", dout.download(), out_ref, tol_out));
  }

  MlaDecodePlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::mla_decode_plan(t, o, &plan, &bytes));
  kf::DecodeParams params;
  DType dt;
  kf::MlaDecodeCall call;
  call.t = t;
  call.opts = o;
  KF_ASSERT_OK(kf::validate_mla_decode(call, &params, &dt));
  int device = 0;
  const kf::DeviceInfo* dev = nullptr;
  KF_ASSERT_OK(kf::current_device_info(&device, &dev));
  // every candidate kernel: the mma.sync depths the GPU holds, both wgmma schedules where they run
  std::vector<MlaDecodePlan> plans = {plan};
  for (const kf::MlaTile& tile : kf::kMlaTiles) {
    if (kf::mla_smem_bytes(tile.stages) > kf::mla_smem_limit(gpu_capability())) continue;
    for (int s : {1, 3, 16}) {
      MlaDecodePlan p;
      p.kernel = kf::MlaKernel::kMmaSync, p.rows = kf::kMlaRows, p.block_n = kf::kMlaBlockN;
      p.warps = kf::kMlaWarps, p.stages = tile.stages, p.splits = s;
      plans.push_back(p);
    }
  }
  const bool image = kf::mla_decode_wgmma_image(c.dtype);
  if (kf::mla_wgmma_unsupported(params, *dev, image).empty()) {
    for (bool seesaw : {false, true})
      for (int s : {1, 3, 16}) {
        MlaDecodePlan p = kf::mla_wgmma_plan(params, *dev, seesaw);
        p.splits = s;
        plans.push_back(p);
      }
  } else if (dev->capability == 90 && image && c.page >= kf::kMlaWgmmaMinPage) {
    ADD_FAILURE() << "the wgmma kernel does not run on this sm_90 GPU: "
                  << kf::mla_wgmma_unsupported(params, *dev, image);
  } else if (dev->capability == 90 && !image) {
    std::printf("note: this build has no sm_90a image of the MLA wgmma kernel; only mma.sync runs\n");
  }
  for (const MlaDecodePlan& p : plans) {
    SCOPED_TRACE(kf::to_string(p));
    dout.poison(), dlse.poison();
    const size_t need = kf::mla_decode_workspace_bytes(p, params);
    Buffer ws(need > 0 ? need : 16);
    KF_ASSERT_OK(kf::mla_decode(p, t, o, ws.ptr, need, nullptr));
    KF_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(all_close("out", dout.download(), out_ref, tol_out));
    if (c.lse) {
      // -inf (a token that sees nothing) must match exactly; all_close refuses infinities
      HostTensor got = dlse.download(), want = lse_ref;
      for (int64_t i = 0; i < got.numel(); ++i)
        if (std::isinf(want.get(i)) && got.get(i) == want.get(i)) got.set(i, 0.0), want.set(i, 0.0);
      EXPECT_TRUE(all_close("lse", got, want, tol_lse));
    }
    EXPECT_TRUE(dout.check_untouched("out"));
  }
}

std::vector<MlaCase> mla_cases() {
  std::vector<MlaCase> v;
  auto add = [&](MlaCase c) { v.push_back(c); };
  for (DType t : {BF16, F16}) {
    const std::string ts = t == BF16 ? "bf16" : "fp16";
    MlaCase c;
    c.dtype = t, c.H = 16, c.lens = {1000, 7, 1, 300};
    c.name = ts + "_h16_p16";
    add(c);
    c.H = 128, c.page = 64, c.lens = {4097, 0, 129};  // two row tiles; 4097 past a split boundary
    c.name = ts + "_h128_p64";
    add(c);
  }
  MlaCase c;
  c.lens = {777, 33, 2000};
  for (int64_t pg : {1, 0}) {
    c.page = pg;
    c.name = "h16_page" + std::to_string(pg);
    add(c);
  }
  c = MlaCase{};
  c.lens = {500, 3, 64}, c.H = 7, c.Lq = 3, c.name = "h7_qlen3";  // 21 rows: a partial second row block
  add(c);
  c.H = 1, c.Lq = 1, c.lens = {50, 0}, c.name = "h1";
  add(c);
  c.H = 32, c.Lq = 4, c.lens = {1500, 90, 4}, c.name = "h32_qlen4";
  add(c);
  c.H = 64, c.Lq = 2, c.lens = {700, 2}, c.name = "h64_qlen2";
  add(c);
  c.H = 128, c.Lq = 8, c.lens = {600, 8}, c.name = "h128_qlen8";  // 1024 rows: 16 row tiles
  add(c);
  c.H = 16, c.Lq = 5, c.lens = {37, 5, 6}, c.page = 0, c.name = "h16_qlen5_contiguous";
  add(c);
  // 72 rows: token 2's rows 48..71 straddle the two row tiles; lengths below Lq (0 < n < 3): the
  // first tokens see no key (out 0, lse -inf) while the later ones of the same tile do
  c.H = 24, c.Lq = 3, c.lens = {130, 2, 1, 3}, c.page = 16, c.name = "h24_qlen3_short";
  add(c);
  // page 32 (two TMA boxes per 64-key tile) with a length ending inside a box; page 128 (a tile is half
  // a page); lengths that are multiples of 64 (no partial last tile)
  c = MlaCase{};
  c.H = 64, c.page = 32, c.lens = {257, 31, 64}, c.name = "h64_page32";
  add(c);
  c.H = 128, c.Lq = 2, c.page = 128, c.lens = {1000, 128, 300}, c.name = "h128_qlen2_page128";
  add(c);
  // the seesaw schedule's pairs of 64-key tiles: an odd tile count with the partial tile even (191: 3
  // tiles), an even count without a partial tile (128), an even count with the partial tile odd (65)
  c.H = 128, c.Lq = 2, c.page = 64, c.lens = {191, 128, 65}, c.name = "h128_qlen2_tile_pairs";
  add(c);
  c = MlaCase{};
  c.lens = {100, 5000, -3};  // 5000 > capacity (clamped), -3 -> 0
  c.max_pages = 8, c.name = "lengths_out_of_range";
  add(c);
  c.max_pages = 0, c.bad_page_seq = 0, c.lens = {100, 40, 60}, c.name = "page_out_of_range";
  add(c);
  c = MlaCase{};
  c.lse = false, c.H = 128, c.lens = {2048}, c.scale = 0.1352f, c.name = "nolse_b1_h128_scale";
  add(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDecodeGpu, ::testing::ValuesIn(mla_cases()),
                         [](const ::testing::TestParamInfo<MlaCase>& i) { return i.param.name; });

// ---- plan --------------------------------------------------------------------------------------

kf::DecodeParams mla_params(int64_t B, int64_t Lq, int64_t H, int64_t max_len, int32_t page = 0) {
  kf::DecodeParams p;
  p.batch = int32_t(B), p.q_len = int32_t(Lq), p.heads_q = int32_t(H), p.heads_kv = 1;
  p.group = int32_t(H), p.rows = p.group * p.q_len, p.head_dim = int32_t(Dk);
  p.capacity = int32_t(max_len), p.max_seq_len = max_len;
  p.k_st = Dk, p.pages = int32_t(B);
  if (page > 0) {  // paged: the planner only tests the table for null
    static const int32_t table = 0;
    p.block_table = &table, p.page_size = page, p.k_sp = page * Dk;
    for (p.page_shift = 0; (1 << p.page_shift) < page; ++p.page_shift) {
    }
  } else {
    p.page_size = int32_t(max_len), p.k_sp = max_len * Dk;
  }
  return p;
}

TEST(MlaDecodePlan, TilesAndSplits) {
  kf::DeviceInfo h100, a100, l4;
  h100.sm_count = 132, h100.capability = 90;
  a100.sm_count = 108, a100.capability = 80;
  l4.sm_count = 58, l4.capability = 89;
  // without the sm_90a image the mma.sync kernel runs on sm_90 too.
  // b64 x kv4k x 128 heads: 128 CTAs (two row tiles per sequence) fill the 132 SMs, no split
  const MlaDecodePlan big = kf::plan_mla_decode(mla_params(64, 1, 128, 4096, 64), h100, false);
  EXPECT_EQ(kf::to_string(big), "mla_decode kernel=mma_sync rows=64 tile=32 warps=8 stages=4 splits=1");
  EXPECT_TRUE(kf::check_mla_decode_plan(big, mla_params(64, 1, 128, 4096, 64), h100, false).ok());
  // batch 1: two CTAs unsplit; the split fills the SMs with >= 256 keys each
  const MlaDecodePlan b1 = kf::plan_mla_decode(mla_params(1, 1, 128, 16384), h100, false);
  EXPECT_GE(b1.splits, 32);
  EXPECT_LE(b1.splits, 66);
  EXPECT_EQ(kf::plan_mla_decode(mla_params(1, 1, 16, 200), h100, false).splits, 1);  // short: not split
  EXPECT_EQ(kf::mla_row_tiles(b1, mla_params(1, 8, 128, 16384)), 16);
  EXPECT_EQ(kf::mla_row_tiles(b1, mla_params(1, 1, 7, 16384)), 1);
  // sm_80: the two-stage tile (163 KB); sm_89 (99 KB): none fits, the check says why
  const MlaDecodePlan a = kf::plan_mla_decode(mla_params(8, 1, 128, 4096), a100, true);
  EXPECT_EQ(a.kernel, kf::MlaKernel::kMmaSync);
  EXPECT_EQ(a.stages, 2);
  EXPECT_TRUE(kf::check_mla_decode_plan(a, mla_params(8, 1, 128, 4096), a100, true).ok());
  for (const kf::Status& st : {kf::check_mla_decode_plan(big, mla_params(64, 1, 128, 4096), a100, false),
                               kf::check_mla_decode_plan(kf::plan_mla_decode(mla_params(8, 1, 128, 4096), l4, false),
                                                         mla_params(8, 1, 128, 4096), l4, false)}) {
    EXPECT_EQ(st.code(), kf::StatusCode::kNotSupported) << st.message();
    EXPECT_TRUE(has_substrings(st, {"bytes of shared memory per block"}));
  }
  MlaDecodePlan bad = big;
  bad.stages = 3;
  KF_EXPECT_INVALID(kf::check_mla_decode_plan(bad, mla_params(64, 1, 128, 4096), h100, false), "no such kernel");
  EXPECT_LE(kf::mla_smem_bytes(4), kf::mla_smem_limit(90));
  EXPECT_LE(kf::mla_smem_bytes(2), kf::mla_smem_limit(80));
  EXPECT_LE(int64_t(kf::MlaWgmmaSmem::kBytes), kf::mla_smem_limit(90));
  EXPECT_EQ(kf::mla_decode_workspace_bytes(big, mla_params(64, 1, 128, 4096)), 0u);
  EXPECT_EQ(kf::mla_decode_workspace_bytes(b1, mla_params(1, 1, 128, 16384)),
            size_t((128 * b1.splits * 512 * 4 + 255) / 256 * 256 + (128 * b1.splits * 4 + 255) / 256 * 256));
}

// The wgmma kernel: sm_90 with the sm_90a image, pages of >= 16 rows or a contiguous cache; 64-key
// tiles in the split model.
TEST(MlaDecodePlan, WgmmaKernel) {
  kf::DeviceInfo h100, a100, b200;
  h100.sm_count = 132, h100.capability = 90;
  a100.sm_count = 108, a100.capability = 80;
  b200.sm_count = 148, b200.capability = 100;
  const kf::DecodeParams big_p = mla_params(64, 1, 128, 4096, 64);
  const MlaDecodePlan big = kf::plan_mla_decode(big_p, h100, true);
  EXPECT_EQ(kf::to_string(big), "mla_decode kernel=wgmma rows=64 tile=64 warps=12 stages=2 splits=1");
  EXPECT_TRUE(kf::check_mla_decode_plan(big, big_p, h100, true).ok());
  for (int32_t page : {16, 32, 128, 0}) {  // 0: contiguous
    const MlaDecodePlan q = kf::plan_mla_decode(mla_params(8, 1, 128, 4096, page), h100, true);
    EXPECT_EQ(q.kernel, kf::MlaKernel::kWgmma) << "page " << page;
  }
  // page sizes below 16, another major, no image: the mma.sync kernel; the check of a wgmma plan says why
  const kf::DecodeParams page8 = mla_params(8, 1, 128, 4096, 8);
  EXPECT_EQ(kf::plan_mla_decode(page8, h100, true).kernel, kf::MlaKernel::kMmaSync);
  EXPECT_EQ(kf::plan_mla_decode(mla_params(8, 1, 128, 4096, 1), h100, true).kernel, kf::MlaKernel::kMmaSync);
  EXPECT_EQ(kf::plan_mla_decode(big_p, b200, true).kernel, kf::MlaKernel::kMmaSync);
  EXPECT_EQ(kf::plan_mla_decode(big_p, h100, false).kernel, kf::MlaKernel::kMmaSync);
  struct Refusal {
    kf::Status st;
    const char* why;
  };
  for (const Refusal& r : {Refusal{kf::check_mla_decode_plan(big, page8, h100, true), "pages of at least 16 rows"},
                           Refusal{kf::check_mla_decode_plan(big, big_p, a100, true), "needs an sm_90 device"},
                           Refusal{kf::check_mla_decode_plan(big, big_p, h100, false), "90a-real"}}) {
    EXPECT_EQ(r.st.code(), kf::StatusCode::kNotSupported) << r.st.message();
    EXPECT_TRUE(has_substrings(r.st, {"wgmma kernel", r.why})) << r.st.message();
  }
  MlaDecodePlan bad = big;
  bad.block_n = 32;
  KF_EXPECT_INVALID(kf::check_mla_decode_plan(bad, big_p, h100, true), "no such kernel");
  bad = big;
  bad.splits = 0;
  KF_EXPECT_INVALID(kf::check_mla_decode_plan(bad, big_p, h100, true), "splits must be 1 to 65535");
  // batch 1 at 16k keys: the split fills the SMs with >= 256 keys (4 tiles of 64) each
  const MlaDecodePlan b1 = kf::plan_mla_decode(mla_params(1, 1, 128, 16384, 64), h100, true);
  EXPECT_EQ(b1.kernel, kf::MlaKernel::kWgmma);
  EXPECT_GE(b1.splits, 32);
  EXPECT_LE(b1.splits, 66);
  EXPECT_EQ(kf::plan_mla_decode(mla_params(1, 1, 16, 200, 64), h100, true).splits, 1);
  EXPECT_EQ(kf::mla_wgmma_plan(big_p, h100).splits, big.splits);
}

// The seesaw schedule of the wgmma kernel: the same tile, limits and split model, named in the plan;
// the planner takes it only when asked (kMlaSeesawByDefault is off until it has run on a GPU).
TEST(MlaDecodePlan, WgmmaSeesawKernel) {
  kf::DeviceInfo h100, a100;
  h100.sm_count = 132, h100.capability = 90;
  a100.sm_count = 108, a100.capability = 80;
  const kf::DecodeParams big_p = mla_params(64, 1, 128, 4096, 64);
  const MlaDecodePlan big = kf::plan_mla_decode(big_p, h100, true, true);
  EXPECT_EQ(kf::to_string(big), "mla_decode kernel=wgmma_seesaw rows=64 tile=64 warps=12 stages=2 splits=1");
  EXPECT_TRUE(kf::check_mla_decode_plan(big, big_p, h100, true).ok());
  EXPECT_EQ(kf::plan_mla_decode(big_p, h100, true).kernel, kf::MlaKernel::kWgmma);  // not asked
  EXPECT_EQ(kf::mla_wgmma_plan(big_p, h100, true).kernel, kf::MlaKernel::kWgmmaSeesaw);
  // where the wgmma kernel does not run, neither does the schedule
  const kf::DecodeParams page8 = mla_params(8, 1, 128, 4096, 8);
  EXPECT_EQ(kf::plan_mla_decode(page8, h100, true, true).kernel, kf::MlaKernel::kMmaSync);
  EXPECT_EQ(kf::plan_mla_decode(big_p, h100, false, true).kernel, kf::MlaKernel::kMmaSync);
  const kf::Status st = kf::check_mla_decode_plan(big, big_p, a100, true);
  EXPECT_EQ(st.code(), kf::StatusCode::kNotSupported) << st.message();
  EXPECT_TRUE(has_substrings(st, {"wgmma kernel", "needs an sm_90 device"})) << st.message();
  MlaDecodePlan bad = big;
  bad.stages = 3;
  KF_EXPECT_INVALID(kf::check_mla_decode_plan(bad, big_p, h100, true), "no such kernel is built (wgmma_seesaw");
  const MlaDecodePlan b1 = kf::plan_mla_decode(mla_params(1, 1, 128, 16384, 64), h100, true, true);
  EXPECT_EQ(b1.kernel, kf::MlaKernel::kWgmmaSeesaw);
  EXPECT_EQ(b1.splits, kf::plan_mla_decode(mla_params(1, 1, 128, 16384, 64), h100, true).splits);
  EXPECT_LE(int64_t(kf::MlaSeesawSmem::kBytes), kf::mla_smem_limit(90));
}

// ---- validation --------------------------------------------------------------------------------

struct MlaViews {
  TensorView q = cuda_view(BF16, {2, 1, 16, 576}, 0, uintptr_t{1} << 40);
  TensorView kv = cuda_view(BF16, {16, 64, 576}, 0, uintptr_t{2} << 40);
  TensorView lens = cuda_view(I32, {2}, 0, uintptr_t{4} << 40);
  TensorView bt = cuda_view(I32, {2, 8}, 0, uintptr_t{5} << 40);
  TensorView out = cuda_view(BF16, {2, 1, 16, 512}, 0, uintptr_t{6} << 40);
  TensorView lse = cuda_view(F32, {2, 1, 16}, 0, uintptr_t{7} << 40);
  MlaDecodeTensors t() const {
    MlaDecodeTensors x;
    x.q = &q, x.kv_cache = &kv, x.seq_lens = &lens, x.block_table = &bt, x.out = &out, x.lse = &lse;
    return x;
  }
};

kf::Status validate(const MlaDecodeTensors& t, MlaDecodeOptions o = {}) {
  kf::MlaDecodeCall c;
  c.t = t;
  c.opts = o;
  kf::DecodeParams p;
  DType d;
  return kf::validate_mla_decode(c, &p, &d);
}

TEST(MlaDecodeValidation, AcceptsAndRejects) {
  {
    MlaViews w;
    EXPECT_TRUE(validate(w.t()).ok()) << validate(w.t()).message();
    kf::MlaDecodeCall c;
    c.t = w.t();
    kf::DecodeParams p;
    DType d;
    KF_ASSERT_OK(kf::validate_mla_decode(c, &p, &d));
    EXPECT_EQ(p.group, 16);
    EXPECT_EQ(p.rows, 16);
    EXPECT_EQ(p.head_dim, 576);
    EXPECT_EQ(p.capacity, 8 * 64);
    EXPECT_FLOAT_EQ(p.scale, float(1.0 / 24.0));
  }
  auto expect = [](MlaViews x, const char* msg) { KF_EXPECT_INVALID(validate(x.t()), msg); };
  {
    MlaViews x;
    x.q = cuda_view(BF16, {2, 16, 576});
    expect(x, "q must have 4 dimensions");
  }
  {
    MlaViews x;
    x.q = cuda_view(BF16, {2, 1, 16, 512}, 0, uintptr_t{1} << 40);
    expect(x, "q's last dimension must be 576");
  }
  {
    MlaViews x;
    x.kv = cuda_view(BF16, {16, 64, 1, 576}, 0, uintptr_t{2} << 40);
    expect(x, "kv_cache must have 3 dimensions");
  }
  {
    MlaViews x;
    x.kv = cuda_view(BF16, {16, 64, 512}, 0, uintptr_t{2} << 40);
    expect(x, "kv_cache's last dimension must be 576");
  }
  {
    MlaViews x;
    x.kv.dtype = F16;
    expect(x, "kv_cache must have q's dtype");
  }
  {
    MlaViews x;
    x.q = cuda_view(BF16, {2, 9, 16, 576}, 0, uintptr_t{1} << 40);
    x.out = cuda_view(BF16, {2, 9, 16, 512}, 0, uintptr_t{6} << 40);
    expect(x, "1 to 8 new tokens");
  }
  {
    MlaViews x;
    x.q = cuda_view(BF16, {2, 1, 129, 576}, 0, uintptr_t{1} << 40);
    expect(x, "1 to 128 heads");
  }
  {
    MlaViews x;
    x.out = cuda_view(BF16, {2, 1, 16, 576}, 0, uintptr_t{6} << 40);
    expect(x, "out must have shape [2, 1, 16, 512]");
  }
  {
    MlaViews x;
    x.lse = cuda_view(F32, {2, 16}, 0, uintptr_t{7} << 40);
    expect(x, "lse must have 3 dimensions");
  }
  {
    MlaViews x;
    x.lens.dtype = DType::kInt64;
    expect(x, "seq_lens must be int32");
  }
  {
    MlaViews x;
    x.kv = cuda_view(BF16, {16, 48, 576}, 0, uintptr_t{2} << 40);
    expect(x, "kv_cache's page size (dimension 1) must be a power of two");
  }
  {
    MlaViews x;
    x.kv.data = reinterpret_cast<void*>((uintptr_t{2} << 40) + 2);
    expect(x, "kv_cache must start at a 16-byte aligned address");
  }
  {
    MlaViews x;
    x.q.data = reinterpret_cast<void*>((uintptr_t{1} << 40) + 8);
    expect(x, "q must start at a 16-byte aligned address with strides that are multiples of 8");
  }
  {
    MlaViews x;
    MlaDecodeTensors t = x.t();
    t.block_table = nullptr;  // contiguous: 16 pages >= 2 sequences
    EXPECT_TRUE(validate(t).ok());
    x.kv = cuda_view(BF16, {1, 64, 576}, 0, uintptr_t{2} << 40);
    t = x.t();
    t.block_table = nullptr;
    KF_EXPECT_INVALID(validate(t), "kv_cache must hold at least one page per sequence");
  }
  {
    MlaViews x;
    MlaDecodeOptions o;
    o.scale = -1.0f;
    KF_EXPECT_INVALID(validate(x.t(), o), "scale must be finite");
    o.scale = 0.0f, o.max_seq_len = -5;
    KF_EXPECT_INVALID(validate(x.t(), o), "max_seq_len must be >= 0");
  }
}

// The CPU reference on a hand-checkable case: one key row, so out = its first 512 columns, lse = its
// logit; a token that sees nothing gets 0 and -inf.
TEST(MlaDecodeReference, OneKey) {
  const int64_t H = 2;
  HostTensor q(F32, {2, 1, H, Dk}), kv(F32, {2, 4, Dk}), lens(I32, {2}), out(F32, {2, 1, H, Dv}), lse(F32, {2, 1, H});
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, (i % 7) * 0.125 - 0.25);
  for (int64_t i = 0; i < kv.numel(); ++i) kv.set(i, (i % 5) * 0.25 - 0.5);
  lens.set(0, 1), lens.set(1, 0);
  const TensorView vq = q.view(), vkv = kv.view(), vl = lens.view(), vo = out.view(), vlse = lse.view();
  MlaDecodeTensors t;
  t.q = &vq, t.kv_cache = &vkv, t.seq_lens = &vl, t.out = &vo, t.lse = &vlse;
  KF_ASSERT_OK(kf::ref::mla_decode(t, {}));
  for (int64_t h = 0; h < H; ++h) {
    double dot = 0.0;
    for (int64_t e = 0; e < Dk; ++e) dot += q.get(h * Dk + e) * kv.get(e);
    EXPECT_NEAR(lse.get(h), dot / 24.0, 1e-5);
    for (int64_t e = 0; e < Dv; ++e) EXPECT_EQ(out.get(h * Dv + e), kv.get(e));
    EXPECT_TRUE(std::isinf(lse.get(H + h)) && lse.get(H + h) < 0);
    for (int64_t e = 0; e < Dv; ++e) EXPECT_EQ(out.get((H + h) * Dv + e), 0.0);
  }
}

}  // namespace
