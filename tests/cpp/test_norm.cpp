// The CUDA norm kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case: fresh random inputs (never zeros), every output buffer poisoned with NaN (0xFF
// bytes) before each run, every element compared with one tolerance table per dtype, NaN never
// passes, and bytes outside each output view (row padding, base offset, a guard after the last
// row) must stay untouched. Shapes are chosen per code path; each runs contiguous, row-padded
// (x[:, :N] of a wider buffer), odd-row-stride and unaligned (base pointer + 1 element) layouts.
// Tests skip without a GPU, and fail instead when KF_REQUIRE_GPU=1.
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::NormKind;

constexpr float kRmsEps = 1e-6f;
constexpr float kLayerEps = 1e-5f;

// ---- cases -----------------------------------------------------------------------------------
struct RowShape {
  int64_t rows, n;
};
// One shape per code path: tiny, warp-sized rows, the common hidden sizes, odd N (no vector
// access), N just under a power of two, rows too long for one block's registers, a single huge
// row, no rows, and many rows (multi-block weight-gradient reduction; on sm_90 the chunked
// backward: 8-row chunks with a partial last one at 4099x512, 4 at 1031x2048, 5 rows of 7 warps
// at 333x1600, one row of 512 threads with two vectors each at 300x8192; the split backward of long
// rows with many work units and a partial last column tile at 67x12288; odd N with a scalar head
// per row in the forward's 512-thread blocks, more blocks than SMs, at 140x8191).
const RowShape kRowShapes[] = {{1, 1},      {7, 1000},   {3, 4096},   {19, 4097},  {5, 8191},
                               {2, 131072}, {1, 262144}, {0, 4096},   {4099, 512}, {1031, 2048},
                               {333, 1600}, {300, 8192}, {67, 12288}, {140, 8191}};

struct AdaShape {
  int64_t b, s, n;
};
// 300x3x1024: more groups than resident blocks (a block owns whole groups); 3x100x8192: one row per
// chunk, two vectors per thread; 3x11x12288 and 181x2x12288: the split backward of long rows, with
// groups shared by several blocks, and with more groups than work units (a block owns whole groups);
// 2x70x8191: odd N with a scalar head per row in the forward's 512-thread blocks.
const AdaShape kAdaShapes[] = {{1, 1, 1},      {2, 3, 1000},   {3, 1, 4096},   {2, 5, 4097},    {1, 5, 8191},
                               {2, 1, 131072}, {1, 1, 262144}, {2, 0, 4096},   {4, 257, 512},   {2, 259, 2048},
                               {300, 3, 1024}, {3, 100, 8192}, {3, 11, 12288}, {181, 2, 12288}, {2, 70, 8191}};

enum class LayoutKind { kContiguous, kRowPadded, kOddStride, kUnaligned };
const char* layout_name(LayoutKind l) {
  switch (l) {
    case LayoutKind::kContiguous:
      return "contiguous";
    case LayoutKind::kRowPadded:
      return "rowpadded";
    case LayoutKind::kOddStride:
      return "oddstride";
    case LayoutKind::kUnaligned:
      return "unaligned";
  }
  return "?";
}
// layout of [..., N] row tensors (x, y, dy, dx, residual, sum)
Layout row_layout(LayoutKind l) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};  // rows stay 16-byte aligned when N allows
    case LayoutKind::kOddStride:
      return {3, 0};  // every row starts at a different alignment
    case LayoutKind::kUnaligned:
      return {0, 1};  // base pointer one element past alignment
  }
  return {};
}
// layout of contiguous parameter tensors (weight, bias, scale, shift and their gradients)
Layout param_layout(LayoutKind l) { return {0, l == LayoutKind::kUnaligned ? 1 : 0}; }

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "other";
  }
}

using RowCase = std::tuple<DType, RowShape, LayoutKind>;
using AdaCase = std::tuple<DType, AdaShape, LayoutKind>;

void PrintTo(const RowShape& s, std::ostream* os) { *os << s.rows << "x" << s.n; }
void PrintTo(const AdaShape& s, std::ostream* os) { *os << s.b << "x" << s.s << "x" << s.n; }
void PrintTo(LayoutKind l, std::ostream* os) { *os << layout_name(l); }

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// Runs a backward call the CUB way: query the workspace size, then run with a workspace of that
// size, itself poisoned so that a kernel relying on zeroed scratch fails.
template <class F>
Status with_workspace(F call) {
  size_t bytes = 0;
  Status st = call(nullptr, &bytes);
  if (!st.ok()) return st;
  void* ws = nullptr;
  if (cudaMalloc(&ws, bytes > 0 ? bytes : 16) != cudaSuccess) return Status::Cuda("test: workspace allocation failed");
  cudaMemset(ws, 0xFF, bytes > 0 ? bytes : 16);
  // cudaMemset runs on the legacy default stream and may return before it is done; the tests' streams
  // are non-blocking and do not wait for it (a late fill overwrote the backward's partial rows with
  // NaN when ctest ran several GPU tests at once: dweight / dshift all NaN, session 10). Wait here.
  cudaDeviceSynchronize();
  st = call(ws, &bytes);
  cudaDeviceSynchronize();
  cudaFree(ws);
  return st;
}

class GpuFixture {
 protected:
  cudaStream_t stream_ = nullptr;
  // returns false (and skips/fails) when the case cannot run here
  void gpu_setup(DType t) {
    KF_NEED_GPU();
    if (t == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void gpu_teardown() {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  // After a launch: wait on the test's stream and surface asynchronous kernel errors.
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
};

class NormGpu : public ::testing::TestWithParam<RowCase>, public GpuFixture {
 protected:
  void SetUp() override { gpu_setup(dtype()); }
  void TearDown() override { gpu_teardown(); }
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t M() const { return std::get<1>(GetParam()).rows; }
  int64_t N() const { return std::get<1>(GetParam()).n; }
  Layout rows() const { return row_layout(std::get<2>(GetParam())); }
  Layout params() const { return param_layout(std::get<2>(GetParam())); }
  uint64_t seed(const char* op) const {
    return hash_str(std::string(op) + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  Tol tol() const { return tolerance(dtype()); }
  Tol rtol() const { return reduction_tolerance(dtype(), M()); }
};

class NormGpuAda : public ::testing::TestWithParam<AdaCase>, public GpuFixture {
 protected:
  void SetUp() override { gpu_setup(dtype()); }
  void TearDown() override { gpu_teardown(); }
  DType dtype() const { return std::get<0>(GetParam()); }
  int64_t B() const { return std::get<1>(GetParam()).b; }
  int64_t S() const { return std::get<1>(GetParam()).s; }
  int64_t N() const { return std::get<1>(GetParam()).n; }
  Layout rows() const { return row_layout(std::get<2>(GetParam())); }
  Layout params() const { return param_layout(std::get<2>(GetParam())); }
  uint64_t seed(const char* op) const {
    return hash_str(std::string(op) + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
};

// ---- forward ---------------------------------------------------------------------------------
TEST_P(NormGpu, RmsNorm) {
  const DType t = dtype();
  for (bool with_w : {true, false}) {
    SCOPED_TRACE(with_w ? "weight" : "no weight");
    Rng rng(seed("rms_norm") + with_w);
    HostTensor x = random_tensor(t, {M(), N()}, rng), w = random_weight(t, {N()}, rng);
    HostTensor want(t, {M(), N()});
    TensorView wv = w.view();
    KF_ASSERT_OK(ref::rms_norm(x.view(), with_w ? &wv : nullptr, kRmsEps, want.view()));

    DeviceTensor dx = to_device(x, rows()), dw = to_device(w, params());
    DeviceTensor y(t, {M(), N()}, rows());
    TensorView dwv = dw.view();
    ASSERT_TRUE(finish(kf::rms_norm(dx.view(), with_w ? &dwv : nullptr, kRmsEps, y.view(), stream_)));
    EXPECT_TRUE(all_close("y", y.download(), want, tol()));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(bit_equal("x is not written", dx.download(), x));
    EXPECT_TRUE(dx.check_untouched("x"));
  }
}

TEST_P(NormGpu, AddRmsNorm) {
  const DType t = dtype();
  for (bool with_w : {true, false}) {
    SCOPED_TRACE(with_w ? "weight" : "no weight");
    Rng rng(seed("add_rms_norm") + with_w);
    HostTensor x = random_tensor(t, {M(), N()}, rng), res = random_tensor(t, {M(), N()}, rng);
    HostTensor w = random_weight(t, {N()}, rng);
    HostTensor want_y(t, {M(), N()}), want_s(t, {M(), N()});
    TensorView wv = w.view();
    KF_ASSERT_OK(
        ref::add_rms_norm(x.view(), res.view(), with_w ? &wv : nullptr, kRmsEps, want_y.view(), want_s.view()));

    DeviceTensor dx = to_device(x, rows()), dres = to_device(res, rows()), dw = to_device(w, params());
    DeviceTensor y(t, {M(), N()}, rows()), s(t, {M(), N()}, rows());
    TensorView dwv = dw.view();
    ASSERT_TRUE(finish(
        kf::add_rms_norm(dx.view(), dres.view(), with_w ? &dwv : nullptr, kRmsEps, y.view(), s.view(), stream_)));
    // the sum is one rounding of x + residual: exact
    EXPECT_TRUE(bit_equal("sum", s.download(), want_s));
    EXPECT_TRUE(all_close("y", y.download(), want_y, tol()));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(s.check_untouched("sum"));
    EXPECT_TRUE(bit_equal("x is not written", dx.download(), x));
    EXPECT_TRUE(bit_equal("residual is not written", dres.download(), res));
  }
}

TEST_P(NormGpu, LayerNorm) {
  const DType t = dtype();
  for (int mask = 0; mask < 4; ++mask) {
    const bool with_w = mask & 1, with_b = mask & 2;
    SCOPED_TRACE(std::string(with_w ? "weight" : "no weight") + (with_b ? ", bias" : ", no bias"));
    Rng rng(seed("layer_norm") + mask);
    // a row mean away from zero exercises the mean subtraction
    HostTensor x = random_tensor(t, {M(), N()}, rng, -1.0, 3.0);
    HostTensor w = random_weight(t, {N()}, rng), b = random_tensor(t, {N()}, rng);
    HostTensor want(t, {M(), N()});
    TensorView wv = w.view(), bv = b.view();
    KF_ASSERT_OK(ref::layer_norm(x.view(), with_w ? &wv : nullptr, with_b ? &bv : nullptr, kLayerEps, want.view()));

    DeviceTensor dx = to_device(x, rows()), dw = to_device(w, params()), db = to_device(b, params());
    DeviceTensor y(t, {M(), N()}, rows());
    TensorView dwv = dw.view(), dbv = db.view();
    ASSERT_TRUE(finish(
        kf::layer_norm(dx.view(), with_w ? &dwv : nullptr, with_b ? &dbv : nullptr, kLayerEps, y.view(), stream_)));
    EXPECT_TRUE(all_close("y", y.download(), want, tol()));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(bit_equal("x is not written", dx.download(), x));
  }
}

// ---- backward --------------------------------------------------------------------------------
TEST_P(NormGpu, RmsNormBackward) {
  const DType t = dtype();
  // weight + dweight; weight without asking for dweight; no weight
  for (int variant = 0; variant < 3; ++variant) {
    const bool with_w = variant < 2, need_dw = variant == 0;
    SCOPED_TRACE(variant == 0 ? "weight, dweight" : variant == 1 ? "weight, dx only" : "no weight");
    Rng rng(seed("rms_norm_backward") + variant);
    HostTensor x = random_tensor(t, {M(), N()}, rng), w = random_weight(t, {N()}, rng);
    HostTensor dy = random_tensor(t, {M(), N()}, rng);
    HostTensor want_dx(t, {M(), N()}), want_dw(t, {N()});
    TensorView wv = w.view(), want_dwv = want_dw.view();
    KF_ASSERT_OK(ref::rms_norm_backward(dy.view(), x.view(), with_w ? &wv : nullptr, kRmsEps, want_dx.view(),
                                        need_dw ? &want_dwv : nullptr));

    DeviceTensor d_x = to_device(x, rows()), d_w = to_device(w, params()), d_dy = to_device(dy, rows());
    DeviceTensor d_dx(t, {M(), N()}, rows()), d_dw(t, {N()}, params());
    TensorView wview = d_w.view(), dwview = d_dw.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::rms_norm_backward(d_dy.view(), d_x.view(), with_w ? &wview : nullptr, kRmsEps, d_dx.view(),
                                   need_dw ? &dwview : nullptr, ws, bytes, stream_);
    })));
    EXPECT_TRUE(all_close("dx", d_dx.download(), want_dx, tol()));
    EXPECT_TRUE(d_dx.check_untouched("dx"));
    if (need_dw) {
      EXPECT_TRUE(all_close("dweight", d_dw.download(), want_dw, rtol()));
      EXPECT_TRUE(d_dw.check_untouched("dweight"));
    }
  }
}

TEST_P(NormGpu, AddRmsNormBackward) {
  const DType t = dtype();
  for (int variant = 0; variant < 3; ++variant) {
    const bool with_dsum = variant != 1, with_w = variant != 2;
    SCOPED_TRACE(variant == 0 ? "dsum, weight" : variant == 1 ? "no dsum, weight" : "dsum, no weight");
    Rng rng(seed("add_rms_norm_backward") + variant);
    HostTensor s = random_tensor(t, {M(), N()}, rng), w = random_weight(t, {N()}, rng);
    HostTensor dy = random_tensor(t, {M(), N()}, rng), dsum = random_tensor(t, {M(), N()}, rng);
    HostTensor want_dx(t, {M(), N()}), want_dw(t, {N()});
    TensorView wv = w.view(), dsv = dsum.view(), want_dwv = want_dw.view();
    KF_ASSERT_OK(ref::add_rms_norm_backward(dy.view(), with_dsum ? &dsv : nullptr, s.view(), with_w ? &wv : nullptr,
                                            kRmsEps, want_dx.view(), with_w ? &want_dwv : nullptr));

    DeviceTensor d_s = to_device(s, rows()), d_w = to_device(w, params());
    DeviceTensor d_dy = to_device(dy, rows()), d_dsum = to_device(dsum, rows());
    DeviceTensor d_dx(t, {M(), N()}, rows()), d_dw(t, {N()}, params());
    TensorView wview = d_w.view(), dwview = d_dw.view(), dsview = d_dsum.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::add_rms_norm_backward(d_dy.view(), with_dsum ? &dsview : nullptr, d_s.view(),
                                       with_w ? &wview : nullptr, kRmsEps, d_dx.view(), with_w ? &dwview : nullptr, ws,
                                       bytes, stream_);
    })));
    EXPECT_TRUE(all_close("dx", d_dx.download(), want_dx, tol()));
    EXPECT_TRUE(d_dx.check_untouched("dx"));
    if (with_w) {
      EXPECT_TRUE(all_close("dweight", d_dw.download(), want_dw, rtol()));
      EXPECT_TRUE(d_dw.check_untouched("dweight"));
    }
  }
}

TEST_P(NormGpu, LayerNormBackward) {
  const DType t = dtype();
  for (int mask = 0; mask < 4; ++mask) {
    const bool with_w = mask & 1, with_b = mask & 2;
    SCOPED_TRACE(std::string(with_w ? "weight" : "no weight") + (with_b ? ", bias" : ", no bias"));
    Rng rng(seed("layer_norm_backward") + mask);
    HostTensor x = random_tensor(t, {M(), N()}, rng, -1.0, 3.0);
    HostTensor w = random_weight(t, {N()}, rng), b = random_tensor(t, {N()}, rng);
    HostTensor dy = random_tensor(t, {M(), N()}, rng);
    HostTensor want_dx(t, {M(), N()}), want_dw(t, {N()}), want_db(t, {N()});
    TensorView wv = w.view(), bv = b.view(), want_dwv = want_dw.view(), want_dbv = want_db.view();
    KF_ASSERT_OK(ref::layer_norm_backward(dy.view(), x.view(), with_w ? &wv : nullptr, with_b ? &bv : nullptr,
                                          kLayerEps, want_dx.view(), with_w ? &want_dwv : nullptr,
                                          with_b ? &want_dbv : nullptr));

    DeviceTensor d_x = to_device(x, rows()), d_w = to_device(w, params()), d_b = to_device(b, params());
    DeviceTensor d_dy = to_device(dy, rows());
    DeviceTensor d_dx(t, {M(), N()}, rows()), d_dw(t, {N()}, params()), d_db(t, {N()}, params());
    TensorView wview = d_w.view(), bview = d_b.view(), dwview = d_dw.view(), dbview = d_db.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::layer_norm_backward(d_dy.view(), d_x.view(), with_w ? &wview : nullptr, with_b ? &bview : nullptr,
                                     kLayerEps, d_dx.view(), with_w ? &dwview : nullptr, with_b ? &dbview : nullptr, ws,
                                     bytes, stream_);
    })));
    EXPECT_TRUE(all_close("dx", d_dx.download(), want_dx, tol()));
    EXPECT_TRUE(d_dx.check_untouched("dx"));
    if (with_w) {
      EXPECT_TRUE(all_close("dweight", d_dw.download(), want_dw, rtol()));
    }
    if (with_b) {
      EXPECT_TRUE(all_close("dbias", d_db.download(), want_db, rtol()));
    }
    EXPECT_TRUE(d_dw.check_untouched("dweight"));
    EXPECT_TRUE(d_db.check_untouched("dbias"));
  }
}

// ---- ada_norm --------------------------------------------------------------------------------
struct AdaVariant {
  NormKind kind;
  int mod;  // 0: scale/shift [N], 1: [B, 1, N], 2: [B, S, N]
  bool affine;
};
// Both kinds with every scale/shift shape; weight+bias alternate so that each kind and each
// scale/shift shape runs once with and once without them.
std::vector<AdaVariant> ada_variants() {
  std::vector<AdaVariant> v;
  for (NormKind k : {NormKind::kLayer, NormKind::kRms})
    for (int mod = 0; mod < 3; ++mod) v.push_back({k, mod, (mod + static_cast<int>(k)) % 2 == 1});
  return v;
}
std::string ada_name(const AdaVariant& v) {
  static const char* mods[] = {"[N]", "[B,1,N]", "[B,S,N]"};
  return std::string(v.kind == NormKind::kRms ? "rms" : "layer") + ", scale/shift " + mods[v.mod] +
         (v.affine ? ", weight+bias" : ", no affine");
}

TEST_P(NormGpuAda, AdaNorm) {
  const DType t = dtype();
  int i = 0;
  for (const AdaVariant& v : ada_variants()) {
    SCOPED_TRACE(ada_name(v));
    Rng rng(seed("ada_norm") + i++);
    const std::vector<int64_t> xs = {B(), S(), N()};
    const std::vector<int64_t> ms = v.mod == 0   ? std::vector<int64_t>{N()}
                                    : v.mod == 1 ? std::vector<int64_t>{B(), 1, N()}
                                                 : xs;
    HostTensor x = random_tensor(t, xs, rng, -1.0, 3.0);
    HostTensor scale = random_tensor(t, ms, rng, -0.5, 0.5), shift = random_tensor(t, ms, rng);
    HostTensor w = random_weight(t, {N()}, rng), b = random_tensor(t, {N()}, rng);
    TensorView wv = w.view(), bv = b.view();
    const bool with_b = v.affine;  // bias with either kind: rms + bias is allowed by the API
    HostTensor want(t, xs);
    KF_ASSERT_OK(ref::ada_norm(x.view(), scale.view(), shift.view(), v.affine ? &wv : nullptr, with_b ? &bv : nullptr,
                               kLayerEps, v.kind, want.view()));

    DeviceTensor d_x = to_device(x, rows()), d_scale = to_device(scale, params()), d_shift = to_device(shift, params()),
                 d_w = to_device(w, params()), d_b = to_device(b, params());
    DeviceTensor y(t, xs, rows());
    TensorView wview = d_w.view(), bview = d_b.view();
    ASSERT_TRUE(finish(kf::ada_norm(d_x.view(), d_scale.view(), d_shift.view(), v.affine ? &wview : nullptr,
                                    with_b ? &bview : nullptr, kLayerEps, v.kind, y.view(), stream_)));
    EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
    EXPECT_TRUE(y.check_untouched("y"));
    EXPECT_TRUE(bit_equal("x is not written", d_x.download(), x));
  }
}

TEST_P(NormGpuAda, AdaNormBackward) {
  const DType t = dtype();
  int i = 0;
  for (const AdaVariant& v : ada_variants()) {
    SCOPED_TRACE(ada_name(v));
    Rng rng(seed("ada_norm_backward") + i++);
    const std::vector<int64_t> xs = {B(), S(), N()};
    const std::vector<int64_t> ms = v.mod == 0   ? std::vector<int64_t>{N()}
                                    : v.mod == 1 ? std::vector<int64_t>{B(), 1, N()}
                                                 : xs;
    // rows summed into one element of dscale/dshift and of dweight/dbias
    const int64_t mod_terms = v.mod == 0 ? B() * S() : v.mod == 1 ? S() : 1;
    HostTensor x = random_tensor(t, xs, rng, -1.0, 3.0);
    HostTensor scale = random_tensor(t, ms, rng, -0.5, 0.5), shift = random_tensor(t, ms, rng);
    HostTensor w = random_weight(t, {N()}, rng), b = random_tensor(t, {N()}, rng);
    HostTensor dy = random_tensor(t, xs, rng);
    TensorView wv = w.view(), bv = b.view();
    const TensorView* wp = v.affine ? &wv : nullptr;
    const TensorView* bp = v.affine ? &bv : nullptr;
    HostTensor want_dx(t, xs), want_dscale(t, ms), want_dshift(t, ms), want_dw(t, {N()}), want_db(t, {N()});
    TensorView a = want_dscale.view(), c = want_dshift.view(), d = want_dw.view(), e = want_db.view();
    KF_ASSERT_OK(ref::ada_norm_backward(dy.view(), x.view(), scale.view(), shift.view(), wp, bp, kLayerEps, v.kind,
                                        want_dx.view(), &a, &c, wp ? &d : nullptr, bp ? &e : nullptr));

    DeviceTensor d_x = to_device(x, rows()), d_dy = to_device(dy, rows());
    DeviceTensor d_scale = to_device(scale, params()), d_shift = to_device(shift, params());
    DeviceTensor d_w = to_device(w, params()), d_b = to_device(b, params());
    DeviceTensor d_dx(t, xs, rows()), d_dscale(t, ms, params()), d_dshift(t, ms, params());
    DeviceTensor d_dw(t, {N()}, params()), d_db(t, {N()}, params());
    TensorView wview = d_w.view(), bview = d_b.view();
    TensorView dsc = d_dscale.view(), dsh = d_dshift.view(), dwv = d_dw.view(), dbv = d_db.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::ada_norm_backward(d_dy.view(), d_x.view(), d_scale.view(), d_shift.view(), v.affine ? &wview : nullptr,
                                   v.affine ? &bview : nullptr, kLayerEps, v.kind, d_dx.view(), &dsc, &dsh,
                                   v.affine ? &dwv : nullptr, v.affine ? &dbv : nullptr, ws, bytes, stream_);
    })));
    EXPECT_TRUE(all_close("dx", d_dx.download(), want_dx, tolerance(t)));
    EXPECT_TRUE(all_close("dscale", d_dscale.download(), want_dscale, reduction_tolerance(t, mod_terms)));
    EXPECT_TRUE(all_close("dshift", d_dshift.download(), want_dshift, reduction_tolerance(t, mod_terms)));
    if (v.affine) {
      EXPECT_TRUE(all_close("dweight", d_dw.download(), want_dw, reduction_tolerance(t, B() * S())));
      EXPECT_TRUE(all_close("dbias", d_db.download(), want_db, reduction_tolerance(t, B() * S())));
    }
    EXPECT_TRUE(d_dx.check_untouched("dx"));
    EXPECT_TRUE(d_dscale.check_untouched("dscale"));
    EXPECT_TRUE(d_dshift.check_untouched("dshift"));
  }
}

// ---- instantiation ---------------------------------------------------------------------------
const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const LayoutKind kLayouts[] = {LayoutKind::kContiguous, LayoutKind::kRowPadded, LayoutKind::kOddStride,
                               LayoutKind::kUnaligned};

// Every dtype x shape x layout, except that shapes of over a million elements (whose point is the
// many-row reduction, not the addressing) run contiguous and unaligned only: the host-side float64
// reference dominates the run time.
template <class Case, class Shape, size_t NS>
std::vector<Case> cases(const Shape (&shapes)[NS], int64_t (*elements)(const Shape&)) {
  std::vector<Case> out;
  for (DType t : kDtypes)
    for (const Shape& s : shapes)
      for (LayoutKind l : kLayouts)
        if (elements(s) <= (int64_t{1} << 20) || l == LayoutKind::kContiguous || l == LayoutKind::kUnaligned)
          out.emplace_back(t, s, l);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormGpu,
                         ::testing::ValuesIn(cases<RowCase>(
                             kRowShapes, +[](const RowShape& s) { return s.rows * s.n; })),
                         [](const ::testing::TestParamInfo<RowCase>& i) {
                           const RowShape& s = std::get<1>(i.param);
                           return std::string(dtype_tag(std::get<0>(i.param))) + "_" + std::to_string(s.rows) + "x" +
                                  std::to_string(s.n) + "_" + layout_name(std::get<2>(i.param));
                         });

INSTANTIATE_TEST_SUITE_P(Shapes, NormGpuAda,
                         ::testing::ValuesIn(cases<AdaCase>(
                             kAdaShapes, +[](const AdaShape& s) { return s.b * s.s * s.n; })),
                         [](const ::testing::TestParamInfo<AdaCase>& i) {
                           const AdaShape& s = std::get<1>(i.param);
                           return std::string(dtype_tag(std::get<0>(i.param))) + "_" + std::to_string(s.b) + "x" +
                                  std::to_string(s.s) + "x" + std::to_string(s.n) + "_" +
                                  layout_name(std::get<2>(i.param));
                         });

// ---- determinism: gradient reductions are bit-identical run to run ---------------------------
class NormGpuDeterminism : public ::testing::TestWithParam<DType>, public GpuFixture {
 protected:
  void SetUp() override { gpu_setup(GetParam()); }
  void TearDown() override { gpu_teardown(); }
};

// Many rows, so the weight gradient is reduced across many blocks.
constexpr int64_t kDetM = 8192, kDetN = 1024;

TEST_P(NormGpuDeterminism, RmsNormBackward) {
  const DType t = GetParam();
  Rng rng(hash_str("det_rms") + static_cast<int>(t));
  HostTensor x = random_tensor(t, {kDetM, kDetN}, rng), w = random_weight(t, {kDetN}, rng);
  HostTensor dy = random_tensor(t, {kDetM, kDetN}, rng);
  DeviceTensor d_x = to_device(x, {}), d_w = to_device(w, {}), d_dy = to_device(dy, {});
  DeviceTensor d_dx(t, {kDetM, kDetN}), d_dw(t, {kDetN});
  HostTensor dx[2], dw[2];
  for (int run = 0; run < 2; ++run) {
    d_dx.poison();
    d_dw.poison();
    TensorView wv = d_w.view(), dwv = d_dw.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::rms_norm_backward(d_dy.view(), d_x.view(), &wv, kRmsEps, d_dx.view(), &dwv, ws, bytes, stream_);
    })));
    dx[run] = d_dx.download();
    dw[run] = d_dw.download();
  }
  EXPECT_TRUE(bit_equal("dweight", dw[0], dw[1]));
  EXPECT_TRUE(bit_equal("dx", dx[0], dx[1]));
}

TEST_P(NormGpuDeterminism, AddRmsNormBackward) {
  const DType t = GetParam();
  Rng rng(hash_str("det_add") + static_cast<int>(t));
  HostTensor s = random_tensor(t, {kDetM, kDetN}, rng), w = random_weight(t, {kDetN}, rng);
  HostTensor dy = random_tensor(t, {kDetM, kDetN}, rng), dsum = random_tensor(t, {kDetM, kDetN}, rng);
  DeviceTensor d_s = to_device(s, {}), d_w = to_device(w, {}), d_dy = to_device(dy, {});
  DeviceTensor d_dsum = to_device(dsum, {});
  DeviceTensor d_dx(t, {kDetM, kDetN}), d_dw(t, {kDetN});
  HostTensor dw[2];
  for (int run = 0; run < 2; ++run) {
    d_dx.poison();
    d_dw.poison();
    TensorView wv = d_w.view(), dwv = d_dw.view(), dsv = d_dsum.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::add_rms_norm_backward(d_dy.view(), &dsv, d_s.view(), &wv, kRmsEps, d_dx.view(), &dwv, ws, bytes,
                                       stream_);
    })));
    dw[run] = d_dw.download();
  }
  EXPECT_TRUE(bit_equal("dweight", dw[0], dw[1]));
}

TEST_P(NormGpuDeterminism, LayerNormBackward) {
  const DType t = GetParam();
  Rng rng(hash_str("det_ln") + static_cast<int>(t));
  HostTensor x = random_tensor(t, {kDetM, kDetN}, rng, -1.0, 3.0);
  HostTensor w = random_weight(t, {kDetN}, rng), b = random_tensor(t, {kDetN}, rng);
  HostTensor dy = random_tensor(t, {kDetM, kDetN}, rng);
  DeviceTensor d_x = to_device(x, {}), d_w = to_device(w, {}), d_b = to_device(b, {});
  DeviceTensor d_dy = to_device(dy, {});
  DeviceTensor d_dx(t, {kDetM, kDetN}), d_dw(t, {kDetN}), d_db(t, {kDetN});
  HostTensor dw[2], db[2];
  for (int run = 0; run < 2; ++run) {
    d_dx.poison();
    d_dw.poison();
    d_db.poison();
    TensorView wv = d_w.view(), bv = d_b.view(), dwv = d_dw.view(), dbv = d_db.view();
    ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
      return kf::layer_norm_backward(d_dy.view(), d_x.view(), &wv, &bv, kLayerEps, d_dx.view(), &dwv, &dbv, ws, bytes,
                                     stream_);
    })));
    dw[run] = d_dw.download();
    db[run] = d_db.download();
  }
  EXPECT_TRUE(bit_equal("dweight", dw[0], dw[1]));
  EXPECT_TRUE(bit_equal("dbias", db[0], db[1]));
}

TEST_P(NormGpuDeterminism, AdaNormBackward) {
  const DType t = GetParam();
  const int64_t B = 4, S = kDetM / 4, N = kDetN;
  for (const std::vector<int64_t>& ms : {std::vector<int64_t>{N}, std::vector<int64_t>{B, 1, N}}) {
    SCOPED_TRACE("scale/shift " + shape_str(ms));
    Rng rng(hash_str("det_ada") + static_cast<int>(t) + ms.size());
    HostTensor x = random_tensor(t, {B, S, N}, rng, -1.0, 3.0), dy = random_tensor(t, {B, S, N}, rng);
    HostTensor scale = random_tensor(t, ms, rng, -0.5, 0.5), shift = random_tensor(t, ms, rng);
    HostTensor w = random_weight(t, {N}, rng), b = random_tensor(t, {N}, rng);
    DeviceTensor d_x = to_device(x, {}), d_dy = to_device(dy, {}), d_scale = to_device(scale, {});
    DeviceTensor d_shift = to_device(shift, {}), d_w = to_device(w, {}), d_b = to_device(b, {});
    DeviceTensor d_dx(t, {B, S, N}), d_dscale(t, ms), d_dshift(t, ms), d_dw(t, {N}), d_db(t, {N});
    HostTensor out[2][4];
    for (int run = 0; run < 2; ++run) {
      for (DeviceTensor* o : {&d_dx, &d_dscale, &d_dshift, &d_dw, &d_db}) o->poison();
      TensorView wv = d_w.view(), bv = d_b.view();
      TensorView a = d_dscale.view(), c = d_dshift.view(), d = d_dw.view(), e = d_db.view();
      ASSERT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
        return kf::ada_norm_backward(d_dy.view(), d_x.view(), d_scale.view(), d_shift.view(), &wv, &bv, kLayerEps,
                                     NormKind::kLayer, d_dx.view(), &a, &c, &d, &e, ws, bytes, stream_);
      })));
      out[run][0] = d_dscale.download();
      out[run][1] = d_dshift.download();
      out[run][2] = d_dw.download();
      out[run][3] = d_db.download();
    }
    EXPECT_TRUE(bit_equal("dscale", out[0][0], out[1][0]));
    EXPECT_TRUE(bit_equal("dshift", out[0][1], out[1][1]));
    EXPECT_TRUE(bit_equal("dweight", out[0][2], out[1][2]));
    EXPECT_TRUE(bit_equal("dbias", out[0][3], out[1][3]));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NormGpuDeterminism, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_tag(i.param)); });

// ---- contract details --------------------------------------------------------------------------
class NormGpuMisc : public ::testing::Test, public GpuFixture {
 protected:
  void SetUp() override { gpu_setup(DType::kFloat32); }
  void TearDown() override { gpu_teardown(); }
};

// Leading dimensions collapse into one row stride: x [4, 5, N] viewed out of a wider buffer; the
// output contiguous while the input is strided.
TEST_F(NormGpuMisc, RmsNorm3dStridedInputContiguousOutput) {
  const DType t = DType::kFloat16;
  const int64_t N = 1000;
  Rng rng(hash_str("rms3d"));
  HostTensor x = random_tensor(t, {4, 5, N}, rng), w = random_weight(t, {N}, rng), want(t, {4, 5, N});
  TensorView wv = w.view();
  KF_ASSERT_OK(ref::rms_norm(x.view(), &wv, kRmsEps, want.view()));
  DeviceTensor d_x = to_device(x, {24, 0}), d_w = to_device(w, {}), y(t, {4, 5, N});
  TensorView dwv = d_w.view();
  ASSERT_TRUE(finish(kf::rms_norm(d_x.view(), &dwv, kRmsEps, y.view(), stream_)));
  EXPECT_TRUE(all_close("y", y.download(), want, tolerance(t)));
  EXPECT_TRUE(y.check_untouched("y"));
}

// Empty tensors from a framework may carry a null data pointer: rows == 0 launches nothing.
TEST_F(NormGpuMisc, ZeroRowsWithNullPointers) {
  const int64_t N = 4096;
  TensorView x = kf::make_view(nullptr, DType::kFloat32, {0, N});
  DeviceTensor w(DType::kFloat32, {N});
  TensorView wv = w.view(), y = kf::make_view(nullptr, DType::kFloat32, {0, N});
  TensorView s = kf::make_view(nullptr, DType::kFloat32, {0, N});
  EXPECT_TRUE(finish(kf::rms_norm(x, &wv, kRmsEps, y, stream_)));
  EXPECT_TRUE(finish(kf::add_rms_norm(x, x, &wv, kRmsEps, y, s, stream_)));
  EXPECT_TRUE(finish(kf::layer_norm(x, &wv, &wv, kLayerEps, y, stream_)));
  TensorView x3 = kf::make_view(nullptr, DType::kFloat32, {2, 0, N});
  TensorView y3 = kf::make_view(nullptr, DType::kFloat32, {2, 0, N});
  DeviceTensor mod(DType::kFloat32, {2, 1, N});
  EXPECT_TRUE(
      finish(kf::ada_norm(x3, mod.view(), mod.view(), nullptr, nullptr, kLayerEps, NormKind::kLayer, y3, stream_)));
  EXPECT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
    return kf::rms_norm_backward(x, x, &wv, kRmsEps, y, nullptr, ws, bytes, stream_);
  })));
  EXPECT_TRUE(w.check_untouched("weight"));  // never written (poisoned, outside any view)
}

// A framework's empty tensor [2, 0, N] has strides [N, N, 1]: valid, nothing launched, and the
// parameter gradients of no rows are zero.
TEST_F(NormGpuMisc, EmptyTensorsWithAnyStrides) {
  const int64_t N = 64;
  auto empty = [&] {
    TensorView v = kf::make_view(nullptr, DType::kFloat32, {2, 0, N});
    v.strides[0] = N;
    v.strides[1] = N;
    return v;
  };
  const TensorView x = empty(), y = empty();
  DeviceTensor w(DType::kFloat32, {N}), dw(DType::kFloat32, {N});
  TensorView wv = w.view(), dwv = dw.view();
  EXPECT_TRUE(finish(kf::rms_norm(x, &wv, kRmsEps, y, stream_)));
  EXPECT_TRUE(finish(kf::layer_norm(x, &wv, nullptr, kLayerEps, y, stream_)));
  EXPECT_TRUE(finish(with_workspace([&](void* ws, size_t* bytes) {
    return kf::rms_norm_backward(x, x, &wv, kRmsEps, y, &dwv, ws, bytes, stream_);
  })));
  const HostTensor got = dw.download();
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(got.get(i), 0.0) << "dweight[" << i << "] of no rows";
}

// Tensors on another device than the current one are refused (no silent cross-device access).
TEST_F(NormGpuMisc, TensorsOnAnotherDevice) {
  DeviceTensor x(DType::kFloat32, {2, 64}), y(DType::kFloat32, {2, 64});
  TensorView xv = x.view(), yv = y.view();
  xv.device.index = yv.device.index = 1;
  const Status st = kf::rms_norm(xv, nullptr, kRmsEps, yv, stream_);
  EXPECT_EQ(st.code(), kf::StatusCode::kInvalidArgument) << st.message();
  EXPECT_TRUE(has_substrings(st, {"rms_norm", "cuda:1"}));
}

// CUB convention: the size query (workspace == nullptr) computes nothing.
TEST_F(NormGpuMisc, WorkspaceQueryLaunchesNothing) {
  const DType t = DType::kFloat32;
  const int64_t M = 64, N = 2048;
  Rng rng(hash_str("ws_query"));
  DeviceTensor x = to_device(random_tensor(t, {M, N}, rng), {}), dy = to_device(random_tensor(t, {M, N}, rng), {});
  DeviceTensor w = to_device(random_weight(t, {N}, rng), {});
  DeviceTensor dx(t, {M, N}), dw(t, {N});
  TensorView wv = w.view(), dwv = dw.view();
  size_t bytes = 0;
  ASSERT_TRUE(
      finish(kf::rms_norm_backward(dy.view(), x.view(), &wv, kRmsEps, dx.view(), &dwv, nullptr, &bytes, stream_)));
  const std::vector<unsigned char> a = dx.raw(), b = dw.raw();
  bool all_poison = true;
  for (unsigned char c : a) all_poison &= c == 0xFF;
  for (unsigned char c : b) all_poison &= c == 0xFF;
  EXPECT_TRUE(all_poison) << "the workspace-size query wrote dx or dweight";
}

// sm_75 runs float16/float32; bfloat16 is refused with a clear status instead of wrong results.
TEST_F(NormGpuMisc, BFloat16NeedsSm80) {
  if (gpu_capability() >= 80) GTEST_SKIP() << "device is sm_" << gpu_capability() << ": bfloat16 supported";
  DeviceTensor x(DType::kBFloat16, {2, 64}), y(DType::kBFloat16, {2, 64});
  const Status st = kf::rms_norm(x.view(), nullptr, kRmsEps, y.view(), stream_);
  EXPECT_EQ(st.code(), kf::StatusCode::kNotSupported) << st.message();
  EXPECT_NE(st.message().find("bfloat16"), std::string::npos) << st.message();
}

}  // namespace
