// The CUDA dropout kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case runs dropout (with and without the mask), dropout_add and the backward (from the
// forward's rng_state) on fresh random inputs with every output poisoned with NaN (0xFF bytes)
// first, and checks: the mask is bit-identical to the reference's, every value is within the
// tolerance of the reference (NaN never passes), y is exactly 0 where the mask is 0, rng_state holds
// the (seed, offset) used, inputs come back unchanged and nothing outside the outputs is written.
// Sizes: 1, 7, prime, odd, a multiple of the vector, a partial last vector, a large one, empty; p in
// {0, 0.1, 0.5, 0.9, 1}; aligned and unaligned (base + 1 element) pointers. DropGpuAllPlans runs
// every candidate plan (both kernels, every unroll, one-pass and grid-stride grids) and requires
// bit-identical results: the mask never depends on the launch. DropGpuCaptured drives the forward
// from device pointers (CUDA-graph capture) and requires the mask of the resolved values.
#include <cuda_runtime_api.h>

#include <string>
#include <tuple>
#include <vector>

#include "dropout/dropout_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::PhiloxState;

// A raw device buffer of bytes (the mask, rng_state), poisoned with 0xFF.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t n) : n_(n) {
    if (cudaMalloc(&p_, n_ + 16) != cudaSuccess) {
      (void)cudaGetLastError();
      p_ = nullptr;
    }
    poison();
  }
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void poison() {
    cudaMemset(p_, 0xFF, n_ + 16);
    cudaDeviceSynchronize();
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(n_ + 16);
    cudaMemcpy(h.data(), p_, n_ + 16, cudaMemcpyDeviceToHost);
    return h;
  }
  void upload(const void* src, size_t n) {
    cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  TensorView state_view() const { return kf::make_view(p_, DType::kInt64, {2}); }

 private:
  size_t n_;
  void* p_ = nullptr;
};

const std::vector<int64_t> kShapes[] = {{1},       {7},       {8},        {12},    {4099},     {1, 8191},
                                        {7, 1021}, {3, 4096}, {257, 520}, {0, 64}, {1, 65537}, {1024, 4097}};
const double kProbs[] = {0.0, 0.1, 0.5, 0.9, 1.0};

using Case = std::tuple<DType, std::vector<int64_t>, bool>;  // dtype, shape, unaligned

class DropGpu : public ::testing::TestWithParam<Case> {
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
  }
  DType dtype() const { return std::get<0>(GetParam()); }
  const std::vector<int64_t>& shape() const { return std::get<1>(GetParam()); }
  // The k-th tensor of a call: unaligned cases put x one element off and the rest aligned, so that
  // no pair of pointers shares a 16-byte alignment (the scalar kernel).
  Layout layout(int k) const { return {0, std::get<2>(GetParam()) && k == 0 ? 1 : 0}; }
  int64_t numel() const { return numel_of(shape()); }
  uint64_t seed(const std::string& what) const {
    return hash_str(what + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
};

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

::testing::AssertionResult masks_equal(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << "mask differs from the reference at element " << i << ": got "
                                           << int(got[i]) << " want " << int(want[i]);
  for (size_t i = size_t(n); i < got.size(); ++i)
    if (got[i] != 0xFF) return ::testing::AssertionFailure() << "mask byte " << i << " past the end was written";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult zero_where_dropped(const HostTensor& y, const std::vector<uint8_t>& mask) {
  for (int64_t i = 0; i < y.numel(); ++i)
    if (!mask[i] && y.get(i) != 0.0)
      return ::testing::AssertionFailure() << "y[" << i << "] = " << y.get(i) << " where the element is dropped";
  return ::testing::AssertionSuccess();
}

TEST_P(DropGpu, ForwardBackward) {
  const DType t = dtype();
  const int64_t n = numel();
  for (double p : kProbs) {
    SCOPED_TRACE("p=" + std::to_string(p));
    Rng rng(seed("fb" + std::to_string(p)));
    HostTensor x = random_tensor(t, shape(), rng), res = random_tensor(t, shape(), rng),
               dy = random_tensor(t, shape(), rng);
    PhiloxState st;
    st.seed = rng.next();
    st.offset = 4 * (rng.next() % (uint64_t(1) << 40));

    // reference: dropout with mask, dropout_add, backward
    HostTensor want_y(t, shape()), want_add(t, shape()), want_dx(t, shape());
    std::vector<uint8_t> want_mask(size_t(n) + 1, 0xFF);
    int64_t hstate[2] = {-1, -1};
    TensorView hsv = kf::make_view(hstate, DType::kInt64, {2}, Device{DeviceType::kCPU, 0});
    KF_ASSERT_OK(ref::dropout(x.view(), p, st, want_y.view(), &hsv, want_mask.data()));
    KF_ASSERT_OK(ref::dropout_add(x.view(), res.view(), p, st, want_add.view(), nullptr));
    KF_ASSERT_OK(ref::dropout_backward(dy.view(), hsv, p, want_dx.view()));

    DeviceTensor dx_in = to_device(x, layout(0)), dres = to_device(res, layout(1)), ddy = to_device(dy, layout(0));
    DeviceTensor y(t, shape(), layout(2)), yadd(t, shape(), layout(2)), dx(t, shape(), layout(2));
    DeviceBytes mask{size_t(n)}, state(16), state_add(16);
    const TensorView sv = state.state_view(), sav = state_add.state_view();
    ASSERT_TRUE(finish(kf::dropout(dx_in.view(), p, st, y.view(), &sv, mask.data(), stream_)));
    ASSERT_TRUE(finish(kf::dropout_add(dx_in.view(), dres.view(), p, st, yadd.view(), &sav, stream_)));
    ASSERT_TRUE(finish(kf::dropout_backward(ddy.view(), sv, p, dx.view(), stream_)));

    const std::vector<uint8_t> got_mask = mask.download();
    EXPECT_TRUE(masks_equal(got_mask, want_mask, n));
    const HostTensor gy = y.download(), gadd = yadd.download(), gdx = dx.download();
    EXPECT_TRUE(all_close("y", gy, want_y, tolerance(t)));
    EXPECT_TRUE(all_close("dropout_add y", gadd, want_add, tolerance(t)));
    EXPECT_TRUE(all_close("dx", gdx, want_dx, tolerance(t)));
    EXPECT_TRUE(zero_where_dropped(gy, got_mask));
    EXPECT_TRUE(zero_where_dropped(gdx, got_mask));
    if (p == 0.0) {
      EXPECT_TRUE(bit_equal("p = 0 gives y = x", gy, x));
    }
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(yadd.check_untouched("dropout_add y"));
    EXPECT_TRUE(dx.check_untouched("dx"));
    EXPECT_TRUE(bit_equal("x is not written", dx_in.download(), x));
    EXPECT_TRUE(bit_equal("residual is not written", dres.download(), res));
    if (n > 0) {
      for (const DeviceBytes* b : {&state, &state_add}) {
        const std::vector<uint8_t> raw = b->download();
        int64_t got[2];
        std::memcpy(got, raw.data(), 16);
        EXPECT_EQ(uint64_t(got[0]), st.seed);
        EXPECT_EQ(uint64_t(got[1]), st.offset);
      }
    } else {  // nothing launched: rng_state untouched
      EXPECT_EQ(state.download()[0], 0xFF);
    }
  }
}

// In place (y = x) gives the out-of-place result.
TEST_P(DropGpu, InPlace) {
  if (numel() == 0) GTEST_SKIP() << "empty";
  const DType t = dtype();
  Rng rng(seed("inplace"));
  HostTensor x = random_tensor(t, shape(), rng), want(t, shape());
  PhiloxState st;
  st.seed = 5;
  st.offset = 20;
  KF_ASSERT_OK(ref::dropout(x.view(), 0.3, st, want.view(), nullptr, nullptr));
  DeviceTensor d = to_device(x, layout(0));
  ASSERT_TRUE(finish(kf::dropout(d.view(), 0.3, st, d.view(), nullptr, nullptr, stream_)));
  EXPECT_TRUE(all_close("y", d.download(), want, tolerance(t)));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const DType t = std::get<0>(info.param);
  std::string s = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
  for (int64_t d : std::get<1>(info.param)) s += "_" + std::to_string(d);
  return s + (std::get<2>(info.param) ? "_unaligned" : "_aligned");
}

INSTANTIATE_TEST_SUITE_P(All, DropGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes), ::testing::Bool()),
                         case_name);

// ---- every candidate plan gives the same bits ------------------------------------------------
class DropGpuAllPlans : public DropGpu {};

TEST_P(DropGpuAllPlans, EveryCandidate) {
  const DType t = dtype();
  const int64_t n = numel();
  Rng rng(seed("plans"));
  HostTensor x = random_tensor(t, shape(), rng), res = random_tensor(t, shape(), rng), want(t, shape()),
             want_add(t, shape());
  PhiloxState st;
  st.seed = rng.next();
  st.offset = 4 * (rng.next() & 0xffff);
  std::vector<uint8_t> want_mask(size_t(n) + 1, 0xFF);
  KF_ASSERT_OK(ref::dropout(x.view(), 0.5, st, want.view(), nullptr, want_mask.data()));
  KF_ASSERT_OK(ref::dropout_add(x.view(), res.view(), 0.5, st, want_add.view(), nullptr));
  DeviceTensor dxin = to_device(x, layout(0)), dres = to_device(res, layout(1)), y(t, shape(), layout(2));
  DeviceBytes mask{size_t(n)};
  const TensorView xv = dxin.view(), rv = dres.view(), yv = y.view();
  for (bool add : {false, true}) {
    kf::DropCall c;
    c.name = add ? "dropout_add" : "dropout";
    c.op = add ? kf::DropOp::kDropoutAdd : kf::DropOp::kDropout;
    c.p = 0.5;
    c.rng = st;
    c.x = &xv;
    c.residual = add ? &rv : nullptr;
    c.y = &yv;
    c.mask = add ? nullptr : mask.data();
    std::vector<kf::DropPlan> plans;
    KF_ASSERT_OK(kf::drop_candidate_plans(c, &plans));
    EXPECT_EQ(plans.empty(), n == 0);
    HostTensor first;
    for (const kf::DropPlan& plan : plans) {
      SCOPED_TRACE(kf::to_string(plan));
      y.poison();
      mask.poison();
      ASSERT_TRUE(finish(kf::launch_with_plan(plan, c, stream_)));
      const HostTensor got = y.download();
      EXPECT_TRUE(all_close("y", got, add ? want_add : want, tolerance(t)));
      EXPECT_TRUE(y.check_untouched("y"));
      if (!add) {
        EXPECT_TRUE(masks_equal(mask.download(), want_mask, n));
      }
      if (first.shape.empty())
        first = got;
      else
        EXPECT_TRUE(bit_equal("every plan gives the same bits", got, first));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, DropGpuAllPlans,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes), ::testing::Bool()),
                         case_name);

// ---- device-resident (seed, offset): the CUDA-graph capture form -----------------------------
TEST(DropGpuCaptured, ResolvesOnDevice) {
  KF_NEED_GPU();
  const DType t = DType::kFloat32;
  const int64_t n = 10007;
  Rng rng(11);
  HostTensor x = random_tensor(t, {n}, rng), want(t, {n});
  const int64_t cells[2] = {int64_t(0x1234abcd5678ull), 4 * 1000};
  DeviceBytes gen(16), state(16), mask{size_t(n)};
  gen.upload(cells, 16);
  PhiloxState cap;
  cap.captured = true;
  cap.seed_ptr = reinterpret_cast<const int64_t*>(gen.data());
  cap.offset_ptr = reinterpret_cast<const int64_t*>(gen.data()) + 1;
  cap.offset_intragraph = 8;
  PhiloxState val;
  val.seed = uint64_t(cells[0]);
  val.offset = uint64_t(cells[1]) + 8;
  std::vector<uint8_t> want_mask(size_t(n) + 1, 0xFF);
  KF_ASSERT_OK(ref::dropout(x.view(), 0.25, val, want.view(), nullptr, want_mask.data()));
  DeviceTensor dxin = to_device(x, {}), y(t, {n}), dx(t, {n});
  const TensorView sv = state.state_view();
  KF_ASSERT_OK(kf::dropout(dxin.view(), 0.25, cap, y.view(), &sv, mask.data(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(masks_equal(mask.download(), want_mask, n));
  EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
  int64_t got[2];
  std::memcpy(got, state.download().data(), 16);
  EXPECT_EQ(got[0], cells[0]);
  EXPECT_EQ(uint64_t(got[1]), val.offset);
  // The backward from that rng_state reproduces the mask: dx = 1 * f is 0 exactly where dropped.
  HostTensor ones(t, {n});
  for (int64_t i = 0; i < n; ++i) ones.set(i, 1.0);
  DeviceTensor dones = to_device(ones, {});
  KF_ASSERT_OK(kf::dropout_backward(dones.view(), sv, 0.25, dx.view(), nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  const HostTensor g = dx.download();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g.get(i), want_mask[i] ? double(float(1.0 / 0.75)) : 0.0) << i;
}

}  // namespace
