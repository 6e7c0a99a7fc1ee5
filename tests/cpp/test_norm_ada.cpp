// The CUDA norm kernels against the float64 reference on the GPU: ada_norm forward and backward
// (every scale/shift shape, with and without weight and bias), the bit-identical gradient reductions,
// and contract details (strided views, empty tensors, devices, the workspace query, bfloat16 on sm_75).
// Conventions as in test_norm.cpp.
#include <string>
#include <tuple>
#include <vector>

#include "test_norm_common.h"

namespace {

using namespace kftest_norm;

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

using AdaCase = std::tuple<DType, AdaShape, LayoutKind>;

void PrintTo(const AdaShape& s, std::ostream* os) { *os << s.b << "x" << s.s << "x" << s.n; }

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
