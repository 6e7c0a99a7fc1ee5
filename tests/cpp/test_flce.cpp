// The fused linear cross-entropy (cross_entropy.h) on the GPU against its float64 reference
// (kernelforge::ref::fused_linear_cross_entropy), its argument checks, and the reference against the
// composition of the cross-entropy and GEMM references it stands for.
//
// Every GPU case draws hidden, weight and bias in [-1, 1) and targets that include class 0, the last
// class and ignore_index rows; outputs are poisoned with NaN (so a chunk that writes nothing cannot
// pass, and dweight's first chunk must overwrite: beta 0) and compared element by element. Cases: three
// dtypes; several chunks with a partial last one; an odd vocabulary (the zero-padded weight copy);
// label smoothing, z-loss and softcap; mean, sum and the backward entry (reduction none, a strided
// dloss); a bias and its float32 gradient; one token; no tokens (loss NaN for the mean, zero dweight);
// row-padded hidden, weight and gradients; hidden size 1. Outputs must leave the bytes around them untouched.
// Tolerance, one per dtype: the GPU rounds the logits chunk to the dtype (2^-8 relative in bfloat16)
// before the loss, and the gradient chunk before the two GEMMs, so errors are relative to the largest
// element of each output: |err| <= c (|want| + max |want|).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cross_entropy/flce_problem.h"
#include "kernelforge/cross_entropy.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;

constexpr DType BF16 = DType::kBFloat16;
constexpr DType F16 = DType::kFloat16;
constexpr DType F32 = DType::kFloat32;

double flce_tol(DType t) { return t == BF16 ? 3e-2 : (t == F16 ? 5e-3 : 2e-4); }

struct FlceCase {
  std::string name;
  DType dtype = BF16;
  int64_t T = 300, H = 64, V = 1000, chunk = 128;
  bool bias = true;
  kf::Reduction reduction = kf::Reduction::kMean;
  bool backward = false;  // the backward entry (reduction none)
  double smoothing = 0, z_loss = 0, softcap = 0;
  Layout hidden_layout, grad_layout, weight_layout;
};
void PrintTo(const FlceCase& c, std::ostream* os) { *os << c.name; }

Tol tol_for(DType t, const HostTensor& want) {
  double m = 0;
  for (int64_t i = 0; i < want.numel(); ++i) m = std::max(m, std::fabs(want.get(i)));
  const double c = flce_tol(t);
  return Tol{c, c * m + 1e-12};
}

class FlceGpu : public ::testing::TestWithParam<FlceCase> {};

TEST_P(FlceGpu, MatchesReference) {
  KF_NEED_GPU();
  const FlceCase& c = GetParam();
  if (c.dtype == BF16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
  Rng rng(hash_str(c.name));
  const HostTensor h = random_tensor(c.dtype, {c.T, c.H}, rng, -1.0, 1.0),
                   w = random_tensor(c.dtype, {c.V, c.H}, rng, -1.0, 1.0),
                   b = random_tensor(c.dtype, {c.V}, rng, -1.0, 1.0),
                   dloss = random_tensor(F32, {2 * c.T}, rng, -1.0, 1.0);  // read with stride 2
  HostTensor tg(DType::kInt64, {c.T});
  for (int64_t i = 0; i < c.T; ++i) {
    const double u = rng.uniform(0, 1);
    tg.set(i, i == 0 ? 0 : i == 1 ? c.V - 1 : u < 0.1 ? -100 : std::floor(rng.uniform(0, double(c.V))));
  }
  kf::CrossEntropyOptions o;
  o.reduction = c.backward ? kf::Reduction::kNone : c.reduction;
  o.label_smoothing = c.smoothing, o.z_loss_scale = c.z_loss, o.softcap = c.softcap;

  // float64 reference (CPU views)
  HostTensor rl(F32, {c.T}), lse(F32, {c.T}), valid(F32, {}), loss(F32, {}), dh(c.dtype, {c.T, c.H}),
      dw(c.dtype, {c.V, c.H}), db(F32, {c.V});
  TensorView dlv = dloss.view();
  dlv.shape[0] = c.T, dlv.strides[0] = 2;
  {
    const TensorView hv = h.view(), wv = w.view(), bv = b.view(), tv = tg.view(), rlv = rl.view(), lv = lse.view(),
                     vv = valid.view(), sv = loss.view(), dhv = dh.view(), dwv = dw.view(), dbv = db.view();
    kf::FlceTensors t;
    t.hidden = &hv, t.weight = &wv, t.bias = c.bias ? &bv : nullptr, t.target = &tv;
    t.row_loss = &rlv, t.lse = &lv, t.valid = &vv, t.loss = &sv;
    t.dhidden = &dhv, t.dweight = &dwv, t.dbias = c.bias ? &dbv : nullptr;
    if (c.backward) {
      kf::FlceTensors fwd = t;  // the forward (no gradients) gives the backward's lse
      fwd.dhidden = fwd.dweight = fwd.dbias = nullptr;
      KF_ASSERT_OK(kf::ref::fused_linear_cross_entropy(fwd, o));
      t.dloss = &dlv;
      KF_ASSERT_OK(kf::ref::fused_linear_cross_entropy_backward(t, o));
    } else {
      KF_ASSERT_OK(kf::ref::fused_linear_cross_entropy(t, o));
    }
  }

  DeviceTensor d_h(c.dtype, {c.T, c.H}, c.hidden_layout), d_w(c.dtype, {c.V, c.H}, c.weight_layout),
      d_b(c.dtype, {c.V}), d_tg(DType::kInt64, {c.T}), d_rl(F32, {c.T}), d_lse(F32, {c.T}), d_valid(F32, {}),
      d_loss(F32, {}), d_dh(c.dtype, {c.T, c.H}, c.grad_layout), d_dw(c.dtype, {c.V, c.H}, c.grad_layout),
      d_db(F32, {c.V}), d_dloss(F32, {2 * c.T});
  ASSERT_TRUE(d_h.ok() && d_w.ok() && d_b.ok() && d_tg.ok() && d_rl.ok() && d_lse.ok() && d_valid.ok() && d_loss.ok() &&
              d_dh.ok() && d_dw.ok() && d_db.ok() && d_dloss.ok());
  d_h.upload(h), d_w.upload(w), d_b.upload(b), d_tg.upload(tg), d_dloss.upload(dloss);
  if (c.backward) d_lse.upload(lse);  // the forward's
  const TensorView hv = d_h.view(), wv = d_w.view(), bv = d_b.view(), tv = d_tg.view(), rlv = d_rl.view(),
                   lv = d_lse.view(), vv = d_valid.view(), sv = d_loss.view(), dhv = d_dh.view(), dwv = d_dw.view(),
                   dbv = d_db.view();
  TensorView ddl = d_dloss.view();
  ddl.shape[0] = c.T, ddl.strides[0] = 2;
  kf::FlceTensors t;
  t.hidden = &hv, t.weight = &wv, t.bias = c.bias ? &bv : nullptr, t.target = &tv;
  t.lse = &lv, t.dhidden = &dhv, t.dweight = &dwv, t.dbias = c.bias ? &dbv : nullptr;
  if (c.backward) {
    t.dloss = &ddl;
  } else {
    t.row_loss = &rlv, t.valid = &vv, t.loss = &sv;
  }
  kf::FlcePlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::fused_linear_cross_entropy_plan(t, o, c.chunk, &plan, &bytes));
  SCOPED_TRACE(kf::to_string(plan));
  EXPECT_EQ(plan.padded_vocab, kf::flce_padded_vocab(c.V, c.dtype));
  if (c.chunk > 0) {
    EXPECT_EQ(plan.chunk_tokens, std::max<int64_t>(1, std::min(c.chunk, c.T)));
  }
  void* ws = nullptr;
  KF_CUDA_CHECK(cudaMalloc(&ws, bytes));
  KF_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads (legacy stream) before the non-blocking stream's work
  cudaStream_t stream = nullptr;
  KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const kf::Status st = c.backward ? kf::fused_linear_cross_entropy_backward(plan, t, o, ws, bytes, stream)
                                   : kf::fused_linear_cross_entropy(plan, t, o, ws, bytes, stream);
  KF_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  cudaFree(ws);
  KF_ASSERT_OK(st);

  const double ct = flce_tol(c.dtype);
  if (!c.backward) {
    EXPECT_TRUE(all_close("row_loss", d_rl.download(), rl, Tol{ct, ct * 10}));
    EXPECT_TRUE(all_close("lse", d_lse.download(), lse, Tol{ct, ct * 10}));
    EXPECT_EQ(d_valid.download().get(0), valid.get(0));
    if (c.T > 0 && valid.get(0) > 0) {
      EXPECT_TRUE(all_close("loss", d_loss.download(), loss, Tol{ct, ct * 10}));
    } else if (c.reduction == kf::Reduction::kMean) {
      EXPECT_TRUE(std::isnan(d_loss.download().get(0))) << "mean over no valid row is 0 / 0";
    }
  }
  if (c.T > 0) {
    EXPECT_TRUE(all_close("dhidden", d_dh.download(), dh, tol_for(c.dtype, dh)));
  }
  EXPECT_TRUE(all_close("dweight", d_dw.download(), dw, tol_for(c.dtype, dw)));
  if (c.bias) {
    EXPECT_TRUE(all_close("dbias", d_db.download(), db, tol_for(c.dtype, db)));
  }
  EXPECT_TRUE(d_dh.check_untouched("dhidden"));
  EXPECT_TRUE(d_dw.check_untouched("dweight"));
  EXPECT_TRUE(d_rl.check_untouched("row_loss"));
}

std::vector<FlceCase> flce_cases() {
  std::vector<FlceCase> v;
  for (DType t : {BF16, F16, F32}) {
    const std::string ts = t == BF16 ? "bf16" : (t == F16 ? "fp16" : "fp32");
    FlceCase c;
    c.dtype = t, c.name = ts + "_mean_bias_3_chunks";
    v.push_back(c);
    c = FlceCase{};
    c.dtype = t, c.name = ts + "_odd_vocab_sum_options", c.T = 257, c.H = 96, c.V = 1003, c.chunk = 100;
    c.reduction = kf::Reduction::kSum, c.smoothing = 0.1, c.z_loss = 1e-3, c.softcap = 15;
    v.push_back(c);
    c = FlceCase{};
    c.dtype = t, c.name = ts + "_backward_none_strided_dloss", c.T = 200, c.V = 1001, c.chunk = 64, c.backward = true;
    v.push_back(c);
  }
  FlceCase c;
  c.name = "default_chunk_no_bias", c.chunk = 0, c.bias = false, c.T = 130, c.V = 517;
  v.push_back(c);
  c = FlceCase{};
  c.name = "one_token", c.T = 1, c.V = 128, c.chunk = 0;
  v.push_back(c);
  c = FlceCase{};
  c.name = "no_tokens", c.T = 0, c.V = 77, c.chunk = 0;
  v.push_back(c);
  c = FlceCase{};
  c.name = "padded_rows", c.T = 77, c.V = 333, c.chunk = 32, c.hidden_layout = {8, 0}, c.grad_layout = {8, 0};
  c.weight_layout = {8, 0};  // an odd vocabulary: the padded copy reads the caller's row stride
  v.push_back(c);
  c = FlceCase{};  // a vocabulary that needs no padding: the GEMMs read the caller's weight with its row stride
  c.name = "weight_row_stride", c.T = 100, c.V = 256, c.chunk = 48, c.weight_layout = {8, 0};
  c.reduction = kf::Reduction::kSum;
  v.push_back(c);
  c = FlceCase{};  // hidden size 1: W^T and hidden_c^T are single rows (row-major and column-major at once)
  c.name = "hidden_size_1", c.T = 40, c.H = 1, c.V = 40, c.chunk = 16;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, FlceGpu, ::testing::ValuesIn(flce_cases()),
                         [](const ::testing::TestParamInfo<FlceCase>& i) { return i.param.name; });

// ---- argument checks (no GPU needed: validation reads shapes only) ------------------------------------
TEST(FlceValidation, AcceptsAndRejects) {
  const TensorView h = cuda_view(BF16, {8, 64}, 0, uintptr_t{1} << 40),
                   w = cuda_view(BF16, {100, 64}, 0, uintptr_t{2} << 40),
                   tg = cuda_view(DType::kInt64, {8}, 0, uintptr_t{3} << 40),
                   rl = cuda_view(F32, {8}, 0, uintptr_t{4} << 40), lse = cuda_view(F32, {8}, 0, uintptr_t{5} << 40),
                   valid = cuda_view(F32, {}, 0, uintptr_t{6} << 40), loss = cuda_view(F32, {}, 0, uintptr_t{7} << 40);
  kf::FlceTensors t;
  t.hidden = &h, t.weight = &w, t.target = &tg, t.row_loss = &rl, t.lse = &lse, t.valid = &valid, t.loss = &loss;
  kf::CrossEntropyOptions o;
  kf::FlceParams p;
  EXPECT_TRUE(kf::validate_flce("flce", true, false, t, o, &p).ok());
  const TensorView w7 = cuda_view(BF16, {100, 7}, 0, uintptr_t{2} << 40);
  t.weight = &w7;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "weight must have shape [vocab, 64]");
  const TensorView wf = cuda_view(F16, {100, 64}, 0, uintptr_t{2} << 40);
  t.weight = &wf;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "weight must have hidden's dtype");
  t.weight = &w;
  const TensorView b = cuda_view(BF16, {99}, 0, uintptr_t{8} << 40);
  t.bias = &b;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "bias must have shape [100]");
  t.bias = nullptr;
  const TensorView tg7 = cuda_view(DType::kInt64, {7}, 0, uintptr_t{3} << 40);
  t.target = &tg7;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "target must have shape [8]");
  t.target = &tg;
  const TensorView dh = cuda_view(BF16, {8, 64}, 0, uintptr_t{9} << 40);
  t.dhidden = &dh;
  o.reduction = kf::Reduction::kNone;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "gradients in the forward take reduction");
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, true, t, o, &p), "dloss must not be null");
  o.reduction = kf::Reduction::kMean;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, true, t, o, &p), "the backward entry takes reduction none");
  t.dhidden = nullptr;
  const TensorView db = cuda_view(F32, {100}, 0, uintptr_t{10} << 40);
  t.dbias = &db;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "dbias goes with a bias");
  t.dbias = nullptr;
  o.class_start = 5, o.num_classes = 1000;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "vocabulary shards");
  o = kf::CrossEntropyOptions{};
  TensorView strided = h;
  strided.strides[1] = 2, strided.strides[0] = 128;
  t.hidden = &strided;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p),
                    "hidden must be contiguous in its last dimension");
  t.hidden = &h;
  const TensorView h64 = cuda_view(DType::kFloat64, {8, 64}, 0, uintptr_t{1} << 40);
  t.hidden = &h64;
  KF_EXPECT_INVALID(kf::validate_flce("flce", true, false, t, o, &p), "hidden must be a float32/float16/bfloat16");
}

// The reference on a hand-checkable case: one token, two classes, logits (1, 3): loss = log(1 + e^2) - 1
// for target 0; dlogits = softmax - onehot; dhidden = dl W; dweight = dl^T h; dbias = dl.
TEST(FlceReference, TwoClasses) {
  HostTensor h(DType::kFloat64, {1, 2}), w(DType::kFloat64, {2, 2}), b(DType::kFloat64, {2}), tg(DType::kInt64, {1}),
      rl(F32, {1}), lse(F32, {1}), valid(F32, {}), loss(F32, {}), dh(DType::kFloat64, {1, 2}),
      dw(DType::kFloat64, {2, 2}), db(F32, {2});
  h.set(0, 1), h.set(1, 2);                            // hidden (1, 2)
  w.set(0, 1), w.set(1, 0), w.set(2, 0), w.set(3, 1);  // identity: logits = hidden + bias
  b.set(0, 0), b.set(1, 1);                            // logits (1, 3)
  tg.set(0, 0);
  const TensorView hv = h.view(), wv = w.view(), bv = b.view(), tv = tg.view(), rlv = rl.view(), lv = lse.view(),
                   vv = valid.view(), sv = loss.view(), dhv = dh.view(), dwv = dw.view(), dbv = db.view();
  kf::FlceTensors t;
  t.hidden = &hv, t.weight = &wv, t.bias = &bv, t.target = &tv, t.row_loss = &rlv, t.lse = &lv, t.valid = &vv;
  t.loss = &sv, t.dhidden = &dhv, t.dweight = &dwv, t.dbias = &dbv;
  KF_ASSERT_OK(kf::ref::fused_linear_cross_entropy(t, kf::CrossEntropyOptions{}));
  const double l = std::log(std::exp(1.0) + std::exp(3.0)), p0 = std::exp(1.0 - l), p1 = std::exp(3.0 - l);
  EXPECT_NEAR(loss.get(0), l - 1.0, 1e-6);
  EXPECT_EQ(valid.get(0), 1.0);
  EXPECT_NEAR(db.get(0), p0 - 1, 1e-6);
  EXPECT_NEAR(db.get(1), p1, 1e-6);
  EXPECT_NEAR(dh.get(0), p0 - 1, 1e-12);  // W = I
  EXPECT_NEAR(dh.get(1), p1, 1e-12);
  EXPECT_NEAR(dw.get(0), (p0 - 1) * 1, 1e-12);  // dl_0 h_0
  EXPECT_NEAR(dw.get(3), p1 * 2, 1e-12);        // dl_1 h_1
}

}  // namespace
