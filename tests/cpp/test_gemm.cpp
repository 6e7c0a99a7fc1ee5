// The GEMM family (cuBLASLt with fused epilogues) on the GPU against the float64 reference
// (kernelforge::ref::gemm), its argument checks and the reference itself.
//
// Every GPU case draws a, b and the bias in [-1, 1), runs the planned call on out / aux / a_sum poisoned
// with NaN (the first run of a problem also times cuBLASLt's candidates) and checks the padding around out
// untouched, then the one-shot entry. Cases: the three activations with and without
// bias; aux (the pre-activation); a and b each row- or column-major (column-major: a transposed view,
// as the backward's dx = dy W and dW = dy^T x pass them); a_sum (the bias gradient) with a column-major
// a; odd sizes with 2-byte-aligned bases and rows; padded out rows; M = 1; K = 0, N = 0 and M = 0.
// Tolerance: K products in float32 of values rounded to the dtype: |err| <= K u_f32 sum |a b| (tiny)
// plus out's one rounding (u |out|), so atol = 2^-20 K + u and rtol 2u; cuBLASLt's GELU evaluates tanh
// approximately: 2^-11 more atol with gelu_tanh.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemm/gemm_problem.h"
#include "kernelforge/gemm.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
using Act = kf::GemmActivation;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;
constexpr DType F32 = DType::kFloat32;

struct GemmCase {
  std::string name;
  DType dtype = BF16;
  int64_t M = 64, N = 96, K = 80;
  Act act = Act::kNone;
  bool bias = true, aux = false, a_sum = false;
  bool accumulate = false;            // out += a b^T on out's prior values
  bool a_col = false, b_col = false;  // column-major operand (a transposed view)
  Layout a_layout, b_layout, out_layout;
};
void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name; }

// A [rows, cols] host matrix on the device, row-major, or column-major: stored as its transpose
// [cols, rows] and viewed with strides (1, row stride of the stored transpose).
struct Operand {
  DeviceTensor dev;
  bool col = false;
  Operand(const HostTensor& h, bool col_major, Layout layout)
      : dev(h.dtype, col_major ? std::vector<int64_t>{h.shape[1], h.shape[0]} : h.shape, layout), col(col_major) {
    if (!col) {
      dev.upload(h);
      return;
    }
    HostTensor t(h.dtype, {h.shape[1], h.shape[0]});
    for (int64_t r = 0; r < h.shape[0]; ++r)
      for (int64_t c = 0; c < h.shape[1]; ++c) t.set(c * h.shape[0] + r, h.get(r * h.shape[1] + c));
    dev.upload(t);
  }
  TensorView view() const {
    TensorView v = dev.view();
    if (col) {
      std::swap(v.shape[0], v.shape[1]);
      v.strides[1] = v.strides[0];
      v.strides[0] = 1;
    }
    return v;
  }
};

class GemmGpu : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmGpu, MatchesReference) {
  KF_NEED_GPU();
  const GemmCase& c = GetParam();
  if (c.dtype == BF16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80";
  Rng rng(hash_str(c.name));
  const HostTensor a = random_tensor(c.dtype, {c.M, c.K}, rng, -1.0, 1.0),
                   b = random_tensor(c.dtype, {c.N, c.K}, rng, -1.0, 1.0),
                   bias = random_tensor(c.dtype, {c.N}, rng, -1.0, 1.0);
  const HostTensor prior = random_tensor(c.dtype, {c.M, c.N}, rng, -1.0, 1.0);  // out's values before accumulate
  HostTensor out_ref = c.accumulate ? prior : HostTensor(c.dtype, {c.M, c.N});
  HostTensor aux_ref(c.dtype, {c.M, c.N}), sum_ref(c.dtype, {c.M});
  {
    const TensorView av = a.view(), bv = b.view(), biv = bias.view(), ov = out_ref.view(), xv = aux_ref.view(),
                     sv = sum_ref.view();
    kf::GemmTensors t;
    t.a = &av, t.b = &bv, t.bias = c.bias ? &biv : nullptr, t.out = &ov;
    t.aux = c.aux ? &xv : nullptr, t.a_sum = c.a_sum ? &sv : nullptr, t.accumulate = c.accumulate;
    KF_ASSERT_OK(kf::ref::gemm(t, c.act));
  }
  Operand da(a, c.a_col, c.a_layout), db(b, c.b_col, c.b_layout);
  DeviceTensor dbias(c.dtype, {c.N}), dout(c.dtype, {c.M, c.N}, c.out_layout), daux(c.dtype, {c.M, c.N}),
      dsum(c.dtype, {c.M});
  ASSERT_TRUE(da.dev.ok() && db.dev.ok() && dbias.ok() && dout.ok() && daux.ok() && dsum.ok());
  dbias.upload(bias);
  if (c.accumulate) dout.upload(prior);
  const TensorView av = da.view(), bv = db.view(), biv = dbias.view(), ov = dout.view(), xv = daux.view(),
                   sv = dsum.view();
  kf::GemmTensors t;
  t.a = &av, t.b = &bv, t.bias = c.bias ? &biv : nullptr, t.out = &ov;
  t.aux = c.aux ? &xv : nullptr, t.a_sum = c.a_sum ? &sv : nullptr, t.accumulate = c.accumulate;
  kf::GemmPlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::gemm_plan(t, c.act, &plan, &bytes));
  SCOPED_TRACE(kf::to_string(plan));
  void* ws = nullptr;
  if (bytes > 0) KF_CUDA_CHECK(cudaMalloc(&ws, bytes));
  KF_ASSERT_OK(kf::gemm(plan, t, c.act, ws, bytes, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  if (ws) cudaFree(ws);
  const double u = c.dtype == BF16 ? 1.0 / 256 : (c.dtype == F16 ? 1.0 / 2048 : std::ldexp(1.0, -24));
  const Tol tol{2 * u, std::ldexp(double(c.K), -20) + u + (c.act == Act::kGeluTanh ? 1.0 / 2048 : 0.0)};
  EXPECT_TRUE(all_close("out", dout.download(), out_ref, tol));
  EXPECT_TRUE(dout.check_untouched("out"));
  if (c.aux) {
    EXPECT_TRUE(all_close("aux", daux.download(), aux_ref, tol));
  }
  if (c.a_sum) {
    EXPECT_TRUE(all_close("a_sum", dsum.download(), sum_ref, tol));
  }

  // The first run timed cuBLASLt's candidates (an accumulating one is never timed, and planned as tuned):
  // planning again gives the kept one, tuned, whose workspace is at most the untuned plan's (that one
  // fits every candidate).
  kf::GemmPlan again;
  size_t again_bytes = 0;
  KF_ASSERT_OK(kf::gemm_plan(t, c.act, &again, &again_bytes));
  const char* tune = std::getenv("KF_GEMM_TUNE");
  if (tune == nullptr || std::string(tune) != "0") {
    EXPECT_TRUE(again.tuned || again.algo_id < 0) << kf::to_string(again);
  }
  EXPECT_LE(again_bytes, bytes);

  // The one-shot entry: size query, then the run, same result.
  dout.poison();
  if (c.accumulate) dout.upload(prior);
  size_t need = 0;
  KF_ASSERT_OK(kf::gemm(t, c.act, nullptr, &need, nullptr));
  EXPECT_EQ(need, again_bytes);
  if (need > 0) KF_CUDA_CHECK(cudaMalloc(&ws, need));
  KF_ASSERT_OK(kf::gemm(t, c.act, need > 0 ? ws : reinterpret_cast<void*>(uintptr_t{256}), &need, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  if (need > 0) cudaFree(ws);
  EXPECT_TRUE(all_close("out (one-shot)", dout.download(), out_ref, tol));
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> v;
  for (DType t : {BF16, F16, F32}) {
    const std::string ts = t == BF16 ? "bf16" : (t == F16 ? "fp16" : "fp32");
    for (Act act : {Act::kNone, Act::kRelu, Act::kGeluTanh})
      for (bool bias : {false, true}) {
        GemmCase c;
        c.dtype = t, c.act = act, c.bias = bias, c.M = 200, c.N = 256, c.K = 320;
        c.name = ts + "_" + kf::to_string(act) + (bias ? "_bias" : "");
        v.push_back(c);
      }
    GemmCase c;
    c.dtype = t, c.act = Act::kGeluTanh, c.aux = true, c.M = 130, c.N = 136, c.K = 4096;
    c.name = ts + "_gelu_bias_aux_k4096";
    v.push_back(c);
  }
  for (bool a_col : {false, true})
    for (bool b_col : {false, true}) {
      GemmCase c;
      c.a_col = a_col, c.b_col = b_col, c.act = Act::kRelu;
      c.name = std::string("a_") + (a_col ? "col" : "row") + "_b_" + (b_col ? "col" : "row");
      v.push_back(c);
    }
  GemmCase c;
  c.name = "a_sum_weight_grad", c.a_col = true, c.b_col = true, c.bias = false, c.a_sum = true, c.M = 96, c.N = 64,
  c.K = 1000;
  v.push_back(c);
  c = GemmCase{};  // the weight gradient of a one-token step: a = dy^T is [N, 1]
  c.name = "a_sum_one_token", c.a_col = true, c.b_col = true, c.bias = false, c.a_sum = true, c.M = 64, c.N = 64,
  c.K = 1;
  v.push_back(c);
  c = GemmCase{};
  c.name = "odd_unaligned", c.M = 7, c.N = 129, c.K = 67, c.act = Act::kGeluTanh, c.a_layout = {1, 1},
  c.b_layout = {3, 1}, c.out_layout = {1, 0};
  v.push_back(c);
  c = GemmCase{};
  c.name = "padded_out", c.out_layout = {8, 0}, c.act = Act::kGeluTanh;
  v.push_back(c);
  c = GemmCase{};
  c.name = "m1", c.M = 1, c.N = 4096, c.K = 4096;
  v.push_back(c);
  c = GemmCase{};
  c.name = "k0_gelu_aux", c.K = 0, c.act = Act::kGeluTanh, c.aux = true;
  v.push_back(c);
  c = GemmCase{};
  c.name = "k0_a_sum", c.K = 0, c.bias = false, c.a_sum = true;
  v.push_back(c);
  c = GemmCase{};
  c.name = "n0_a_sum", c.N = 0, c.bias = false, c.a_sum = true, c.a_col = true;
  v.push_back(c);
  c = GemmCase{};
  c.name = "m0", c.M = 0;
  v.push_back(c);
  // accumulate: a chunked weight gradient's running sum (dW += dy_c^T x_c: both operands transposed views)
  for (DType t : {BF16, F32}) {
    c = GemmCase{};
    c.dtype = t, c.accumulate = true, c.bias = false, c.a_col = true, c.b_col = true, c.M = 136, c.N = 200, c.K = 1000;
    c.name = std::string("accumulate_") + (t == BF16 ? "bf16" : "fp32");
    v.push_back(c);
  }
  c = GemmCase{};
  c.name = "accumulate_odd_padded_out", c.accumulate = true, c.bias = false, c.M = 7, c.N = 129, c.K = 67,
  c.out_layout = {8, 0};
  v.push_back(c);
  c = GemmCase{};
  c.name = "accumulate_k0", c.accumulate = true, c.bias = false, c.K = 0;  // out keeps its values
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmGpu, ::testing::ValuesIn(gemm_cases()),
                         [](const ::testing::TestParamInfo<GemmCase>& i) { return i.param.name; });

// Batched products (torch.bmm / matmul): out [B, M, N]; a and b each [B, ., K] or 2-D (shared by every
// batch); b optionally torch's [B, K, N] taken as the transposed view [B, N, K] (column-major matrices);
// out with padded rows (its batch stride follows); the bias shared; aux [B, M, N].
struct BatchedCase {
  std::string name;
  int64_t B = 3, M = 70, N = 96, K = 136;
  bool a_shared = false, b_shared = false, b_torch = false, bias = true, aux = false;
  Act act = Act::kNone;
  int64_t out_pad = 0;
};
void PrintTo(const BatchedCase& c, std::ostream* os) { *os << c.name; }

class GemmBatchedGpu : public ::testing::TestWithParam<BatchedCase> {};

TEST_P(GemmBatchedGpu, MatchesReference) {
  KF_NEED_GPU();
  const BatchedCase& c = GetParam();
  Rng rng(hash_str(c.name));
  const std::vector<int64_t> a_shape =
      c.a_shared ? std::vector<int64_t>{c.M, c.K} : std::vector<int64_t>{c.B, c.M, c.K};
  // b as stored: [B, N, K] row-major, or torch's [B, K, N] (then viewed transposed)
  std::vector<int64_t> b_store = c.b_torch ? std::vector<int64_t>{c.B, c.K, c.N} : std::vector<int64_t>{c.B, c.N, c.K};
  if (c.b_shared) b_store.erase(b_store.begin());
  const HostTensor a = random_tensor(BF16, a_shape, rng, -1.0, 1.0), b = random_tensor(BF16, b_store, rng, -1.0, 1.0),
                   bias = random_tensor(BF16, {c.N}, rng, -1.0, 1.0);
  auto transposed = [&](TensorView v) {  // [.., K, N] stored -> the [.., N, K] view
    if (!c.b_torch) return v;
    const int d = v.ndim;
    std::swap(v.shape[d - 1], v.shape[d - 2]);
    std::swap(v.strides[d - 1], v.strides[d - 2]);
    return v;
  };
  HostTensor out_ref(BF16, {c.B, c.M, c.N}), aux_ref(BF16, {c.B, c.M, c.N});
  {
    const TensorView av = a.view(), bv = transposed(b.view()), biv = bias.view(), ov = out_ref.view(),
                     xv = aux_ref.view();
    kf::GemmTensors t;
    t.a = &av, t.b = &bv, t.bias = c.bias ? &biv : nullptr, t.out = &ov, t.aux = c.aux ? &xv : nullptr;
    KF_ASSERT_OK(kf::ref::gemm(t, c.act));
  }
  DeviceTensor da(BF16, a_shape), db(BF16, b_store), dbias(BF16, {c.N}),
      dout(BF16, {c.B, c.M, c.N}, Layout{c.out_pad, 0}), daux(BF16, {c.B, c.M, c.N});
  ASSERT_TRUE(da.ok() && db.ok() && dbias.ok() && dout.ok() && daux.ok());
  da.upload(a), db.upload(b), dbias.upload(bias);
  const TensorView av = da.view(), bv = transposed(db.view()), biv = dbias.view(), ov = dout.view(), xv = daux.view();
  kf::GemmTensors t;
  t.a = &av, t.b = &bv, t.bias = c.bias ? &biv : nullptr, t.out = &ov, t.aux = c.aux ? &xv : nullptr;
  size_t need = 0;
  KF_ASSERT_OK(kf::gemm(t, c.act, nullptr, &need, nullptr));
  void* ws = nullptr;
  if (need > 0) KF_CUDA_CHECK(cudaMalloc(&ws, need));
  KF_ASSERT_OK(kf::gemm(t, c.act, need > 0 ? ws : reinterpret_cast<void*>(uintptr_t{256}), &need, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  if (ws) cudaFree(ws);
  const double u = 1.0 / 256;
  const Tol tol{2 * u, std::ldexp(double(c.K), -20) + u + (c.act == Act::kGeluTanh ? 1.0 / 2048 : 0.0)};
  EXPECT_TRUE(all_close("out", dout.download(), out_ref, tol));
  EXPECT_TRUE(dout.check_untouched("out"));
  if (c.aux) {
    EXPECT_TRUE(all_close("aux", daux.download(), aux_ref, tol));
  }
}

std::vector<BatchedCase> batched_cases() {
  std::vector<BatchedCase> v;
  BatchedCase c;
  c.name = "both_batched";
  v.push_back(c);
  c = BatchedCase{};
  c.name = "torch_b_gelu_aux", c.b_torch = true, c.act = Act::kGeluTanh, c.aux = true;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "a_shared", c.a_shared = true, c.b_torch = true, c.bias = false;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "b_shared_relu", c.b_shared = true, c.act = Act::kRelu;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "odd_padded_out", c.B = 5, c.M = 7, c.N = 129, c.K = 67, c.out_pad = 3, c.b_torch = true;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "one_batch", c.B = 1;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "k0_gelu_aux", c.K = 0, c.act = Act::kGeluTanh, c.aux = true;
  v.push_back(c);
  c = BatchedCase{};
  c.name = "batch0", c.B = 0;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmBatchedGpu, ::testing::ValuesIn(batched_cases()),
                         [](const ::testing::TestParamInfo<BatchedCase>& i) { return i.param.name; });

kf::Status validate(const TensorView& a, const TensorView& b, const TensorView* bias, const TensorView& out,
                    Act act = Act::kNone, const TensorView* aux = nullptr, const TensorView* a_sum = nullptr) {
  kf::GemmTensors t;
  t.a = &a, t.b = &b, t.bias = bias, t.out = &out, t.aux = aux, t.a_sum = a_sum;
  kf::GemmParams p;
  DType d;
  return kf::validate_gemm("gemm", true, t, act, &p, &d);
}

TEST(GemmValidation, AcceptsAndRejects) {
  const TensorView a = cuda_view(BF16, {4, 64}, 0, uintptr_t{1} << 40),
                   b = cuda_view(BF16, {32, 64}, 0, uintptr_t{2} << 40),
                   out = cuda_view(BF16, {4, 32}, 0, uintptr_t{3} << 40),
                   bias = cuda_view(BF16, {32}, 0, uintptr_t{4} << 40),
                   sum = cuda_view(BF16, {4}, 0, uintptr_t{5} << 40);
  EXPECT_TRUE(validate(a, b, &bias, out).ok());
  EXPECT_TRUE(validate(a, b, &bias, out, Act::kGeluTanh, &out).ok());
  TensorView at = cuda_view(BF16, {64, 4}, 0, uintptr_t{1} << 40);  // a column-major [4, 64] view
  std::swap(at.shape[0], at.shape[1]);
  at.strides[1] = 4, at.strides[0] = 1;
  EXPECT_TRUE(validate(at, b, nullptr, out, Act::kNone, nullptr, &sum).ok());
  KF_EXPECT_INVALID(validate(cuda_view(BF16, {4, 2, 64}), b, nullptr, out), "a must have 2 dimensions");
  KF_EXPECT_INVALID(validate(a, cuda_view(BF16, {32, 63}, 0, uintptr_t{2} << 40), nullptr, out),
                    "b must have a's K = 64");
  KF_EXPECT_INVALID(validate(a, cuda_view(F16, {32, 64}, 0, uintptr_t{2} << 40), nullptr, out),
                    "b must have a's dtype");
  KF_EXPECT_INVALID(validate(a, b, nullptr, cuda_view(BF16, {4, 31}, 0, uintptr_t{3} << 40)),
                    "out must have shape [4, 32]");
  KF_EXPECT_INVALID(validate(cuda_view(DType::kFloat64, {4, 64}), b, nullptr, out),
                    "a must be float16, bfloat16 or float32");
  {
    kf::GemmTensors acc;
    acc.a = &a, acc.b = &b, acc.bias = &bias, acc.out = &out, acc.accumulate = true;
    kf::GemmParams p;
    DType d;
    KF_EXPECT_INVALID(kf::validate_gemm("gemm", true, acc, Act::kNone, &p, &d), "accumulate (out += a b^T) goes");
  }
  TensorView strided = a;
  strided.strides[0] = 128, strided.strides[1] = 2;
  KF_EXPECT_INVALID(validate(strided, b, nullptr, out), "a must be row-major or column-major");
  KF_EXPECT_INVALID(validate(a, b, nullptr, out, Act::kRelu, &out), "aux (the pre-activation");
  KF_EXPECT_INVALID(validate(a, b, &bias, out, Act::kNone, nullptr, &sum), "a_sum (the bias gradient");
  KF_EXPECT_INVALID(validate(a, b, &sum, out), "bias must have shape [32]");
  TensorView out_t = out;
  out_t.strides[0] = 1, out_t.strides[1] = 4;
  KF_EXPECT_INVALID(validate(a, b, nullptr, out_t), "out must be row-major");

  // batched: out [B, M, N]; a and b [B, ., K] with out's B or 2-D (shared)
  const TensorView a3 = cuda_view(BF16, {3, 4, 64}, 0, uintptr_t{1} << 40),
                   b3 = cuda_view(BF16, {3, 32, 64}, 0, uintptr_t{2} << 40),
                   out3 = cuda_view(BF16, {3, 4, 32}, 0, uintptr_t{3} << 40);
  EXPECT_TRUE(validate(a3, b3, &bias, out3).ok());
  EXPECT_TRUE(validate(a, b3, &bias, out3).ok());
  EXPECT_TRUE(validate(a3, b, nullptr, out3, Act::kGeluTanh, &out3).ok());
  KF_EXPECT_INVALID(validate(a3, cuda_view(BF16, {2, 32, 64}, 0, uintptr_t{2} << 40), nullptr, out3),
                    "b must have out's batch size 3");
  KF_EXPECT_INVALID(validate(a3, b3, nullptr, cuda_view(BF16, {3, 4, 31}, 0, uintptr_t{3} << 40)),
                    "out must have shape [3, 4, 32]");
  TensorView overlap = out3;
  overlap.strides[0] = 64;
  KF_EXPECT_INVALID(validate(a3, b3, nullptr, overlap), "out's batches overlap");
  KF_EXPECT_INVALID(validate(a3, b3, nullptr, out3, Act::kNone, nullptr, &sum), "a_sum (the bias gradient");
  KF_EXPECT_INVALID(validate(a3, b3, nullptr, cuda_view(BF16, {3, 1, 4, 32})), "out must have 2 dimensions");
}

TEST(GemmReference, SmallProductWithEpilogues) {
  HostTensor a(DType::kFloat64, {2, 3}), b(DType::kFloat64, {2, 3}), bias(DType::kFloat64, {2}),
      out(DType::kFloat64, {2, 2}), aux(DType::kFloat64, {2, 2});
  const double as[] = {1, 2, 3, -1, 0, 2}, bs[] = {1, 0, -1, 2, 1, 1};
  for (int i = 0; i < 6; ++i) a.set(i, as[i]), b.set(i, bs[i]);
  bias.set(0, 0.5), bias.set(1, -1);
  const TensorView av = a.view(), bv = b.view(), biv = bias.view(), ov = out.view(), xv = aux.view();
  kf::GemmTensors t;
  t.a = &av, t.b = &bv, t.bias = &biv, t.out = &ov;
  KF_ASSERT_OK(kf::ref::gemm(t, Act::kRelu));
  EXPECT_EQ(out.get(0), 0.0);  // relu(1 - 3 + 0.5)
  EXPECT_EQ(out.get(1), 6.0);  // 2 + 2 + 3 - 1
  EXPECT_EQ(out.get(2), 0.0);  // relu(-1 - 2 + 0.5)
  EXPECT_EQ(out.get(3), 0.0);  // relu(-2 + 0 + 2 - 1)
  t.aux = &xv;
  KF_ASSERT_OK(kf::ref::gemm(t, Act::kGeluTanh));
  EXPECT_EQ(aux.get(0), -1.5);
  const double x = -1.5, g = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  EXPECT_NEAR(out.get(0), g, 1e-15);
}

}  // namespace
