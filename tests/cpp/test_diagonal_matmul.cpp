// The CUDA diagonal_matmul kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case: forward, and backward with (da, db), da only and db only, on fresh random inputs
// (never zeros) with every output buffer poisoned with NaN (0xFF bytes) before the run; every element
// is compared with the one tolerance table per dtype (da, a sum over N·B products, with the reduction
// tolerance), NaN never passes, inputs must come back unchanged, and bytes outside each output view
// (row padding, base offset, a guard after the last row) must stay untouched. Shapes are chosen per
// code path: one element, rows of 1 and 7, odd and prime widths (scalar head and tail), the common
// widths, a long row (the team loops), many rows, batched per-row a, a broadcast over 1, 3, 8 and 0
// batches, and empty tensors. Each runs contiguous, row-padded (a strided too), odd-row-stride (every
// row at a different alignment: the scalar head), unaligned (every tensor one element off) and mixed
// (b aligned, the rest one element off: narrower vectors) layouts. DmGpuAllPlans runs every candidate
// plan; DmGpuLarge indexes past 2^31 elements. Tests skip without a GPU (fail with KF_REQUIRE_GPU=1).
#include <string>
#include <tuple>
#include <vector>

#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

struct Shape {
  std::vector<int64_t> b;  // [..., M, N]
  bool bcast;              // a is [M] (broadcast over the batch dimensions), else b.shape[:-1]
};
const Shape kShapes[] = {
    {{1, 1}, false},     {{1, 7}, false},     {{7, 1}, false},       {{7, 127}, false},    {{3, 4096}, false},
    {{19, 4097}, false}, {{257, 520}, false}, {{1, 65537}, false},   {{4, 7, 130}, false}, {{3, 5, 1023}, true},
    {{8, 64, 64}, true}, {{1, 3, 33}, true},  {{2, 2, 9, 24}, true}, {{0, 4096}, false},   {{5, 0}, false},
    {{0, 5, 8}, true},   {{2, 0, 8}, true},   {{4, 6, 0}, true},
};

// Layout of the k-th tensor of a call (k = 0: b).
Layout layout_of(LayoutKind l, int k) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};
    case LayoutKind::kOddStride:
      return {3, 0};
    case LayoutKind::kUnaligned:
      return {0, 1};
    case LayoutKind::kMixed:
      return {0, k == 0 ? 0 : 1};
  }
  return {};
}

using Case = std::tuple<DType, Shape, LayoutKind>;
void PrintTo(const Shape& s, std::ostream* os) { *os << shape_str(s.b) << (s.bcast ? " a[M]" : ""); }

std::vector<int64_t> a_shape(const Shape& s) {
  if (s.bcast) return {s.b[s.b.size() - 2]};
  return std::vector<int64_t>(s.b.begin(), s.b.end() - 1);
}

// a (or da) on the device: element i at i * stride, stride = 1 (+ 64 when row-padded: a strided a).
struct ScaleTensor {
  DeviceTensor mem;
  std::vector<int64_t> shape;
  ScaleTensor(DType t, std::vector<int64_t> s, LayoutKind l, int k)
      : mem(t, {numel_of(s), 1}, layout_of(l, k)), shape(std::move(s)) {}
  TensorView view() const {
    const TensorView m = mem.view();
    TensorView v = m;
    v.ndim = int(shape.size());
    int64_t stride = m.strides[0];
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = shape[d];
      v.strides[d] = stride;
      stride *= shape[d];
    }
    return v;
  }
  void upload(const HostTensor& h) {
    HostTensor col(h.dtype, {h.numel(), 1});
    col.bytes = h.bytes;
    mem.upload(col);
  }
  HostTensor download() const {
    HostTensor col = mem.download();
    HostTensor h(col.dtype, shape);
    h.bytes = col.bytes;
    return h;
  }
};

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// The backward's workspace: asked for, then allocated (16 bytes at least: never a null pointer).
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~Workspace() {
    if (ptr) cudaFree(ptr);
  }
  bool alloc(size_t n) {
    bytes = n;
    return cudaMalloc(&ptr, n < 16 ? 16 : n) == cudaSuccess;
  }
};

enum class Grads { kBoth, kDaOnly, kDbOnly };
const char* grads_name(Grads g) { return g == Grads::kBoth ? "da+db" : g == Grads::kDaOnly ? "da" : "db"; }

class DmGpu : public ::testing::TestWithParam<Case> {
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
  LayoutKind layout() const { return std::get<2>(GetParam()); }
  int64_t n() const { return shape().b.back(); }
  int64_t batches() const {  // terms of one da element = n() * batches()
    if (!shape().bcast) return 1;
    int64_t b = 1;
    for (size_t d = 0; d + 2 < shape().b.size(); ++d) b *= shape().b[d];
    return b;
  }
  uint64_t seed(const std::string& what) const {
    return hash_str(what + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }

  // Forward through `plan` (nullptr: the public entry) against the reference.
  void check_forward(const kf::DmPlan* plan) {
    const DType t = dtype();
    Rng rng(seed("fwd"));
    const HostTensor a = random_weight(t, a_shape(shape()), rng), b = random_tensor(t, shape().b, rng);
    HostTensor want(t, shape().b);
    KF_ASSERT_OK(ref::diagonal_matmul(a.view(), b.view(), want.view()));
    ScaleTensor a_dev(t, a_shape(shape()), layout(), 1);
    a_dev.upload(a);
    DeviceTensor b_dev = to_device(b, layout_of(layout(), 0));
    DeviceTensor y(t, shape().b, layout_of(layout(), 2));
    const TensorView av = a_dev.view(), bv = b_dev.view(), yv = y.view();
    if (plan == nullptr) {
      ASSERT_TRUE(finish(kf::diagonal_matmul(av, bv, yv, stream_)));
    } else {
      kf::DmCall c;
      c.name = "diagonal_matmul";
      c.a = &av, c.b = &bv, c.y = &yv;
      ASSERT_TRUE(finish(kf::dm_launch_with_plan(*plan, c, nullptr, nullptr, stream_)));
    }
    EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(bit_equal("b is not written", b_dev.download(), b));
    EXPECT_TRUE(bit_equal("a is not written", a_dev.download(), a));
  }

  // Backward with the gradients `g` through `plan` (nullptr: the public entry); returns da and db.
  void check_backward(Grads g, const kf::DmPlan* plan, HostTensor* da_out = nullptr, HostTensor* db_out = nullptr) {
    const DType t = dtype();
    SCOPED_TRACE(grads_name(g));
    Rng rng(seed("bwd"));
    const HostTensor a = random_weight(t, a_shape(shape()), rng), b = random_tensor(t, shape().b, rng);
    const HostTensor dy = random_tensor(t, shape().b, rng);
    const bool want_da = g != Grads::kDbOnly, want_db = g != Grads::kDaOnly;
    HostTensor da_ref(t, a_shape(shape())), db_ref(t, shape().b);
    const TensorView da_rv = da_ref.view(), db_rv = db_ref.view();
    KF_ASSERT_OK(ref::diagonal_matmul_backward(dy.view(), a.view(), b.view(), want_da ? &da_rv : nullptr,
                                               want_db ? &db_rv : nullptr));
    ScaleTensor a_dev(t, a_shape(shape()), layout(), 1), da(t, a_shape(shape()), layout(), 3);
    a_dev.upload(a);
    DeviceTensor b_dev = to_device(b, layout_of(layout(), 0)), dy_dev = to_device(dy, layout_of(layout(), 2));
    DeviceTensor db(t, shape().b, layout_of(layout(), 4));
    const TensorView av = a_dev.view(), bv = b_dev.view(), dyv = dy_dev.view(), dav = da.view(), dbv = db.view();
    const TensorView* dap = want_da ? &dav : nullptr;
    const TensorView* dbp = want_db ? &dbv : nullptr;
    size_t bytes = 0;
    kf::DmCall c;
    c.name = "diagonal_matmul_backward";
    c.backward = true;
    c.dy = &dyv, c.a = &av, c.b = &bv, c.da = dap, c.db = dbp;
    KF_ASSERT_OK(plan ? kf::dm_launch_with_plan(*plan, c, nullptr, &bytes, stream_)
                      : kf::diagonal_matmul_backward(dyv, av, bv, dap, dbp, nullptr, &bytes, stream_));
    const bool needs_ws = shape().bcast && batches() != 1 && want_da && numel_of(a_shape(shape())) > 0;
    EXPECT_EQ(bytes, needs_ws ? size_t(batches() * numel_of(a_shape(shape()))) * 4 : size_t(0));
    Workspace ws;
    ASSERT_TRUE(ws.alloc(bytes));
    ASSERT_TRUE(finish(plan ? kf::dm_launch_with_plan(*plan, c, ws.ptr, &ws.bytes, stream_)
                            : kf::diagonal_matmul_backward(dyv, av, bv, dap, dbp, ws.ptr, &ws.bytes, stream_)));
    if (want_da) {
      const HostTensor got = da.download();
      EXPECT_TRUE(all_close("da", got, da_ref, reduction_tolerance(t, n() * batches())));
      if (da_out) *da_out = got;
    }
    if (want_db) {
      const HostTensor got = db.download();
      EXPECT_TRUE(all_close("db", got, db_ref, tolerance(t)));
      if (db_out) *db_out = got;
    }
    EXPECT_TRUE(da.mem.check_untouched("da"));  // also: nothing written when da is not wanted
    EXPECT_TRUE(db.check_untouched("db"));
    EXPECT_TRUE(bit_equal("dy is not written", dy_dev.download(), dy));
    EXPECT_TRUE(bit_equal("b is not written", b_dev.download(), b));
    EXPECT_TRUE(bit_equal("a is not written", a_dev.download(), a));
  }
};

TEST_P(DmGpu, Forward) { check_forward(nullptr); }

TEST_P(DmGpu, Backward) {
  for (Grads g : {Grads::kBoth, Grads::kDaOnly, Grads::kDbOnly}) check_backward(g, nullptr);
}

// The backward twice: bit-identical da and db (fixed summation order, no atomics).
TEST_P(DmGpu, Deterministic) {
  HostTensor da1, db1, da2, db2;
  check_backward(Grads::kBoth, nullptr, &da1, &db1);
  check_backward(Grads::kBoth, nullptr, &da2, &db2);
  EXPECT_TRUE(bit_equal("da", da1, da2));
  EXPECT_TRUE(bit_equal("db", db1, db2));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const DType t = std::get<0>(info.param);
  const Shape& s = std::get<1>(info.param);
  std::string name = t == DType::kFloat32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16";
  name += "_";
  for (size_t d = 0; d < s.b.size(); ++d) name += (d ? "x" : "") + std::to_string(s.b[d]);
  return name + (s.bcast ? "_bcast_" : "_") + layout_name(std::get<2>(info.param));
}

const auto kLayouts = ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded, LayoutKind::kOddStride,
                                        LayoutKind::kUnaligned, LayoutKind::kMixed);

INSTANTIATE_TEST_SUITE_P(All, DmGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes), kLayouts),
                         case_name);

// ---- every candidate plan --------------------------------------------------------------------
class DmGpuAllPlans : public DmGpu {
 protected:
  // The candidate plans of the call the public entry would make (forward, or a backward's grads).
  std::vector<kf::DmPlan> plans(bool backward, Grads g) {
    const DType t = dtype();
    ScaleTensor a(t, a_shape(shape()), layout(), 1), da(t, a_shape(shape()), layout(), 3);
    DeviceTensor b(t, shape().b, layout_of(layout(), 0)), y(t, shape().b, layout_of(layout(), 2));
    DeviceTensor db(t, shape().b, layout_of(layout(), 4));
    const TensorView av = a.view(), bv = b.view(), yv = y.view(), dav = da.view(), dbv = db.view();
    kf::DmCall c;
    c.name = backward ? "diagonal_matmul_backward" : "diagonal_matmul";
    c.backward = backward;
    c.a = &av, c.b = &bv;
    if (backward) {
      c.dy = &yv;  // the same layout as the test's dy
      c.da = g != Grads::kDbOnly ? &dav : nullptr;
      c.db = g != Grads::kDaOnly ? &dbv : nullptr;
    } else {
      c.y = &yv;
    }
    std::vector<kf::DmPlan> out;
    const Status s = kf::dm_candidate_plans(c, &out);
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
};

TEST_P(DmGpuAllPlans, EveryCandidate) {
  for (const kf::DmPlan& plan : plans(false, Grads::kBoth)) {
    SCOPED_TRACE(kf::to_string(plan));
    check_forward(&plan);
  }
  for (Grads g : {Grads::kBoth, Grads::kDaOnly, Grads::kDbOnly})
    for (const kf::DmPlan& plan : plans(true, g)) {
      SCOPED_TRACE(kf::to_string(plan));
      check_backward(g, &plan);
    }
}

INSTANTIATE_TEST_SUITE_P(All, DmGpuAllPlans,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(Shape{{7, 127}, false}, Shape{{19, 4097}, false},
                                                              Shape{{3, 5, 1023}, true}, Shape{{1, 65537}, false}),
                                            kLayouts),
                         case_name);

// ---- past 2^31 elements ------------------------------------------------------------------------
// b [524289, 4096] bfloat16 (2^31 + 4096 elements, 4.3 GB a tensor): constant b and dy bytes, a per
// row from the host; the rows around and past element 2^31 are checked (32-bit offsets would wrap
// into the first rows and leave these poisoned).
TEST(DmGpuLarge, SixtyFourBitOffsets) {
  KF_NEED_GPU();
  if (gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80+";
  const int64_t rows = (int64_t(1) << 31) / 4096 + 1, n = 4096;
  const size_t bytes = size_t(rows * n) * 2;
  size_t free_b = 0, total_b = 0;
  KF_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < 3 * bytes + (size_t(1) << 30)) GTEST_SKIP() << "needs " << 3 * bytes / (1 << 20) << " MiB free";
  const DType t = DType::kBFloat16;
  void *b = nullptr, *y = nullptr, *dy = nullptr, *a = nullptr, *da = nullptr;
  KF_CUDA_CHECK(cudaMalloc(&b, bytes));
  KF_CUDA_CHECK(cudaMalloc(&y, bytes));
  KF_CUDA_CHECK(cudaMalloc(&dy, bytes));
  KF_CUDA_CHECK(cudaMalloc(&a, size_t(rows) * 2));
  KF_CUDA_CHECK(cudaMalloc(&da, size_t(rows) * 2));
  KF_CUDA_CHECK(cudaMemset(b, 0x3F, bytes));   // bf16 0x3F3F = 0.74609375
  KF_CUDA_CHECK(cudaMemset(dy, 0x40, bytes));  // bf16 0x4040 = 3.0
  KF_CUDA_CHECK(cudaMemset(y, 0xFF, bytes));
  KF_CUDA_CHECK(cudaMemset(da, 0xFF, size_t(rows) * 2));
  Rng rng(7);
  HostTensor ah = random_weight(t, {rows}, rng);
  KF_CUDA_CHECK(cudaMemcpy(a, ah.bytes.data(), size_t(rows) * 2, cudaMemcpyHostToDevice));
  const TensorView av = kf::make_view(a, t, {rows}), bv = kf::make_view(b, t, {rows, n});
  const TensorView yv = kf::make_view(y, t, {rows, n}), dyv = kf::make_view(dy, t, {rows, n});
  const TensorView dav = kf::make_view(da, t, {rows});
  const double bval = 0.74609375, gval = 3.0;
  const int64_t check_rows[] = {0, 1, rows / 2, rows - 3, rows - 2, rows - 1};
  auto check_rows_of = [&](const char* what, void* out, double per_row_factor) {
    std::vector<uint16_t> row(static_cast<size_t>(n));
    for (int64_t r : check_rows) {
      ASSERT_EQ(cudaMemcpy(row.data(), static_cast<uint16_t*>(out) + r * n, size_t(n) * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      const double want = round_to(t, ah.get(r) * per_row_factor);
      for (int64_t c = 0; c < n; ++c)
        ASSERT_EQ(bf16_to_float(row[size_t(c)]), want) << what << " row " << r << " column " << c;
    }
  };
  KF_ASSERT_OK(kf::diagonal_matmul(av, bv, yv, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  check_rows_of("y", y, bval);
  // backward: db (into y's buffer) = a * dy, da = sum over the row of dy * b = n * gval * bval
  KF_CUDA_CHECK(cudaMemset(y, 0xFF, bytes));
  size_t ws = 0;
  KF_ASSERT_OK(kf::diagonal_matmul_backward(dyv, av, bv, &dav, &yv, nullptr, &ws, nullptr));
  ASSERT_EQ(ws, size_t(0));
  KF_ASSERT_OK(kf::diagonal_matmul_backward(dyv, av, bv, &dav, &yv, da, &ws, nullptr));
  KF_CUDA_CHECK(cudaDeviceSynchronize());
  check_rows_of("db", y, gval);
  std::vector<uint16_t> dah(static_cast<size_t>(rows));
  KF_CUDA_CHECK(cudaMemcpy(dah.data(), da, size_t(rows) * 2, cudaMemcpyDeviceToHost));
  const double da_want = double(n) * gval * bval;
  for (int64_t r : check_rows) EXPECT_NEAR(bf16_to_float(dah[size_t(r)]), da_want, 8e-3 * da_want) << "da row " << r;
  for (void* p : {b, y, dy, a, da}) cudaFree(p);
}

}  // namespace
