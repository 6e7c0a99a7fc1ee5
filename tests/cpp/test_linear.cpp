// The skinny linear kernels on the GPU against the float64 reference (kernelforge::ref::linear), the
// planner and the argument checks.
//
// Every GPU case draws x and w in [-1, 1) (and a bias) and runs, on y poisoned with NaN, the default
// plan and every candidate kernel (the cp.async kernel everywhere; the TMA kernel on sm_90 with a 90a
// build when x and w are TMA-aligned, which the case states and the test requires; the GEMV kernel
// when M <= 4, K % 8 == 0 and the rows are 16-byte aligned, likewise) at its planned K split and at 1,
// 3 and the kernel's most splits (16 for cp.async, 8 = the cluster limit for TMA; GEMV: 1 only),
// checking that y's row padding stays untouched.
// Cases: M 1 to 16; K 1, 7 (below TMA's 16 bytes), 8, 40 (K < 64), 1000, 4100 (partial tiles), 5000
// with an odd row stride (the element-load path); N 1, 3, 127, 129, 200, 300, 4096 (partial column
// blocks); an unaligned x base; strided (padded) x, w and y rows, a single x row of odd stride (TMA:
// its stride is never used).
// Tolerance: K products in float32 of values rounded to the dtype: |err| <= K u_f32 sum |x w| (tiny)
// plus y's one rounding (u |y|); sum |x w| <= K / 4 on average, so atol = 2^-20 K + u and rtol 2u.
#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/device.h"
#include "kernelforge/linear.h"
#include "linear/linear_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;

constexpr DType F16 = DType::kFloat16;
constexpr DType BF16 = DType::kBFloat16;

struct LinCase {
  std::string name;
  DType dtype = BF16;
  int64_t M = 1, N = 128, K = 64;
  bool bias = true;
  bool tma = true;  // x and w meet the TMA kernel's alignment (LinearParams::tma)
  // the GEMV kernel can run it (LinearParams::gemv); -1: M <= 4 and K % 8 == 0 with the default layouts
  int gemv = -1;
  Layout x_layout, w_layout, y_layout;
};
void PrintTo(const LinCase& c, std::ostream* os) { *os << c.name; }

class LinearGpu : public ::testing::TestWithParam<LinCase> {};

TEST_P(LinearGpu, MatchesReference) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "linear needs sm_80";
  const LinCase& c = GetParam();
  Rng rng(hash_str(c.name));
  HostTensor x = random_tensor(c.dtype, {c.M, c.K}, rng, -1.0, 1.0),
             w = random_tensor(c.dtype, {c.N, c.K}, rng, -1.0, 1.0);
  HostTensor b = random_tensor(c.dtype, {c.N}, rng, -1.0, 1.0), y_ref(c.dtype, {c.M, c.N});
  {
    const TensorView xv = x.view(), wv = w.view(), bv = b.view(), yv = y_ref.view();
    kf::LinearTensors t;
    t.x = &xv, t.w = &wv, t.bias = c.bias ? &bv : nullptr, t.y = &yv;
    KF_ASSERT_OK(kf::ref::linear(t));
  }
  DeviceTensor dx(c.dtype, {c.M, c.K}, c.x_layout), dw(c.dtype, {c.N, c.K}, c.w_layout), db(c.dtype, {c.N}),
      dy(c.dtype, {c.M, c.N}, c.y_layout);
  ASSERT_TRUE(dx.ok() && dw.ok() && db.ok() && dy.ok());
  dx.upload(x), dw.upload(w), db.upload(b);
  const TensorView xv = dx.view(), wv = dw.view(), bv = db.view(), yv = dy.view();
  kf::LinearTensors t;
  t.x = &xv, t.w = &wv, t.bias = c.bias ? &bv : nullptr, t.y = &yv;
  kf::LinearParams prm;
  DType dt;
  KF_ASSERT_OK(kf::validate_linear("linear", true, t, &prm, &dt));
  EXPECT_EQ(prm.tma, c.tma);
  int device = 0;
  const kf::DeviceInfo* dev = nullptr;
  KF_ASSERT_OK(kf::current_device_info(&device, &dev));
  const bool tma_built = dev->capability == 90 && kf::linear_tma_built();
  kf::LinearPlan plan;
  size_t bytes = 0;
  KF_ASSERT_OK(kf::linear_plan(t, &plan, &bytes));
  std::vector<kf::LinearPlan> plans = {plan};
  bool has_tma = false, has_gemv = false;
  for (const kf::LinearPlan& cand : kf::linear_candidate_plans(prm, *dev, tma_built)) {
    has_tma = has_tma || cand.kernel == kf::LinearKernel::kTma;
    if (cand.kernel == kf::LinearKernel::kGemv) {
      has_gemv = true;
      plans.push_back(cand);
      continue;
    }
    const int most = cand.kernel == kf::LinearKernel::kTma ? 8 : 16;
    for (int s : {cand.splits, 1, 3, most}) {
      kf::LinearPlan p = cand;
      p.splits = s;
      plans.push_back(p);
    }
  }
  EXPECT_EQ(has_tma, tma_built && c.tma);
  EXPECT_EQ(has_gemv, c.gemv >= 0 ? c.gemv == 1 : c.M <= 4 && c.K % 8 == 0);
  const double u = c.dtype == BF16 ? 1.0 / 256 : 1.0 / 2048;
  const Tol tol{2 * u, std::ldexp(double(c.K), -20) + u};
  for (const kf::LinearPlan& p : plans) {
    SCOPED_TRACE(kf::to_string(p));
    dy.poison();
    const size_t need = kf::linear_workspace_bytes(p, prm);
    void* ws = nullptr;
    if (need > 0) KF_CUDA_CHECK(cudaMalloc(&ws, need));
    KF_ASSERT_OK(kf::linear(p, t, ws, need, nullptr));
    KF_CUDA_CHECK(cudaDeviceSynchronize());
    if (ws) cudaFree(ws);
    EXPECT_TRUE(all_close("y", dy.download(), y_ref, tol));
    EXPECT_TRUE(dy.check_untouched("y"));
  }
}

std::vector<LinCase> lin_cases() {
  std::vector<LinCase> v;
  for (DType t : {BF16, F16}) {
    const std::string ts = t == BF16 ? "bf16" : "fp16";
    for (int64_t M : {1, 7, 16}) {
      LinCase c;
      c.dtype = t, c.M = M, c.N = 4096, c.K = 4096;
      c.name = ts + "_m" + std::to_string(M) + "_n4096_k4096";
      v.push_back(c);
    }
  }
  LinCase c;
  for (int64_t K : {1, 7, 8, 40, 64, 4100}) {
    c.K = K, c.N = 127, c.M = 3, c.tma = K >= 8 && K % 8 == 0;
    c.name = "k" + std::to_string(K) + "_n127";
    v.push_back(c);
  }
  int i = 0;
  for (int64_t M : {2, 4, 5, 8, 11, 13, 15}) {  // every M class of the A fragment (rows g, g + 8)
    c = LinCase{};
    c.dtype = i++ % 2 ? F16 : BF16, c.M = M, c.N = M % 2 ? 200 : 129, c.K = 1000;
    c.name = "m" + std::to_string(M) + "_n" + std::to_string(c.N) + "_k1000";
    v.push_back(c);
  }
  c = LinCase{};
  c.K = 5000, c.N = 3, c.M = 16, c.x_layout = {3, 0}, c.w_layout = {1, 0}, c.tma = false, c.name = "k5000_odd_strides";
  v.push_back(c);
  c = LinCase{};
  c.K = 4104, c.N = 257, c.M = 1, c.x_layout = {3, 0}, c.name = "m1_odd_x_stride";
  v.push_back(c);
  c = LinCase{};  // GEMV: x rows of odd stride at M > 1, w rows padded to 16 bytes, y strided
  c.K = 2056, c.N = 131, c.M = 3, c.x_layout = {3, 0}, c.w_layout = {8, 0}, c.y_layout = {5, 0}, c.tma = false,
  c.gemv = 0, c.name = "m3_odd_x_stride";
  v.push_back(c);
  c = LinCase{};  // GEMV: several rounds of K (2048 a round) with a partial last one, N not a multiple of 4
  c.dtype = F16, c.K = 8200, c.N = 2047, c.M = 4, c.w_layout = {8, 0}, c.name = "m4_k8200_padded_w";
  v.push_back(c);
  c = LinCase{};
  c.K = 1024, c.N = 1, c.M = 5, c.bias = false, c.name = "n1_nobias";
  v.push_back(c);
  c = LinCase{};
  c.K = 512, c.N = 300, c.M = 2, c.x_layout = {0, 1}, c.tma = false, c.gemv = 0, c.name = "x_unaligned";
  v.push_back(c);
  c = LinCase{};
  c.K = 2048, c.N = 640, c.M = 9, c.x_layout = {8, 0}, c.w_layout = {8, 0}, c.y_layout = {5, 0}, c.name = "padded_rows";
  v.push_back(c);
  c = LinCase{};
  c.K = 2048, c.N = 384, c.M = 6, c.w_layout = {4, 0}, c.tma = false, c.name = "w_rows_not_16_bytes";
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearGpu, ::testing::ValuesIn(lin_cases()),
                         [](const ::testing::TestParamInfo<LinCase>& i) { return i.param.name; });

TEST(LinearPlan, SplitsFillTheGpu) {
  kf::DeviceInfo h100;
  h100.sm_count = 132, h100.capability = 90;
  kf::LinearParams p;  // p.tma false: the cp.async kernel
  p.M = 1, p.N = 4096, p.K = 4096;
  const kf::LinearPlan a = kf::plan_linear(p, h100, true);  // 32 column tiles: split K to fill 264 slots
  EXPECT_EQ(a.kernel, kf::LinearKernel::kCpAsync);
  EXPECT_GE(a.splits, 4);
  EXPECT_LE(a.splits, 16);
  p.N = 128256, p.K = 2048;  // an LM head: 1002 column tiles, no split
  EXPECT_EQ(kf::plan_linear(p, h100, true).splits, 1);
  p.N = 4096, p.K = 64;  // one K tile: nothing to split
  EXPECT_EQ(kf::plan_linear(p, h100, true).splits, 1);
  EXPECT_EQ(kf::to_string(a).rfind("linear_skinny tile=128x64 warps=4 stages=4 splits=", 0), 0u);
  EXPECT_GT(kf::linear_workspace_bytes(a, p), 0u);
  kf::LinearPlan bad = a;
  bad.block_k = 32;
  KF_EXPECT_INVALID(kf::check_linear_plan(bad, p, h100), "no such kernel");
}

TEST(LinearPlan, ChoosesTheKernel) {
  kf::DeviceInfo h100, a100;
  h100.sm_count = 132, h100.capability = 90;
  a100.sm_count = 108, a100.capability = 80;
  kf::LinearParams p;
  p.M = 16, p.N = 14336, p.K = 4096, p.vec16 = true, p.tma = true;
  const kf::LinearPlan t = kf::plan_linear(p, h100, true);
  EXPECT_EQ(t.kernel, kf::LinearKernel::kTma) << kf::to_string(t);
  EXPECT_EQ(kf::to_string(t).rfind("linear_skinny_tma tile=128x64 warps=4+1 stages=6 splits=", 0), 0u);
  EXPECT_GE(t.splits, 2);  // 112 column blocks for 264 slots
  EXPECT_LE(t.splits, 8);
  EXPECT_EQ(kf::linear_workspace_bytes(t, p), 0u);  // the cluster adds the splits
  EXPECT_TRUE(kf::check_linear_plan(t, p, h100).ok());
  // The cp.async kernel: no 90a image, another GPU, unaligned tensors.
  EXPECT_EQ(kf::plan_linear(p, h100, false).kernel, kf::LinearKernel::kCpAsync);
  EXPECT_EQ(kf::plan_linear(p, a100, true).kernel, kf::LinearKernel::kCpAsync);
  kf::LinearParams u = p;
  u.tma = false;
  EXPECT_EQ(kf::plan_linear(u, h100, true).kernel, kf::LinearKernel::kCpAsync);
  // An LM head: no split either way, the TMA kernel.
  p.N = 128256, p.K = 2048;
  EXPECT_EQ(kf::plan_linear(p, h100, true).kernel, kf::LinearKernel::kTma);
  EXPECT_EQ(kf::plan_linear(p, h100, true).splits, 1);
  // N = 1024: 8 column blocks; 8 splits (the cluster limit) fill 64 of 264 slots, the cp.async kernel's
  // 16 fill 128 and win the cost model.
  p.N = 1024, p.K = 4096;
  const kf::LinearPlan narrow = kf::plan_linear(p, h100, true);
  EXPECT_EQ(narrow.kernel, kf::LinearKernel::kCpAsync) << kf::to_string(narrow);
  EXPECT_GT(narrow.splits, 8);
  // Candidates: both kernels when the TMA one can run, the cp.async one first.
  const std::vector<kf::LinearPlan> both = kf::linear_candidate_plans(p, h100, true);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].kernel, kf::LinearKernel::kCpAsync);
  EXPECT_EQ(both[1].kernel, kf::LinearKernel::kTma);
  EXPECT_EQ(both[1].splits, 8);
  EXPECT_EQ(kf::linear_candidate_plans(u, h100, true).size(), 1u);
  EXPECT_EQ(kf::linear_candidate_plans(p, a100, true).size(), 1u);
  EXPECT_EQ(kf::linear_candidate_plans(p, h100, false).size(), 1u);
  // check_linear_plan: the cluster limit, the tile, the alignment and the device.
  kf::LinearPlan bad = both[1];
  bad.splits = 9;
  KF_EXPECT_INVALID(kf::check_linear_plan(bad, p, h100), "splits must be 1 to 8");
  bad = both[1];
  bad.stages = 4;
  KF_EXPECT_INVALID(kf::check_linear_plan(bad, p, h100), "no such kernel");
  const kf::Status unaligned = kf::check_linear_plan(both[1], u, h100);
  EXPECT_EQ(unaligned.code(), kf::StatusCode::kNotSupported) << unaligned.message();
  const kf::Status ampere = kf::check_linear_plan(both[1], p, a100);
  EXPECT_EQ(ampere.code(), kf::StatusCode::kNotSupported) << ampere.message();
}

TEST(LinearPlan, Gemv) {
  kf::DeviceInfo h100, a100;
  h100.sm_count = 132, h100.capability = 90;
  a100.sm_count = 108, a100.capability = 80;
  kf::LinearParams p;
  p.M = 1, p.N = 4096, p.K = 4096, p.vec16 = true, p.tma = true, p.gemv = true;
  // Only with the switch on; then on any sm_80+ GPU, with or without a 90a image, for one row.
  EXPECT_NE(kf::plan_linear(p, h100, true).kernel, kf::LinearKernel::kGemv);
  kf::LinearParams m4 = p;
  m4.M = 4;  // a candidate, not the plan
  EXPECT_NE(kf::plan_linear(m4, h100, true, true).kernel, kf::LinearKernel::kGemv);
  EXPECT_EQ(kf::linear_candidate_plans(m4, h100, true).back().kernel, kf::LinearKernel::kGemv);
  for (const kf::DeviceInfo& dev : {h100, a100}) {
    const kf::LinearPlan g = kf::plan_linear(p, dev, dev.capability == 90, true);
    EXPECT_EQ(g.kernel, kf::LinearKernel::kGemv);
    EXPECT_EQ(kf::to_string(g), "linear_gemv rows=4 k_round=2048 warps=4");
    EXPECT_EQ(g.splits, 1);
    EXPECT_EQ(kf::linear_workspace_bytes(g, p), 0u);
    EXPECT_TRUE(kf::check_linear_plan(g, p, dev).ok());
  }
  const kf::LinearPlan g = kf::plan_linear(p, h100, true, true);
  // The last candidate when it can run, none otherwise; the switch does not decide the candidates.
  EXPECT_EQ(kf::linear_candidate_plans(p, h100, true).back().kernel, kf::LinearKernel::kGemv);
  kf::LinearParams u = p;
  u.gemv = false;  // M > 4, K % 8 != 0 or unaligned: validate_linear clears it
  EXPECT_NE(kf::plan_linear(u, h100, true, true).kernel, kf::LinearKernel::kGemv);
  for (const kf::LinearPlan& c : kf::linear_candidate_plans(u, h100, true))
    EXPECT_NE(c.kernel, kf::LinearKernel::kGemv);
  const kf::Status refused = kf::check_linear_plan(g, u, h100);
  EXPECT_EQ(refused.code(), kf::StatusCode::kNotSupported) << refused.message();
  kf::LinearPlan bad = g;
  bad.splits = 2;
  KF_EXPECT_INVALID(kf::check_linear_plan(bad, p, h100), "no such kernel");
  bad = g;
  bad.block_n = 8;
  KF_EXPECT_INVALID(kf::check_linear_plan(bad, p, h100), "no such kernel");
}

kf::Status validate(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y) {
  kf::LinearTensors t;
  t.x = &x, t.w = &w, t.bias = bias, t.y = &y;
  kf::LinearParams p;
  DType d;
  return kf::validate_linear("linear", true, t, &p, &d);
}

kf::Status params(const TensorView& x, const TensorView& w, const TensorView& y, kf::LinearParams* p) {
  kf::LinearTensors t;
  t.x = &x, t.w = &w, t.y = &y;
  DType d;
  return kf::validate_linear("linear", true, t, p, &d);
}

TEST(LinearValidation, AcceptsAndRejects) {
  const TensorView x = cuda_view(BF16, {4, 64}, 0, uintptr_t{1} << 40),
                   w = cuda_view(BF16, {32, 64}, 0, uintptr_t{2} << 40),
                   y = cuda_view(BF16, {4, 32}, 0, uintptr_t{3} << 40),
                   b = cuda_view(BF16, {32}, 0, uintptr_t{4} << 40);
  EXPECT_TRUE(validate(x, w, &b, y).ok());
  kf::LinearParams prm;
  EXPECT_TRUE(params(x, w, y, &prm).ok());
  EXPECT_TRUE(prm.tma && prm.vec16 && prm.gemv);
  EXPECT_TRUE(params(cuda_view(BF16, {4, 64}, 0, (uintptr_t{1} << 40) + 2), w, y, &prm).ok());
  EXPECT_FALSE(prm.tma);  // x base not 16-byte aligned
  EXPECT_FALSE(prm.gemv);
  EXPECT_TRUE(params(cuda_view(BF16, {5, 64}, 0, uintptr_t{1} << 40), w, cuda_view(BF16, {5, 32}), &prm).ok());
  EXPECT_FALSE(prm.gemv);  // M = 5 > kLinearGemvMaxRows
  EXPECT_TRUE(prm.tma);
  EXPECT_TRUE(
      params(cuda_view(BF16, {4, 4}, 0, uintptr_t{1} << 40), cuda_view(BF16, {32, 4}, 0, uintptr_t{2} << 40), y, &prm)
          .ok());
  EXPECT_FALSE(prm.tma);  // K * 2 = 8 bytes, below TMA's 16
  KF_EXPECT_INVALID(validate(cuda_view(BF16, {4, 2, 64}), w, nullptr, y), "x must have 2 dimensions");
  KF_EXPECT_INVALID(validate(x, cuda_view(BF16, {32, 63}, 0, uintptr_t{2} << 40), nullptr, y),
                    "w must have x's K = 64");
  KF_EXPECT_INVALID(validate(x, cuda_view(F16, {32, 64}, 0, uintptr_t{2} << 40), nullptr, y), "w must have x's dtype");
  KF_EXPECT_INVALID(validate(x, w, nullptr, cuda_view(BF16, {4, 31}, 0, uintptr_t{3} << 40)),
                    "y must have shape [4, 32]");
  KF_EXPECT_INVALID(validate(x, w, &y, y), "bias must have 1 dimension");
  KF_EXPECT_INVALID(validate(cuda_view(DType::kFloat32, {4, 64}), w, nullptr, y), "x must be float16 or bfloat16");
  const kf::Status big =
      validate(cuda_view(BF16, {17, 64}), w, nullptr, cuda_view(BF16, {17, 32}, 0, uintptr_t{3} << 40));
  EXPECT_EQ(big.code(), kf::StatusCode::kNotSupported) << big.message();
}

TEST(LinearReference, SmallProduct) {
  HostTensor x(DType::kFloat64, {2, 3}), w(DType::kFloat64, {2, 3}), b(DType::kFloat64, {2}),
      y(DType::kFloat64, {2, 2});
  const double xs[] = {1, 2, 3, -1, 0, 2}, ws[] = {1, 0, -1, 2, 1, 1};
  for (int i = 0; i < 6; ++i) x.set(i, xs[i]), w.set(i, ws[i]);
  b.set(0, 0.5), b.set(1, -1);
  const TensorView xv = x.view(), wv = w.view(), bv = b.view(), yv = y.view();
  kf::LinearTensors t;
  t.x = &xv, t.w = &wv, t.bias = &bv, t.y = &yv;
  KF_ASSERT_OK(kf::ref::linear(t));
  EXPECT_EQ(y.get(0), -2 + 0.5);  // 1 - 3
  EXPECT_EQ(y.get(1), 7 - 1);     // 2 + 2 + 3
  EXPECT_EQ(y.get(2), -3 + 0.5);  // -1 - 2
  EXPECT_EQ(y.get(3), 0 - 1);     // -2 + 2
}

}  // namespace
