// The decode family on the GPU against the float64 reference (kernelforge::ref::decode_attention,
// ref::kv_append), plus the planner and the argument checks.
//
// Every GPU case draws q, k in [-2, 2) and v in [-1, 1), fills the pages no sequence uses, the rows
// past each length and the rows no query may see (before key_starts, before every row's window) with
// NaN (a read of one would poison the output), shuffles the block table, and runs the planner's plan
// and then every candidate tile of its head dim (decode_candidate_plans: the cp.async tiles, and the
// TMA tiles on an sm_90 device with a 90a build where the call allows them) with the key split forced
// to 1, 3 and 16, each on outputs poisoned with NaN, all on one workspace zeroed once: after every call
// the split merge's counters must be zero again. Cases cover page sizes 1, 16, 64, 128 and the
// contiguous cache (with a padded head stride, as transformers' static cache gives), ragged lengths
// with 0, 1, 7 and 4097, q_len 1 to 8,
// GQA groups 1, 4, 7, 8, 16, head dims 64, 128, 256, window, softcap, sinks (float32 and q's dtype),
// lengths beyond the capacity and block-table entries outside the cache, past it and negative
// (clamped / read as zeros, as the reference does), batch 1 at 32k keys split up to 128 ways, a split call captured
// into a CUDA graph and replayed, and page size 1 at 8 and 12 kv heads and at 16 rows per kv head (the
// head-group kernel's full, partial and idle warps).
//
// Tolerance (u: 2^-8 bfloat16, 2^-11 float16; |v| < 1): out is a convex combination of v rows with
// P rounded to the dtype before P V (at most 2u) and rounded once more (u |out|); float32 logits
// move P by e^(2 eps) with eps ~ 2^-14; softcap c adds c 2^-10 per logit (tanh.approx.f32).
// lse: float32 sums over up to 4097 keys, 2e-3.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/device.h"
#include "decode/decode_config.h"
#include "decode/decode_plan.h"
#include "kernelforge/decode.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using kf::DecodeOptions;
using kf::DecodePlan;
using kf::DecodeTensors;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;
constexpr DType I32 = DType::kInt32;

enum class Sinks { kNone, kFloat32, kSameDtype };

struct DecodeCase {
  std::string name;
  DType dtype = BF16;
  int64_t Lq = 1, Hq = 8, Hkv = 2, D = 128;
  int64_t page = 16;  // 0: contiguous cache
  std::vector<int64_t> lens;
  int64_t wl = -1;
  float softcap = 0.0f;
  Sinks sinks = Sinks::kNone;
  bool lse = true;
  int64_t bad_page_seq = -1;      // this sequence's first block-table entry points outside the cache:
  int32_t bad_page_entry = 3;     // to P + bad_page_entry when >= 0, else to bad_page_entry
  int64_t max_pages = 0;          // block-table columns (0: enough for the longest sequence)
  std::vector<int> extra_splits;  // forced split counts beyond 1, 3 and 16
  int replays = 0;                // > 0: the split call captured into a CUDA graph, replayed this often
  std::vector<int64_t> starts;    // key_starts (left padding); empty: none
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

// A strided device buffer: a host image uploaded whole (views address into it).
struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n) {
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

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

// The plans a GPU case runs: the planner's, then every candidate tile of its head dim (the cp.async
// kernel's 16- and 32-row, default, small-grid and page-1 tiles, and the TMA kernel's where the device,
// the build and the call allow it) with the keys unsplit and split 3 and 16 ways (and `extra` ways):
// the unsplit path and the fused split merge of each tile, whatever the planner picks.
std::vector<DecodePlan> candidate_plans(const DecodePlan& planned, const kf::DecodeParams& params,
                                        const std::vector<int>& extra) {
  std::vector<DecodePlan> v = {planned};
  int device = 0;
  const kf::DeviceInfo* dev = nullptr;
  if (!kf::current_device_info(&device, &dev).ok()) return v;
  const bool tma_built = dev->capability == 90 && kf::decode_tma_built();
  std::vector<int> splits = {1, 3, 16};
  splits.insert(splits.end(), extra.begin(), extra.end());
  for (DecodePlan p : kf::decode_candidate_plans(params, *dev, tma_built))
    for (int s : splits) {
      p.splits = s;
      v.push_back(p);
    }
  return v;
}

// The split merge's counters (the workspace's first `bytes`) are all zero again after a call.
::testing::AssertionResult counters_zero(const void* ws, size_t bytes) {
  std::vector<int32_t> h(bytes / sizeof(int32_t));
  if (cudaMemcpy(h.data(), ws, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return ::testing::AssertionFailure() << "cudaMemcpy of the counters failed";
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i] != 0) return ::testing::AssertionFailure() << "counter " << i << " is " << h[i] << ", not 0";
  return ::testing::AssertionSuccess();
}

class DecodeGpu : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeGpu, MatchesReference) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "decode attention needs sm_80";
  const DecodeCase& c = GetParam();
  const int64_t B = int64_t(c.lens.size()), Lq = c.Lq, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  const size_t es = kf::dtype_size(c.dtype);
  Rng rng(hash_str(c.name));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(c.lens.begin(), c.lens.end()));

  // cache geometry: paged [P, page, Hkv, D] with 2 spare pages; contiguous [B, cap, Hkv, D] with the
  // head stride padded by 8 elements (a transposed static cache's strides)
  const bool paged = c.page > 0;
  const int64_t page = paged ? c.page : longest + 5;
  const int64_t max_pages = !paged ? 1 : (c.max_pages > 0 ? c.max_pages : (longest + page - 1) / page + 1);
  const int64_t P = paged ? B * max_pages + 2 : B;
  std::vector<int64_t> cshape = {P, page, Hkv, D};
  std::vector<int64_t> cstr =
      paged ? contiguous_strides(cshape) : std::vector<int64_t>{Hkv * page * (D + 8), D + 8, page * (D + 8), 1};
  const int64_t celems = P * cstr[0];
  std::vector<double> kh(size_t(celems), std::nan("")), vh(size_t(celems), std::nan(""));
  std::vector<int32_t> bt(size_t(B * max_pages), 0);
  std::vector<int32_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = P - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % uint64_t(i + 1)]);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < max_pages; ++j) bt[b * max_pages + j] = perm[b * max_pages + j];
  if (c.bad_page_seq >= 0)
    bt[c.bad_page_seq * max_pages] = c.bad_page_entry >= 0 ? int32_t(P + c.bad_page_entry) : c.bad_page_entry;
  const int64_t capacity = paged ? max_pages * page : page;
  for (int64_t b = 0; b < B; ++b) {
    // keys no query row sees stay NaN: before key_starts, and before the window of the first new token
    const int64_t n = std::max<int64_t>(0, std::min(c.lens[b], capacity));
    int64_t first = c.starts.empty() ? 0 : std::max<int64_t>(0, c.starts[size_t(b)]);
    if (c.wl >= 0) first = std::max(first, n - c.Lq - c.wl);
    for (int64_t j = first; j < n; ++j) {
      const int64_t pg = paged ? bt[b * max_pages + j / page] : b;
      if (pg < 0 || pg >= P) continue;
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t e = 0; e < D; ++e) {
          const int64_t o = pg * cstr[0] + (j % page) * cstr[1] + h * cstr[2] + e;
          kh[o] = round_to(c.dtype, rng.uniform(-2.0, 2.0));
          vh[o] = round_to(c.dtype, rng.uniform(-1.0, 1.0));
        }
    }
  }
  HostTensor kc(c.dtype, {celems}), vc(c.dtype, {celems});
  for (int64_t i = 0; i < celems; ++i) kc.set(i, kh[i]), vc.set(i, vh[i]);
  HostTensor q = random_tensor(c.dtype, {B, Lq, Hq, D}, rng);
  HostTensor lens(I32, {B}), table(I32, {B, max_pages}), starts(I32, {B});
  for (int64_t b = 0; b < B; ++b) lens.set(b, double(c.lens[b]));
  const bool has_starts = !c.starts.empty();
  for (int64_t b = 0; b < B; ++b) starts.set(b, has_starts ? double(c.starts[size_t(b)]) : 0.0);
  for (size_t i = 0; i < bt.size(); ++i) table.set(int64_t(i), bt[i]);
  HostTensor sinks;
  if (c.sinks != Sinks::kNone) sinks = random_tensor(c.sinks == Sinks::kFloat32 ? F32 : c.dtype, {Hq}, rng, -1.0, 3.0);

  // reference on host views
  HostTensor out_ref(c.dtype, {B, Lq, Hq, D}), lse_ref(F32, {B, Lq, Hq});
  const TensorView hq = q.view(), hk = make_view(kc.bytes.data(), c.dtype, cshape, cstr, false),
                   hv = make_view(vc.bytes.data(), c.dtype, cshape, cstr, false), hl = lens.view(), hb = table.view(),
                   ho = out_ref.view(), hlse = lse_ref.view(), hs = sinks.view(), hst = starts.view();
  DecodeTensors rt;
  rt.q = &hq, rt.k_cache = &hk, rt.v_cache = &hv, rt.seq_lens = &hl, rt.block_table = paged ? &hb : nullptr;
  rt.out = &ho, rt.lse = c.lse ? &hlse : nullptr, rt.sinks = c.sinks != Sinks::kNone ? &hs : nullptr;
  rt.key_starts = has_starts ? &hst : nullptr;
  DecodeOptions o;
  o.window_left = c.wl;
  o.softcap = c.softcap;
  KF_ASSERT_OK(kf::ref::decode_attention(rt, o));

  // device copies
  DeviceTensor dq(c.dtype, {B, Lq, Hq, D}), dl(I32, {B}), db(I32, {B, max_pages}), dout(c.dtype, {B, Lq, Hq, D}),
      dlse(F32, {B, Lq, Hq}), dst(I32, {B});
  DeviceTensor ds(sinks.dtype, {c.sinks != Sinks::kNone ? Hq : 1});
  Buffer kbuf(size_t(celems) * es), vbuf(size_t(celems) * es);
  ASSERT_TRUE(dq.ok() && dl.ok() && db.ok() && dout.ok() && dlse.ok() && kbuf.ptr && vbuf.ptr);
  dq.upload(q), dl.upload(lens), db.upload(table), dst.upload(starts);
  if (c.sinks != Sinks::kNone) ds.upload(sinks);
  KF_CUDA_CHECK(cudaMemcpy(kbuf.ptr, kc.bytes.data(), size_t(celems) * es, cudaMemcpyHostToDevice));
  KF_CUDA_CHECK(cudaMemcpy(vbuf.ptr, vc.bytes.data(), size_t(celems) * es, cudaMemcpyHostToDevice));
  const TensorView gq = dq.view(), gk = make_view(kbuf.ptr, c.dtype, cshape, cstr, true),
                   gv = make_view(vbuf.ptr, c.dtype, cshape, cstr, true), gl = dl.view(), gb = db.view(),
                   go = dout.view(), glse = dlse.view(), gs = ds.view(), gst = dst.view();
  DecodeTensors t;
  t.q = &gq, t.k_cache = &gk, t.v_cache = &gv, t.seq_lens = &gl, t.block_table = paged ? &gb : nullptr;
  t.out = &go, t.lse = c.lse ? &glse : nullptr, t.sinks = c.sinks != Sinks::kNone ? &gs : nullptr;
  t.key_starts = has_starts ? &gst : nullptr;

  const double u = c.dtype == BF16 ? 1.0 / 256 : 1.0 / 2048;
  const Tol tol_out{2 * u, 4 * u + 2 * c.softcap / 1024.0 + 1e-4};
  const Tol tol_lse{2e-3, 2e-3 + c.softcap / 512.0};

  DecodePlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::decode_attention_plan(t, o, &plan, &bytes));
  kf::DecodeParams params;
  DType dt;
  kf::DecodeCall call;
  call.t = t;
  call.opts = o;
  KF_ASSERT_OK(kf::validate_decode(call, &params, &dt));
  const std::vector<DecodePlan> plans = candidate_plans(plan, params, c.extra_splits);
  // One workspace for every plan, zeroed once: the merge counters sit at its head for every plan of
  // these B and Hkv, and each call must leave them zero for the next (decode.h).
  size_t ws_bytes = 16;
  for (const DecodePlan& p : plans) ws_bytes = std::max(ws_bytes, kf::decode_workspace_bytes(p, params));
  Buffer ws(ws_bytes);
  ASSERT_TRUE(ws.ptr != nullptr);
  KF_CUDA_CHECK(cudaMemset(ws.ptr, 0, ws_bytes));
  const size_t counter_bytes = kf::decode_attention_counter_bytes(B, Hkv);
  for (const DecodePlan& p : plans) {
    SCOPED_TRACE(kf::to_string(p));
    dout.poison(), dlse.poison();
    const size_t need = kf::decode_workspace_bytes(p, params);
    KF_ASSERT_OK(kf::decode_attention(p, t, o, ws.ptr, need, nullptr));
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
    EXPECT_TRUE(counters_zero(ws.ptr, counter_bytes));
  }

  // Replays: the planner's tile split 16 ways, captured once; every replay must find the counters
  // that the previous one left at zero (no memset between them).
  if (c.replays > 0) {
    DecodePlan p = plan;
    p.splits = 16;
    SCOPED_TRACE("graph of " + kf::to_string(p));
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const kf::Status st = kf::decode_attention(p, t, o, ws.ptr, kf::decode_workspace_bytes(p, params), stream);
    KF_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KF_ASSERT_OK(st);
    KF_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < c.replays; ++r) {
      SCOPED_TRACE("replay " + std::to_string(r));
      dout.poison(), dlse.poison();
      KF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KF_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(all_close("out", dout.download(), out_ref, tol_out));
      EXPECT_TRUE(counters_zero(ws.ptr, counter_bytes));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> v;
  auto add = [&](DecodeCase c) { v.push_back(c); };
  for (DType t : {BF16, F16}) {
    const std::string ts = t == BF16 ? "bf16" : "fp16";
    for (int64_t D : {64, 128, 256}) {
      DecodeCase c;
      c.dtype = t, c.D = D, c.Hq = 8, c.Hkv = 2, c.lens = {1000, 7, 1, 300};
      c.name = ts + "_d" + std::to_string(D) + "_p16";
      add(c);
    }
    DecodeCase g;
    g.dtype = t, g.lens = {4097, 0, 129};
    for (int64_t grp : {1, 7, 16}) {
      g.Hkv = 2, g.Hq = 2 * grp;
      g.name = ts + "_group" + std::to_string(grp);
      add(g);
    }
  }
  DecodeCase c;
  c.lens = {777, 33, 2000};
  for (int64_t pg : {1, 64, 128, 0}) {  // 128: two TMA tiles of 64 keys per page
    c.page = pg;
    c.name = "page" + std::to_string(pg);
    add(c);
  }
  c.page = 16;
  for (int64_t lq : {2, 4, 7, 8}) {  // multi-token: causal among the new tokens; group 4 x 8 = 32 rows
    c.Lq = lq, c.Hq = 8, c.Hkv = 2;
    c.name = "qlen" + std::to_string(lq);
    add(c);
  }
  c.Lq = 3, c.Hq = 16, c.Hkv = 2, c.D = 64, c.name = "qlen3_group8_d64_rowtiles";  // 24 rows
  add(c);
  c.Lq = 4, c.Hq = 32, c.Hkv = 2, c.D = 128, c.name = "qlen4_group16_rowtiles";  // 64 rows: 2 tiles of 32
  add(c);
  c = DecodeCase{};
  c.lens = {1500, 90, 3};
  c.wl = 100, c.name = "window100";
  add(c);
  c.Lq = 4, c.name = "window100_qlen4";
  add(c);
  c = DecodeCase{};
  c.lens = {1500, 90, 3, 0};
  c.softcap = 5.0f, c.name = "softcap5";
  add(c);
  c.softcap = 0.0f, c.sinks = Sinks::kFloat32, c.name = "sinks_f32";
  add(c);
  c.sinks = Sinks::kSameDtype, c.dtype = F16, c.name = "sinks_fp16";
  add(c);
  c = DecodeCase{};
  c.lens = {100, 5000, -3};  // 5000 > capacity (clamped), -3 -> 0
  c.page = 16, c.max_pages = 8, c.name = "lengths_out_of_range";
  add(c);
  c.max_pages = 0, c.bad_page_seq = 0, c.lens = {100, 40, 60}, c.name = "page_out_of_range";
  add(c);
  c.bad_page_seq = 1, c.bad_page_entry = -7, c.name = "page_negative";
  add(c);
  c = DecodeCase{};
  c.lse = false, c.lens = {2048}, c.name = "nolse_b1";
  add(c);
  c = DecodeCase{};  // many splits: 128 of 256 keys; the last CTA merges 128 partials per row
  c.lens = {32768}, c.extra_splits = {64, 128}, c.name = "b1_kv32k_many_splits";
  add(c);
  c = DecodeCase{};  // the same call replayed from a CUDA graph: the counters reset themselves
  c.Hq = 32, c.Hkv = 8, c.lens = {3000, 1, 0, 4100}, c.sinks = Sinks::kFloat32, c.replays = 4;
  c.name = "graph_replays";
  add(c);
  c = DecodeCase{};  // left-padded batch: a start inside the first tile, past a tile, at and past the length
  c.Hq = 32, c.Hkv = 8, c.lens = {1200, 700, 5, 2047, 300}, c.starts = {3, 129, 5, 0, 1000};
  c.name = "key_starts";
  add(c);
  c.Lq = 4, c.wl = 50, c.sinks = Sinks::kFloat32, c.starts = {1190, 129, 2, 700, 299},
  c.name = "key_starts_qlen4_window";
  add(c);
  c = DecodeCase{};  // page size 1 with the GQA of the measured shapes
  c.Hq = 32, c.Hkv = 8, c.page = 1, c.lens = {1200, 700, 5, 2047}, c.name = "page1_gqa32_8";
  add(c);
  // the head-group kernel's edges: 12 kv heads (a full group of 8, then 4 heads and 4 idle warps) with an
  // empty sequence; 16 rows per kv head (Lq 4 x group 4, causal among the new tokens) on 4 kv heads
  c = DecodeCase{};
  c.Hq = 24, c.Hkv = 12, c.page = 1, c.lens = {0, 333, 4097}, c.name = "page1_hkv12_empty";
  add(c);
  c = DecodeCase{};
  c.Hq = 16, c.Hkv = 4, c.Lq = 4, c.page = 1, c.lens = {900, 4, 61}, c.sinks = Sinks::kFloat32,
  c.name = "page1_hkv4_qlen4_sinks";
  add(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeGpu, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return i.param.name; });

// kv_append then decode_attention: the appended rows land where the reference puts them.
TEST(DecodeGpuAppend, MatchesReference) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "decode attention needs sm_80";
  const int64_t B = 3, Lq = 2, Hkv = 2, D = 128, page = 16, max_pages = 8, P = B * max_pages;
  Rng rng(7);
  HostTensor kc = random_tensor(BF16, {P, page, Hkv, D}, rng), vc = random_tensor(BF16, {P, page, Hkv, D}, rng);
  HostTensor kn = random_tensor(BF16, {B, Lq, Hkv, D}, rng), vn = random_tensor(BF16, {B, Lq, Hkv, D}, rng);
  HostTensor lens(I32, {B}), table(I32, {B, max_pages});
  const int32_t L[B] = {2, 77, 128};  // 128: the last two rows of page 7
  for (int64_t b = 0; b < B; ++b) lens.set(b, L[b]);
  for (int64_t i = 0; i < B * max_pages; ++i) table.set(i, double((i * 7) % P));
  HostTensor kref = kc, vref = vc;
  {
    const TensorView a = kref.view(), bv = vref.view(), c = kn.view(), d = vn.view(), l = lens.view(), t = table.view();
    kf::KvAppendTensors at;
    at.k_cache = &a, at.v_cache = &bv, at.k = &c, at.v = &d, at.seq_lens = &l, at.block_table = &t;
    KF_ASSERT_OK(kf::ref::kv_append(at));
  }
  DeviceTensor gk(BF16, {P, page, Hkv, D}), gv(BF16, {P, page, Hkv, D}), gkn(BF16, {B, Lq, Hkv, D}),
      gvn(BF16, {B, Lq, Hkv, D}), gl(I32, {B}), gt(I32, {B, max_pages});
  gk.upload(kc), gv.upload(vc), gkn.upload(kn), gvn.upload(vn), gl.upload(lens), gt.upload(table);
  const TensorView a = gk.view(), bv = gv.view(), c = gkn.view(), d = gvn.view(), l = gl.view(), t = gt.view();
  kf::KvAppendTensors at;
  at.k_cache = &a, at.v_cache = &bv, at.k = &c, at.v = &d, at.seq_lens = &l, at.block_table = &t;
  KF_ASSERT_OK(kf::kv_append(at, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(bit_equal("k_cache", gk.download(), kref));
  EXPECT_TRUE(bit_equal("v_cache", gv.download(), vref));
}

// ---- plan --------------------------------------------------------------------------------------

kf::DecodeParams params_for(int64_t B, int64_t Lq, int64_t Hq, int64_t Hkv, int64_t D, int64_t max_len) {
  kf::DecodeParams p;
  p.batch = int32_t(B), p.q_len = int32_t(Lq), p.heads_q = int32_t(Hq), p.heads_kv = int32_t(Hkv);
  p.group = int32_t(Hq / Hkv), p.rows = p.group * p.q_len, p.head_dim = int32_t(D);
  p.capacity = int32_t(max_len), p.max_seq_len = max_len;
  return p;
}

// A paged (or, page_size = the length and no table, contiguous) [pages, page_size, Hkv, D] cache with
// its contiguous strides, as TMA can address it.
kf::DecodeParams tma_paged(kf::DecodeParams p, int32_t page_size) {
  static const int32_t table = 0;  // never read by the planner: only "paged or not"
  p.block_table = &table, p.page_size = page_size, p.pages = 64;
  p.k_st = p.v_st = int64_t(p.heads_kv) * p.head_dim;
  p.k_sh = p.v_sh = p.head_dim;
  p.k_sp = p.v_sp = int64_t(page_size) * p.heads_kv * p.head_dim;
  return p;
}

TEST(DecodePlan, SplitsFillTheGpu) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  // batch 1, 8 kv heads, 8k keys: 8 CTAs unsplit; the split fills the SMs with >= 256 keys each
  const DecodePlan b1 = kf::plan_decode(params_for(1, 1, 32, 8, 128, 8192), h100, false);
  EXPECT_EQ(b1.rows, 16);
  EXPECT_GE(b1.splits, 16);
  EXPECT_LE(b1.splits, 32);
  // batch 64 x 8 kv heads = 512 CTAs: already two waves, no split
  EXPECT_EQ(kf::plan_decode(params_for(64, 1, 32, 8, 128, 2048), h100, false).splits, 1);
  // short sequences are not split below 256 keys
  EXPECT_EQ(kf::plan_decode(params_for(1, 1, 32, 8, 128, 200), h100, false).splits, 1);
  // 32 rows when group x q_len > 16; d256 has only the 16-row tile
  EXPECT_EQ(kf::plan_decode(params_for(4, 4, 32, 4, 128, 1024), h100, false).rows, 32);
  EXPECT_EQ(kf::plan_decode(params_for(4, 4, 32, 4, 256, 1024), h100, false).rows, 16);
  const DecodePlan p = kf::plan_decode(params_for(2, 1, 16, 2, 64, 4096), h100, false);
  EXPECT_TRUE(kf::check_decode_plan(p, params_for(2, 1, 16, 2, 64, 4096)).ok());
  EXPECT_EQ(kf::to_string(p).rfind("decode d=64 rows=16 tile=64 warps=4 stages=4 splits=", 0), 0u) << kf::to_string(p);
  DecodePlan bad = p;
  bad.stages = 5;
  KF_EXPECT_INVALID(kf::check_decode_plan(bad, params_for(2, 1, 16, 2, 64, 4096)), "no such kernel");
  // counters [1][8] (256 bytes), then the partial outputs and their lse
  EXPECT_EQ(kf::decode_workspace_bytes(b1, params_for(1, 1, 32, 8, 128, 8192)),
            size_t(256 + (32 * b1.splits * 128 * 4 + 255) / 256 * 256 + (32 * b1.splits * 4 + 255) / 256 * 256));
}

TEST(DecodePlan, TileByShape) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  auto tile = [](const DecodePlan& p) {
    return "warps=" + std::to_string(p.warps) + " stages=" + std::to_string(p.stages) +
           " rows=" + std::to_string(p.rows);
  };
  auto paged = [](kf::DecodeParams p, int32_t page_size) {
    static const int32_t table = 0;  // never read by the planner: only "paged or not"
    p.block_table = &table, p.page_size = page_size;
    return p;
  };
  // b1 x kv8k, GQA 32/8, d128: 8 (sequence, kv head) pairs on 132 SMs -> 8 warps x 2 stages, split
  // into one wave of 128-key-stage CTAs (one per SM)
  const DecodePlan b1 = kf::plan_decode(paged(params_for(1, 1, 32, 8, 128, 8192), 16), h100, false);
  EXPECT_EQ(tile(b1), "warps=8 stages=2 rows=16") << kf::to_string(b1);
  EXPECT_EQ(b1.block_n, 128);
  EXPECT_EQ(b1.splits, 16);
  EXPECT_EQ(kf::to_string(b1), "decode d=128 rows=16 tile=128 warps=8 stages=2 splits=16");
  // b4 x 8 kv heads = 32 pairs <= 132 / 4: still small; b8 (64 pairs): the default
  EXPECT_EQ(tile(kf::plan_decode(params_for(4, 1, 32, 8, 128, 8192), h100, false)), "warps=8 stages=2 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(params_for(8, 1, 32, 8, 128, 8192), h100, false)), "warps=4 stages=3 rows=16");
  // b16 x kv4k and b64 x kv2k, page 16: 4 warps x 3 stages
  EXPECT_EQ(tile(kf::plan_decode(paged(params_for(16, 1, 32, 8, 128, 4096), 16), h100, false)),
            "warps=4 stages=3 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(paged(params_for(64, 1, 32, 8, 128, 2048), 16), h100, false)),
            "warps=4 stages=3 rows=16");
  // page size 1 at b16: 4 warps x 2 stages (three CTAs per SM); the contiguous cache keeps the default
  const kf::DecodeParams p1 = paged(params_for(16, 1, 32, 8, 128, 4096), 1);
  EXPECT_EQ(tile(kf::plan_decode(p1, h100, false)), "warps=4 stages=2 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(params_for(16, 1, 32, 8, 128, 4096), h100, false)), "warps=4 stages=3 rows=16");
  // page size 1 at b1: the small grid wins
  EXPECT_EQ(tile(kf::plan_decode(paged(params_for(1, 1, 32, 8, 128, 8192), 1), h100, false)),
            "warps=8 stages=2 rows=16");
  // 32 rows (Lq 4 x group 8) and the other head dims keep their default tiles at b1
  EXPECT_EQ(tile(kf::plan_decode(params_for(1, 4, 32, 4, 128, 8192), h100, false)), "warps=4 stages=3 rows=32");
  EXPECT_EQ(tile(kf::plan_decode(params_for(1, 1, 32, 8, 64, 8192), h100, false)), "warps=4 stages=4 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(paged(params_for(16, 1, 32, 8, 256, 4096), 1), h100, false)),
            "warps=4 stages=2 rows=16");
  // sm_89 (99 KB per block): no 140 KB small-grid tile; the 72 KB page-1 tile fits
  kf::DeviceInfo l40 = h100;
  l40.capability = 89;
  EXPECT_EQ(tile(kf::plan_decode(params_for(1, 1, 32, 8, 128, 8192), l40, false)), "warps=4 stages=3 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(p1, l40, false)), "warps=4 stages=2 rows=16");
  // every table row is a plan check_decode_plan accepts (a kernel is built for it)
  for (const kf::DecodeTile& c : kf::kDecodeTiles) {
    DecodePlan p;
    p.kernel = c.kernel;
    p.head_dim = c.head_dim, p.rows = c.rows, p.warps = c.warps, p.block_n = kf::decode_tile_block_n(c);
    p.stages = c.stages;
    EXPECT_TRUE(kf::check_decode_plan(p, tma_paged(params_for(2, 1, 16, 2, c.head_dim, 4096), 16)).ok())
        << kf::to_string(p);
  }
}

// The TMA kernel: on sm_90 with the 90a image, page size >= 16 or the contiguous cache, TMA-legal
// strides; the same uses (default, small grid) as the cp.async kernel; everything else keeps cp.async.
TEST(DecodePlan, TmaKernelChoice) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  auto tile = [](const DecodePlan& p) {
    return std::string(p.kernel == kf::DecodeKernel::kTma ? "tma " : "cp.async ") + "warps=" + std::to_string(p.warps) +
           " stages=" + std::to_string(p.stages) + " rows=" + std::to_string(p.rows);
  };
  const kf::DecodeParams b16 = tma_paged(params_for(16, 1, 32, 8, 128, 4096), 16);
  const DecodePlan p16 = kf::plan_decode(b16, h100, true);
  EXPECT_EQ(tile(p16), "tma warps=4 stages=3 rows=16");
  EXPECT_EQ(kf::to_string(p16).rfind("decode_tma d=128 rows=16 tile=64 warps=4+1 stages=3 splits=", 0), 0u)
      << kf::to_string(p16);
  EXPECT_TRUE(kf::check_decode_plan(p16, b16).ok());
  EXPECT_TRUE(kf::decode_tma_unsupported(b16, h100, true).empty());
  // no 90a image, or not sm_90: cp.async
  EXPECT_EQ(tile(kf::plan_decode(b16, h100, false)), "cp.async warps=4 stages=3 rows=16");
  kf::DeviceInfo a100 = h100;
  a100.capability = 80;
  EXPECT_EQ(tile(kf::plan_decode(b16, a100, true)), "cp.async warps=4 stages=3 rows=16");
  EXPECT_EQ(kf::decode_tma_unsupported(b16, a100, true), "needs an sm_90 device");
  // page sizes below 16: cp.async (page size 1: its page-1 tile)
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 128, 4096), 1), h100, true)),
            "cp.async warps=4 stages=2 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 128, 4096), 8), h100, true)),
            "cp.async warps=4 stages=3 rows=16");
  // page sizes 64 and 128 (boxes of 64 rows), the contiguous cache (page b, the cache length as page size)
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 128, 4096), 64), h100, true)),
            "tma warps=4 stages=3 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 128, 4096), 128), h100, true)),
            "tma warps=4 stages=3 rows=16");
  kf::DecodeParams contiguous = tma_paged(params_for(16, 1, 32, 8, 128, 4096), 4096);
  contiguous.block_table = nullptr;
  EXPECT_EQ(tile(kf::plan_decode(contiguous, h100, true)), "tma warps=4 stages=3 rows=16");
  // strides TMA cannot address: a row stride of 24 bytes; a zero head stride (broadcast)
  kf::DecodeParams odd = b16;
  odd.v_st = 12;
  EXPECT_EQ(tile(kf::plan_decode(odd, h100, true)), "cp.async warps=4 stages=3 rows=16");
  EXPECT_FALSE(kf::decode_tma_unsupported(odd, h100, true).empty());
  odd = b16;
  odd.k_sh = 0;
  EXPECT_EQ(tile(kf::plan_decode(odd, h100, true)), "cp.async warps=4 stages=3 rows=16");
  // the uses and the other head dims: small grid (b1), 32 rows (1 CTA per SM, 6 stages), d64, d256
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(1, 1, 32, 8, 128, 8192), 16), h100, true)),
            "tma warps=8 stages=3 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 4, 32, 4, 128, 4096), 16), h100, true)),
            "tma warps=4 stages=6 rows=32");
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 64, 4096), 16), h100, true)),
            "tma warps=4 stages=6 rows=16");
  EXPECT_EQ(tile(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 256, 4096), 16), h100, true)),
            "tma warps=4 stages=3 rows=16");
  // a TMA plan for a call it cannot run is refused
  DecodePlan bad = p16;
  const kf::Status st = kf::check_decode_plan(bad, tma_paged(params_for(16, 1, 32, 8, 128, 4096), 1));
  EXPECT_EQ(st.code(), kf::StatusCode::kNotSupported) << st.message();
  EXPECT_NE(st.message().find("page size of at least 16"), std::string::npos) << st.message();
  bad.stages = 4;
  KF_EXPECT_INVALID(kf::check_decode_plan(bad, b16), "no such kernel");
}

// Candidates: every built tile of the head dim the call can run, the planner's among them.
TEST(DecodePlan, CandidatePlans) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  auto count = [](const std::vector<DecodePlan>& v, kf::DecodeKernel k) {
    return std::count_if(v.begin(), v.end(), [&](const DecodePlan& p) { return p.kernel == k; });
  };
  const kf::DecodeParams b16 = tma_paged(params_for(16, 1, 32, 8, 128, 4096), 16);
  const std::vector<DecodePlan> all = kf::decode_candidate_plans(b16, h100, true);
  EXPECT_EQ(count(all, kf::DecodeKernel::kCpAsync), 4);    // d128: 4 x 3 (16, 32 rows), 8 x 2, 4 x 2
  EXPECT_EQ(count(all, kf::DecodeKernel::kTma), 3);        // d128: 4 x 3, 4 x 6 (32 rows), 8 x 3
  EXPECT_EQ(count(all, kf::DecodeKernel::kHeadGroup), 2);  // d128: 8 heads x 2 stages, 4 heads x 3
  const DecodePlan planned = kf::plan_decode(b16, h100, true);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(),
                          [&](const DecodePlan& p) { return kf::to_string(p) == kf::to_string(planned); }));
  for (const DecodePlan& p : all) EXPECT_TRUE(kf::check_decode_plan(p, b16).ok()) << kf::to_string(p);
  EXPECT_EQ(count(kf::decode_candidate_plans(b16, h100, false), kf::DecodeKernel::kTma), 0);
  const kf::DecodeParams page1 = tma_paged(params_for(16, 1, 32, 8, 128, 4096), 1);
  EXPECT_EQ(count(kf::decode_candidate_plans(page1, h100, true), kf::DecodeKernel::kTma), 0);
  // sm_89 (99 KB per block): no TMA, and only the cp.async tiles that fit
  kf::DeviceInfo l40 = h100;
  l40.capability = 89;
  const std::vector<DecodePlan> small = kf::decode_candidate_plans(b16, l40, true);
  EXPECT_EQ(count(small, kf::DecodeKernel::kTma), 0);
  EXPECT_EQ(count(small, kf::DecodeKernel::kCpAsync), 1);    // 4 x 2 (72 KB); 4 x 3 is 106 / 110 KB
  EXPECT_EQ(count(small, kf::DecodeKernel::kHeadGroup), 0);  // 119 KB and 170 KB
  // more than 16 query rows per kv head (Lq 8 x group 4): no head-group candidate
  EXPECT_EQ(count(kf::decode_candidate_plans(tma_paged(params_for(16, 8, 32, 8, 128, 4096), 1), h100, true),
                  kf::DecodeKernel::kHeadGroup),
            0);
}

// The head-group kernel: page size 1 with head_group set, <= 16 rows per kv head, the largest group
// of heads the call fills; everything else keeps its kernel.
TEST(DecodePlan, HeadGroupChoice) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  const kf::DecodeParams page1 = tma_paged(params_for(16, 1, 32, 8, 128, 4096), 1);
  const DecodePlan p = kf::plan_decode(page1, h100, true, true);
  EXPECT_EQ(p.kernel, kf::DecodeKernel::kHeadGroup);
  EXPECT_EQ(p.warps, 8);
  EXPECT_EQ(p.block_n, 16);
  // 16 sequences x 1 group of 8 heads: split over the SMs
  EXPECT_GE(p.splits, 4);
  EXPECT_EQ(kf::to_string(p), "decode_heads d=128 rows=16 tile=16 heads=8 stages=2 splits=" + std::to_string(p.splits));
  EXPECT_TRUE(kf::check_decode_plan(p, page1).ok());
  // switch off, page size 16, more than 16 rows, fewer than 4 kv heads: not the head-group kernel
  EXPECT_EQ(kf::plan_decode(page1, h100, true, false).kernel, kf::DecodeKernel::kCpAsync);
  EXPECT_EQ(kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 128, 4096), 16), h100, true, true).kernel,
            kf::DecodeKernel::kTma);
  EXPECT_EQ(kf::plan_decode(tma_paged(params_for(16, 8, 32, 8, 128, 4096), 1), h100, true, true).kernel,
            kf::DecodeKernel::kCpAsync);
  EXPECT_EQ(kf::plan_decode(tma_paged(params_for(16, 1, 16, 2, 128, 4096), 1), h100, true, true).kernel,
            kf::DecodeKernel::kCpAsync);
  // 4 kv heads at d128: the 4-head tile; d64 with 8 kv heads: its 8-head tile
  const DecodePlan h4 = kf::plan_decode(tma_paged(params_for(16, 1, 32, 4, 128, 4096), 1), h100, true, true);
  EXPECT_EQ(kf::to_string(h4).rfind("decode_heads d=128 rows=16 tile=16 heads=4 stages=3 splits=", 0), 0u)
      << kf::to_string(h4);
  const DecodePlan d64 = kf::plan_decode(tma_paged(params_for(16, 1, 32, 8, 64, 4096), 1), h100, true, true);
  EXPECT_EQ(kf::to_string(d64).rfind("decode_heads d=64 rows=16 tile=16 heads=8 stages=3 splits=", 0), 0u)
      << kf::to_string(d64);
  // a head-group plan for more than 16 rows is refused
  KF_EXPECT_INVALID(kf::check_decode_plan(p, tma_paged(params_for(16, 8, 32, 8, 128, 4096), 1)),
                    "at most 16 query rows per kv head");
  // sm_89 (99 KB per block): no head-group tile fits; the cp.async page-1 tile
  kf::DeviceInfo l40 = h100;
  l40.capability = 89;
  EXPECT_EQ(kf::plan_decode(page1, l40, false, true).kernel, kf::DecodeKernel::kCpAsync);
}

TEST(DecodePlan, WorkspaceLayout) {
  EXPECT_EQ(kf::decode_attention_counter_bytes(1, 8), 256u);
  EXPECT_EQ(kf::decode_attention_counter_bytes(64, 1), 256u);
  EXPECT_EQ(kf::decode_attention_counter_bytes(65, 1), 512u);
  EXPECT_EQ(kf::decode_attention_counter_bytes(64, 8), 2048u);
  const kf::DecodeParams p = params_for(3, 2, 16, 4, 128, 8192);
  DecodePlan plan;
  plan.head_dim = 128, plan.rows = 16, plan.warps = 4, plan.block_n = 64, plan.stages = 3, plan.splits = 5;
  const uintptr_t base = uintptr_t{1} << 40;  // an address only: nothing is read or written
  const kf::DecodeWorkspace w = kf::decode_workspace(plan, p, reinterpret_cast<void*>(base));
  const size_t rows = 3 * 2 * 16 * 5;  // B * Lq * Hq * splits
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.counters), base);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.o), base + 256);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.lse), base + 256 + (rows * 128 * 4 + 255) / 256 * 256);
  EXPECT_EQ(kf::decode_workspace_bytes(plan, p),
            256 + (rows * 128 * 4 + 255) / 256 * 256 + (rows * 4 + 255) / 256 * 256);
  plan.splits = 1;
  EXPECT_EQ(kf::decode_workspace_bytes(plan, p), 0u);
}

// ---- validation --------------------------------------------------------------------------------

struct ValidationViews {
  TensorView q = cuda_view(BF16, {2, 1, 8, 128}, 0, uintptr_t{1} << 40);
  TensorView k = cuda_view(BF16, {16, 16, 2, 128}, 0, uintptr_t{2} << 40);
  TensorView v = cuda_view(BF16, {16, 16, 2, 128}, 0, uintptr_t{3} << 40);
  TensorView lens = cuda_view(I32, {2}, 0, uintptr_t{4} << 40);
  TensorView bt = cuda_view(I32, {2, 8}, 0, uintptr_t{5} << 40);
  TensorView out = cuda_view(BF16, {2, 1, 8, 128}, 0, uintptr_t{6} << 40);
  DecodeTensors t() const {
    DecodeTensors x;
    x.q = &q, x.k_cache = &k, x.v_cache = &v, x.seq_lens = &lens, x.block_table = &bt, x.out = &out;
    return x;
  }
};

kf::Status validate(const DecodeTensors& t, DecodeOptions o = {}) {
  kf::DecodeCall c;
  c.t = t;
  c.opts = o;
  kf::DecodeParams p;
  DType d;
  return kf::validate_decode(c, &p, &d);
}

TEST(DecodeValidation, AcceptsAndRejects) {
  ValidationViews w;
  EXPECT_TRUE(validate(w.t()).ok()) << validate(w.t()).message();
  {
    ValidationViews x;
    x.q = cuda_view(BF16, {2, 8, 128});
    KF_EXPECT_INVALID(validate(x.t()), "q must have 4 dimensions");
  }
  {
    ValidationViews x;
    x.q = cuda_view(BF16, {2, 1, 8, 96}), x.out = cuda_view(BF16, {2, 1, 8, 96}, 0, uintptr_t{6} << 40);
    x.k = cuda_view(BF16, {16, 16, 2, 96}, 0, uintptr_t{2} << 40),
    x.v = cuda_view(BF16, {16, 16, 2, 96}, 0, uintptr_t{3} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "head dim must be 64, 128 or 256");
  }
  {
    ValidationViews x;
    x.q = cuda_view(BF16, {2, 1, 7, 128}), x.out = cuda_view(BF16, {2, 1, 7, 128}, 0, uintptr_t{6} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "multiple of k_cache's kv heads");
  }
  {
    ValidationViews x;
    x.k.dtype = F16;
    KF_EXPECT_INVALID(validate(x.t()), "k_cache must have q's dtype");
  }
  {
    ValidationViews x;
    x.lens.dtype = DType::kInt64;
    KF_EXPECT_INVALID(validate(x.t()), "seq_lens must be int32");
  }
  {
    ValidationViews x;
    x.bt = cuda_view(I32, {3, 8}, 0, uintptr_t{5} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "block_table must have 2 rows");
  }
  {
    ValidationViews x;
    x.k = cuda_view(BF16, {16, 12, 2, 128}, 0, uintptr_t{2} << 40),
    x.v = cuda_view(BF16, {16, 12, 2, 128}, 0, uintptr_t{3} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "power of two");
  }
  {
    ValidationViews x;
    x.v = cuda_view(BF16, {16, 16, 2, 64}, 0, uintptr_t{3} << 40);
    KF_EXPECT_INVALID(validate(x.t()), "v_cache must have k_cache's shape");
  }
  {
    ValidationViews x;
    x.k.data = reinterpret_cast<void*>((uintptr_t{2} << 40) + 2);
    KF_EXPECT_INVALID(validate(x.t()), "k_cache must start at a 16-byte aligned address");
  }
  {
    ValidationViews x;
    DecodeTensors t = x.t();
    t.block_table = nullptr;  // contiguous: 16 pages >= 2 sequences
    EXPECT_TRUE(validate(t).ok());
    x.k = cuda_view(BF16, {1, 16, 2, 128}, 0, uintptr_t{2} << 40),
    x.v = cuda_view(BF16, {1, 16, 2, 128}, 0, uintptr_t{3} << 40);
    t = x.t();
    t.block_table = nullptr;
    KF_EXPECT_INVALID(validate(t), "at least one page per sequence");
  }
  {
    DecodeOptions o;
    o.window_left = -2;
    KF_EXPECT_INVALID(validate(w.t(), o), "window_left");
  }
  {
    ValidationViews x;
    TensorView s = cuda_view(F32, {4}, 0, uintptr_t{7} << 40);
    DecodeTensors t = x.t();
    t.sinks = &s;
    KF_EXPECT_INVALID(validate(t), "sinks must have shape [8]");
  }
  {
    ValidationViews x;
    TensorView s = cuda_view(I32, {3}, 0, uintptr_t{7} << 40);
    DecodeTensors t = x.t();
    t.key_starts = &s;
    KF_EXPECT_INVALID(validate(t), "key_starts must have shape [");
    TensorView f = cuda_view(F32, {t.seq_lens->shape[0]}, 0, uintptr_t{7} << 40);
    t.key_starts = &f;
    KF_EXPECT_INVALID(validate(t), "key_starts must be int32");
  }
}

}  // namespace
