// Programmatic dependent launch (common/launch.cuh, the switch in common/device.h) across the kernels
// of a decode step: the chain add_rms_norm -> linear (qkv) -> apply_rope (in place) -> kv_append ->
// decode_attention -> linear (o) -> add_rms_norm -> linear (gate_up) -> silu_and_mul -> linear (down)
// at the Llama-3.2-1B shape (H 2048, 32 / 8 heads of 64, I 8192), every output feeding the next step,
// runs with the PDL attribute forced on and forced off; the results must be the same bits. Once as 20
// steps in a row on one stream, once as a CUDA graph of two steps replayed 10 times. The linear calls
// run the planner's kernels (the TMA kernel for K = 2048 on sm_90a, the cp.async kernel and its
// split-K reduction for the down projection) or the cp.async kernel everywhere. On a GPU below sm_90
// the attribute is never set and both runs are plain launches.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/device.h"
#include "kernelforge/kernelforge.h"
#include "linear/linear_config.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kftest::DType;
using kftest::Rng;
using kftest::TensorView;

constexpr DType kT = DType::kBFloat16;
constexpr int64_t kH = 2048, kHq = 32, kHkv = 8, kD = 64, kI = 8192, kCap = 64;
constexpr int64_t kQkv = (kHq + 2 * kHkv) * kD;  // 3072
constexpr int kSteps = 20, kGraphSteps = 2, kReplays = 10;
constexpr float kEps = 1e-5f;

TEST(PdlSwitch, OverrideAndEnvironment) {
  const char* e = std::getenv("KF_PDL");
  const bool set = e != nullptr && (std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0);
  const bool from_env = set ? e[0] == '1' : kf::kPdlByDefault;
  EXPECT_EQ(kf::pdl_switch(), from_env);
  kf::set_pdl_override(1);
  EXPECT_TRUE(kf::pdl_switch());
  kf::set_pdl_override(0);
  EXPECT_FALSE(kf::pdl_switch());
  kf::set_pdl_override(-1);
  EXPECT_EQ(kf::pdl_switch(), from_env);
}

struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n) != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
  }
  ~Buf() {
    if (p) cudaFree(p);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename E>
  void upload(const std::vector<E>& h) {
    cudaMemcpy(p, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice);
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> h(bytes);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
};

// A view of `data` (element offset `off`) with the given shape and element strides.
TensorView view(const Buf& b, DType t, std::vector<int64_t> shape, std::vector<int64_t> strides = {}, int64_t off = 0) {
  TensorView v;
  v.data = static_cast<unsigned char*>(b.p) + off * int64_t(kf::dtype_size(t));
  v.dtype = t;
  v.device = kf::Device{kf::DeviceType::kCUDA, 0};
  v.ndim = int(shape.size());
  int64_t s = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides.empty() ? s : strides[d];
    s *= shape[d];
  }
  return v;
}

// Uniform values in [-a, a) rounded to bfloat16.
std::vector<uint16_t> random_bf16(int64_t n, double a, Rng& rng, double center = 0.0) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (auto& x : h) x = kftest::float_to_bf16(float(center + rng.uniform(-a, a)));
  return h;
}

// One linear call of the chain: its weight, its plan and its own workspace.
struct Linear {
  int64_t n, k;
  Buf w;
  kf::LinearPlan plan;
  size_t ws_bytes = 0;
  std::unique_ptr<Buf> ws;
  Linear(int64_t n_, int64_t k_) : n(n_), k(k_), w(size_t(n_ * k_) * 2) {}
};

struct ChainCase {
  int64_t m;      // sequences (one new token each): the linear calls' M
  bool force_cp;  // every linear call on the cp.async kernel
  std::string name;
};

class PdlChainGpu : public ::testing::TestWithParam<ChainCase> {};

TEST_P(PdlChainGpu, SameBitsWithAndWithoutPdl) {
  KF_NEED_GPU();
  if (kftest::gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
  const ChainCase c = GetParam();
  const int64_t M = c.m;
  Rng rng(kftest::hash_str("pdl_chain_" + c.name));

  // ---- weights (read-only for every kernel of the chain) ----
  Buf w_in(kH * 2), w_post(kH * 2);
  w_in.upload(random_bf16(kH, 0.2, rng, 1.0));
  w_post.upload(random_bf16(kH, 0.2, rng, 1.0));
  Linear qkv(kQkv, kH), o(kH, kH), gate_up(2 * kI, kH), down(kH, kI);
  for (Linear* l : {&qkv, &o, &gate_up, &down}) {
    ASSERT_NE(l->w.p, nullptr);
    l->w.upload(random_bf16(l->n * l->k, 1.7 / std::sqrt(double(l->k)), rng));
  }
  std::vector<float> cs_cos(size_t(kCap * kD)), cs_sin(size_t(kCap * kD));
  for (int64_t p = 0; p < kCap; ++p)
    for (int64_t j = 0; j < kD; ++j) {
      const double f = std::pow(10000.0, -2.0 * double(j % (kD / 2)) / double(kD));
      cs_cos[size_t(p * kD + j)] = float(std::cos(double(p) * f));
      cs_sin[size_t(p * kD + j)] = float(std::sin(double(p) * f));
    }
  Buf cos_t(cs_cos.size() * 4), sin_t(cs_sin.size() * 4);
  cos_t.upload(cs_cos);
  sin_t.upload(cs_sin);

  // ---- activations, caches, per-step lengths and positions ----
  Buf xa(M * kH * 2), xb(M * kH * 2), d(M * kH * 2), h(M * kH * 2), qkv_y(M * kQkv * 2), att(M * kHq * kD * 2),
      o_y(M * kH * 2), gu_y(M * 2 * kI * 2), mlp(M * kI * 2);
  const size_t cache_elems = size_t(M * kCap * kHkv * kD);
  Buf kc(cache_elems * 2), vc(cache_elems * 2);
  const std::vector<uint16_t> xa0 = random_bf16(M * kH, 2.0, rng), d0 = random_bf16(M * kH, 2.0, rng),
                              kc0 = random_bf16(int64_t(cache_elems), 1.0, rng),
                              vc0 = random_bf16(int64_t(cache_elems), 1.0, rng);
  Buf lens(size_t(kSteps * M) * 4), pos(size_t(kSteps * M) * 8);
  {
    std::vector<int32_t> l(size_t(kSteps * M));
    std::vector<int64_t> p(size_t(kSteps * M));
    for (int s = 0; s < kSteps; ++s)
      for (int64_t b = 0; b < M; ++b) {
        l[size_t(s * M + b)] = int32_t(21 + s + b % 3);
        p[size_t(s * M + b)] = l[size_t(s * M + b)] - 1;
      }
    lens.upload(l);
    pos.upload(p);
  }

  // q, k, v: column ranges of the qkv output, [M, 1, heads, D]
  const TensorView q = view(qkv_y, kT, {M, 1, kHq, kD}, {kQkv, kQkv, kD, 1});
  const TensorView k = view(qkv_y, kT, {M, 1, kHkv, kD}, {kQkv, kQkv, kD, 1}, kHq * kD);
  const TensorView v = view(qkv_y, kT, {M, 1, kHkv, kD}, {kQkv, kQkv, kD, 1}, (kHq + kHkv) * kD);
  const TensorView kcv = view(kc, kT, {M, kCap, kHkv, kD}), vcv = view(vc, kT, {M, kCap, kHkv, kD});
  const TensorView cosv = view(cos_t, DType::kFloat32, {kCap, kD}), sinv = view(sin_t, DType::kFloat32, {kCap, kD});
  const TensorView att4 = view(att, kT, {M, 1, kHq, kD});
  const TensorView w_in_v = view(w_in, kT, {kH}), w_post_v = view(w_post, kT, {kH});
  const TensorView xa_v = view(xa, kT, {M, kH}), xb_v = view(xb, kT, {M, kH}), d_v = view(d, kT, {M, kH}),
                   h_v = view(h, kT, {M, kH}), o_v = view(o_y, kT, {M, kH}), gu_v = view(gu_y, kT, {M, 2 * kI}),
                   mlp_v = view(mlp, kT, {M, kI}), qkv_v = view(qkv_y, kT, {M, kQkv}), att_v = view(att, kT, {M, kH});
  auto lens_v = [&](int s) { return view(lens, DType::kInt32, {M}, {}, s * M); };
  auto pos_v = [&](int s) { return view(pos, DType::kInt64, {M, 1}, {}, s * M); };

  // ---- plans, fixed once (they read shapes only) ----
  auto plan_linear = [&](Linear& l, const TensorView& x, const TensorView& y) {
    const TensorView wv = view(l.w, kT, {l.n, l.k});
    kf::LinearTensors t;
    t.x = &x, t.w = &wv, t.y = &y;
    KF_ASSERT_OK(kf::linear_plan(t, &l.plan, &l.ws_bytes));
    if (c.force_cp) {
      const kf::LinearTile tile = kf::kLinearTile;
      l.plan = kf::LinearPlan{};
      l.plan.kernel = kf::LinearKernel::kCpAsync;
      l.plan.block_n = tile.block_n, l.plan.block_k = tile.block_k, l.plan.warps = tile.warps;
      l.plan.stages = tile.stages;
      l.plan.splits = int(l.k / 512);  // 4 or 16: the split-K reduction kernel runs after each
      l.ws_bytes = (size_t(l.plan.splits) * size_t(M) * size_t(l.n) * 4 + 255) / 256 * 256;
    }
    l.ws = std::make_unique<Buf>(l.ws_bytes > 0 ? l.ws_bytes : 256);
    std::printf("  [%s] linear %lld -> %lld: %s\n", c.name.c_str(), (long long)l.k, (long long)l.n,
                kf::to_string(l.plan).c_str());
  };
  plan_linear(qkv, h_v, qkv_v);
  plan_linear(o, att_v, o_v);
  plan_linear(gate_up, h_v, gu_v);
  plan_linear(down, mlp_v, d_v);
  if (HasFatalFailure()) return;

  kf::DecodeOptions dopts;
  dopts.max_seq_len = kCap;
  const TensorView lens0 = lens_v(0);
  kf::DecodeTensors dt;
  dt.q = &q, dt.k_cache = &kcv, dt.v_cache = &vcv, dt.seq_lens = &lens0, dt.out = &att4;
  kf::DecodePlan dplan;
  size_t dws_bytes = 0;
  KF_ASSERT_OK(kf::decode_attention_plan(dt, dopts, &dplan, &dws_bytes));
  Buf dws(dws_bytes > 0 ? dws_bytes : 256);
  std::printf("  [%s] %s\n", c.name.c_str(), kf::to_string(dplan).c_str());

  auto lin = [&](Linear& l, const TensorView& x, const TensorView& y, cudaStream_t s) {
    const TensorView wv = view(l.w, kT, {l.n, l.k});
    kf::LinearTensors t;
    t.x = &x, t.w = &wv, t.y = &y;
    return kf::linear(l.plan, t, l.ws->p, l.ws_bytes, s);
  };
  // One decode step; the first failing call's status.
  auto step = [&](int i, cudaStream_t s) -> kf::Status {
    const TensorView ls = lens_v(i), ps = pos_v(i);
    kf::Status st = kf::add_rms_norm(xa_v, d_v, &w_in_v, kEps, h_v, xb_v, s);
    if (st.ok()) st = lin(qkv, h_v, qkv_v, s);
    if (st.ok()) st = kf::apply_rope(q, &k, cosv, sinv, &ps, kf::RopeOptions{}, q, &k, s);
    if (st.ok()) {
      kf::KvAppendTensors at;
      at.k_cache = &kcv, at.v_cache = &vcv, at.k = &k, at.v = &v, at.seq_lens = &ls;
      st = kf::kv_append(at, s);
    }
    if (st.ok()) {
      kf::DecodeTensors t = dt;
      t.seq_lens = &ls;
      st = kf::decode_attention(dplan, t, dopts, dws.p, dws_bytes, s);
    }
    if (st.ok()) st = lin(o, att_v, o_v, s);
    if (st.ok()) st = kf::add_rms_norm(xb_v, o_v, &w_post_v, kEps, h_v, xa_v, s);
    if (st.ok()) st = lin(gate_up, h_v, gu_v, s);
    if (st.ok()) st = kf::silu_and_mul(gu_v, mlp_v, s);
    if (st.ok()) st = lin(down, mlp_v, d_v, s);
    return st;
  };

  cudaStream_t stream = nullptr;
  KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The chain from the same initial state with the attribute on or off: every buffer it writes.
  auto run = [&](bool pdl, bool graph, std::vector<std::vector<unsigned char>>* out) {
    kf::set_pdl_override(pdl ? 1 : 0);
    if (kftest::gpu_capability() >= 90) {
      EXPECT_EQ(kf::pdl_enabled(), pdl);
    } else {
      EXPECT_FALSE(kf::pdl_enabled());
    }
    xa.upload(xa0), d.upload(d0), kc.upload(kc0), vc.upload(vc0);
    for (Buf* b : {&xb, &h, &qkv_y, &att, &o_y, &gu_y, &mlp}) KF_CUDA_CHECK(cudaMemset(b->p, 0, b->bytes));
    KF_CUDA_CHECK(cudaMemset(dws.p, 0, dws.bytes));  // the split merge counters start at zero (decode.h)
    KF_CUDA_CHECK(cudaDeviceSynchronize());
    if (!graph) {
      for (int i = 0; i < kSteps; ++i) KF_ASSERT_OK(step(i, stream));
    } else {
      cudaGraph_t g = nullptr;
      cudaGraphExec_t exec = nullptr;
      KF_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      kf::Status st = kf::Status::Ok();
      for (int i = 0; i < kGraphSteps && st.ok(); ++i) st = step(i, stream);
      KF_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
      KF_ASSERT_OK(st);
      KF_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      for (int r = 0; r < kReplays; ++r) KF_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KF_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
    }
    KF_CUDA_CHECK(cudaStreamSynchronize(stream));
    KF_CUDA_CHECK(cudaGetLastError());
    kf::set_pdl_override(-1);
    out->clear();
    for (Buf* b : {&xa, &xb, &d, &h, &qkv_y, &att, &o_y, &gu_y, &mlp, &kc, &vc}) out->push_back(b->download());
  };

  const char* names[] = {"x (a)", "x (b)",   "down",         "h",       "qkv",    "attention",
                         "o",     "gate_up", "silu_and_mul", "k_cache", "v_cache"};
  for (bool graph : {false, true}) {
    SCOPED_TRACE(graph ? "CUDA graph of 2 steps, 10 replays" : "20 steps on one stream");
    std::vector<std::vector<unsigned char>> on, off;
    run(true, graph, &on);
    if (HasFatalFailure()) break;
    run(false, graph, &off);
    if (HasFatalFailure()) break;
    ASSERT_EQ(on.size(), off.size());
    for (size_t b = 0; b < on.size(); ++b) EXPECT_TRUE(on[b] == off[b]) << names[b] << " differs with PDL on";
    // The residual stream stays finite: the comparison is of numbers, not of NaN patterns.
    const std::vector<unsigned char>& x = on[0];
    int64_t bad = 0;
    for (size_t i = 0; i + 1 < x.size(); i += 2) {
      uint16_t u;
      std::memcpy(&u, &x[i], 2);
      if (!std::isfinite(kftest::bf16_to_float(u))) ++bad;
    }
    EXPECT_EQ(bad, 0) << "non-finite elements in the residual stream";
  }
  kf::set_pdl_override(-1);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Chain, PdlChainGpu,
                         ::testing::Values(ChainCase{1, false, "m1"}, ChainCase{16, false, "m16"},
                                           ChainCase{1, true, "m1_cp_async"}, ChainCase{16, true, "m16_cp_async"}),
                         [](const ::testing::TestParamInfo<ChainCase>& i) { return i.param.name; });

}  // namespace
