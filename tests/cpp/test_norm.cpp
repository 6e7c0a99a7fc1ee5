// The CUDA norm kernels against the float64 reference (kernelforge::ref), on the GPU: rms_norm,
// add_rms_norm and layer_norm, forward and backward, through the public API (the plan the library
// chooses; test_norm_plans.cpp runs every candidate plan).
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

#include "test_norm_common.h"

namespace {

using namespace kftest_norm;

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

using RowCase = std::tuple<DType, RowShape, LayoutKind>;

void PrintTo(const RowShape& s, std::ostream* os) { *os << s.rows << "x" << s.n; }

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

// ---- instantiation ---------------------------------------------------------------------------
INSTANTIATE_TEST_SUITE_P(Shapes, NormGpu,
                         ::testing::ValuesIn(cases<RowCase>(
                             kRowShapes, +[](const RowShape& s) { return s.rows * s.n; })),
                         [](const ::testing::TestParamInfo<RowCase>& i) {
                           const RowShape& s = std::get<1>(i.param);
                           return std::string(dtype_tag(std::get<0>(i.param))) + "_" + std::to_string(s.rows) + "x" +
                                  std::to_string(s.n) + "_" + layout_name(std::get<2>(i.param));
                         });

}  // namespace
