// The CUDA grouped_mm kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case runs the three products (rows with w row-major, rows with w column-major, the weight
// gradient) through the public entry and through every candidate plan (wgmma and mma on sm_90), on
// fresh random inputs with every output poisoned with NaN first; NaN never passes, the bytes outside
// each output view must stay untouched and the inputs unchanged. Groupings: skewed sizes with empty
// groups, all rows in one group, rows past the last group (written as 0), decreasing and out-of-range
// offsets (the clamp rule). Layouts: contiguous, row-padded by 8 (TMA-aligned strides), odd row
// strides and bases one element off (the mma kernel). Tests skip without a GPU (fail with
// KF_REQUIRE_GPU=1).
#include <string>
#include <tuple>
#include <vector>

#include "grouped_mm/grouped_mm_problem.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

struct Shape {
  int groups;
  int64_t t, n, k;
  const char* grouping;  // skew, one, tail, unsorted, clamp
};
const Shape kShapes[] = {
    {1, 1, 8, 8, "one"},       {1, 7, 16, 24, "one"},      {3, 100, 64, 64, "skew"},   {4, 300, 136, 72, "skew"},
    {5, 257, 127, 33, "skew"}, {8, 512, 256, 256, "skew"}, {6, 333, 264, 136, "tail"}, {4, 200, 72, 40, "unsorted"},
    {4, 200, 40, 72, "clamp"}, {64, 700, 128, 64, "skew"}, {2, 0, 16, 16, "skew"},     {3, 50, 0, 8, "skew"},
    {3, 50, 8, 0, "skew"},     {2, 1, 1, 1, "one"},
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "E" << s.groups << " T" << s.t << " N" << s.n << " K" << s.k << " " << s.grouping;
}

// Group ends (int32, as offsets) for a grouping: skewed sizes (group e's share ~ (e % 4) + random,
// every third group empty), everything in the last group, 80 % of the rows covered (tail), a
// decreasing pair (unsorted), negative and > T values (clamp).
std::vector<double> make_offsets(const Shape& s, Rng& rng) {
  std::vector<double> ends(size_t(s.groups));
  const std::string g = s.grouping;
  if (g == "one") {
    for (auto& e : ends) e = double(s.t);
    return ends;
  }
  std::vector<double> share(size_t(s.groups));
  double total = 0;
  for (int e = 0; e < s.groups; ++e) total += share[size_t(e)] = e % 3 == 1 ? 0.0 : (e % 4) + rng.uniform(0.5, 2.0);
  const double covered = g == "tail" ? 0.8 * double(s.t) : double(s.t);
  double acc = 0;
  for (int e = 0; e < s.groups; ++e) ends[size_t(e)] = std::floor((acc += share[size_t(e)]) / total * covered);
  if (g != "tail") ends.back() = double(s.t);
  if (g == "unsorted" && s.groups >= 3) std::swap(ends[1], ends[2]);
  if (g == "clamp") ends[0] = -5, ends[size_t(s.groups) - 2] = double(s.t) + 100, ends.back() = double(s.t) + 7;
  return ends;
}

Layout layout_of(LayoutKind l) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {8, 0};
    case LayoutKind::kOddStride:
      return {3, 0};
    case LayoutKind::kUnaligned:
      return {0, 1};
    case LayoutKind::kMixed:
      return {8, 1};
  }
  return {};
}

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// A transposed view of the last two dimensions.
TensorView transposed(TensorView v) {
  std::swap(v.shape[1], v.shape[2]);
  std::swap(v.strides[1], v.strides[2]);
  return v;
}

struct Workspace {
  void* ptr = nullptr;
  ~Workspace() {
    if (ptr) cudaFree(ptr);
  }
};

using Case = std::tuple<DType, Shape, LayoutKind>;

class GmmGpu : public ::testing::TestWithParam<Case> {
 protected:
  cudaStream_t stream_ = nullptr;
  void SetUp() override {
    KF_NEED_GPU();
    if (dtype() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  const Shape& shape() const { return std::get<1>(GetParam()); }
  Layout layout() const { return layout_of(std::get<2>(GetParam())); }
  uint64_t seed(const std::string& what) const {
    return hash_str(what + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  // Runs `call` through the public entry (plan == nullptr) or `plan`, with its workspace.
  ::testing::AssertionResult run(const kf::GmmCall& c, const kf::GroupedMmPlan* plan) {
    size_t bytes = 0;
    kf::Status st;
    auto call = [&](void* ws) {
      if (plan != nullptr) return kf::gmm_launch_with_plan(*plan, c, ws, &bytes, stream_);
      return c.wgrad ? kf::grouped_mm_wgrad(*c.a, *c.b, *c.offsets, *c.out, ws, &bytes, stream_)
                     : kf::grouped_mm(*c.a, *c.b, *c.offsets, *c.out, ws, &bytes, stream_);
    };
    if (!(st = call(nullptr)).ok()) return ::testing::AssertionFailure() << "size query: " << st.message();
    Workspace ws;
    if (cudaMalloc(&ws.ptr, bytes < 256 ? 256 : bytes) != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaMalloc " << bytes;
    if (!(st = call(ws.ptr)).ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }

  // One product (op) through the entry and every candidate plan.
  void check(kf::GroupedMmOp op) {
    const DType t = dtype();
    const Shape& s = shape();
    const bool wgrad = op == kf::GroupedMmOp::kWgrad, wcol = op == kf::GroupedMmOp::kRowsWCol;
    SCOPED_TRACE(wgrad ? "wgrad" : wcol ? "rows, w column-major" : "rows, w row-major");
    Rng rng(seed(std::to_string(int(op))));
    const HostTensor off = [&] {
      const std::vector<double> v = make_offsets(s, rng);
      HostTensor h(DType::kInt32, {int64_t(s.groups)});
      for (int e = 0; e < s.groups; ++e) h.set(e, v[size_t(e)]);
      return h;
    }();
    // rows: a = x [T, K], b = w [E, N, K] (or wt [E, K, N] viewed transposed); wgrad: a = dy [T, N], b = x [T, K]
    const HostTensor a = random_tensor(t, {s.t, wgrad ? s.n : s.k}, rng);
    const HostTensor b =
        wgrad ? random_tensor(t, {s.t, s.k}, rng)
              : random_tensor(
                    t, wcol ? std::vector<int64_t>{s.groups, s.k, s.n} : std::vector<int64_t>{s.groups, s.n, s.k}, rng);
    const std::vector<int64_t> out_shape =
        wgrad ? std::vector<int64_t>{s.groups, s.n, s.k} : std::vector<int64_t>{s.t, s.n};
    HostTensor want(t, out_shape);
    const TensorView bh = wcol ? transposed(b.view()) : b.view();
    KF_ASSERT_OK(wgrad ? ref::grouped_mm_wgrad(a.view(), b.view(), off.view(), want.view())
                       : ref::grouped_mm(a.view(), bh, off.view(), want.view()));
    DeviceTensor a_dev = to_device(a, layout()), b_dev = to_device(b, layout()), off_dev = to_device(off, {});
    const TensorView av = a_dev.view(), bv = wcol ? transposed(b_dev.view()) : b_dev.view(), ov = off_dev.view();
    kf::GmmCall c;
    c.name = wgrad ? "grouped_mm_wgrad" : "grouped_mm";
    c.wgrad = wgrad;
    c.a = &av, c.b = &bv, c.offsets = &ov;
    std::vector<kf::GroupedMmPlan> plans;
    {
      DeviceTensor out(t, out_shape, layout());
      const TensorView outv = out.view();
      c.out = &outv;
      KF_ASSERT_OK(kf::gmm_candidate_plans(c, &plans));
    }
    const Tol tol = reduction_tolerance(t, wgrad ? std::max<int64_t>(s.t, 1) : std::max<int64_t>(s.k, 1));
    for (int i = -1; i < int(plans.size()); ++i) {
      SCOPED_TRACE(i < 0 ? std::string("public entry") : kf::to_string(plans[size_t(i)]));
      DeviceTensor out(t, out_shape, layout());
      const TensorView outv = out.view();
      c.out = &outv;
      ASSERT_TRUE(run(c, i < 0 ? nullptr : &plans[size_t(i)]));
      EXPECT_TRUE(all_close(wgrad ? "dw" : "out", out.download(), want, tol));
      EXPECT_TRUE(out.check_untouched("out"));
    }
    EXPECT_TRUE(bit_equal("a is not written", a_dev.download(), a));
    EXPECT_TRUE(bit_equal("b is not written", b_dev.download(), b));
  }
};

TEST_P(GmmGpu, RowsWRowMajor) { check(kf::GroupedMmOp::kRowsWRow); }
TEST_P(GmmGpu, RowsWColumnMajor) { check(kf::GroupedMmOp::kRowsWCol); }
TEST_P(GmmGpu, WeightGradient) { check(kf::GroupedMmOp::kWgrad); }

INSTANTIATE_TEST_SUITE_P(All, GmmGpu,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned)));

// The production plan of an aligned sm_90 call is the wgmma kernel when the build has it.
TEST(GmmGpuPlan, AlignedCallsTakeTheWgmmaKernel) {
  KF_NEED_GPU();
  if (gpu_capability() != 90 || !kf::grouped_mm_has_wgmma()) GTEST_SKIP() << "needs sm_90 and a build with CUTLASS";
  DeviceTensor x(DType::kBFloat16, {256, 64}), w(DType::kBFloat16, {4, 128, 64}), out(DType::kBFloat16, {256, 128});
  DeviceTensor off(DType::kInt32, {4});
  kf::GroupedMmPlan plan;
  KF_ASSERT_OK(kf::grouped_mm_plan(x.view(), w.view(), off.view(), out.view(), &plan));
  EXPECT_EQ(plan.kernel, kf::GroupedMmKernel::kWgmma) << kf::to_string(plan);
  EXPECT_GT(plan.workspace, 0u);
}

}  // namespace
