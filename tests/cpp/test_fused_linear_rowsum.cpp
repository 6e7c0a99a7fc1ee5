// The CUDA fused_linear_rowsum kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case, with and without a bias: the forward (y, w_sum) and the backward (dx, dweight, dbias all
// asked; then each alone) on fresh random inputs, every output and the workspace poisoned with NaN
// (0xFF bytes) before the run; every element is compared with the one tolerance table per dtype plus
// the float32 accumulation bound of a sum (test_fused_linear_rowsum_util.h), NaN never passes, inputs
// must come back unchanged, bytes outside each output view must stay untouched, and a second run must
// be bit-identical. Shapes (T x K x O) per code path: ones, odd and prime sizes (no 16-byte vectors),
// 1 and 7 rows, many row chunks of x and of W, long rows (K = 65537), T = 0, K = 0, O = 0. Layouts:
// contiguous, row-padded (y and dy strided too), odd row stride (rows at every alignment: shifted
// 16-byte loads), base pointers one element off (w_sum included: the forward takes one-element
// vectors), mixed (aligned w_sum and x with a weight and dx one element off). FlrsGpuAllPlans runs
// every candidate plan through launch_with_plan; FlrsGpuRowAlignment checks that rows at any alignment
// give the bits of aligned rows.
// Tests skip without a GPU, and fail instead when KF_REQUIRE_GPU=1.
#include <string>
#include <tuple>
#include <vector>

#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "test_fused_linear_rowsum_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;

struct Shape {
  int64_t T, K, O;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.T << "x" << s.K << "x" << s.O; }
const Shape kShapes[] = {{1, 1, 1},     {7, 127, 5},   {1, 4096, 33},   {3, 4097, 7},      {19, 1000, 300},
                         {257, 520, 3}, {2, 64, 4100}, {1100, 256, 17}, {4097, 1023, 513}, {2, 65537, 2},
                         {0, 64, 8},    {5, 0, 3},     {4, 64, 0}};

// Tensors of a call: x, weight, y, w_sum, dy, dx, dweight, bias / dbias.
enum Slot { kX = 0, kW, kY, kWs, kDy, kDx, kDw, kB };

// Row layout of a slot (vectors y and dy: row_pad is their stride - 1; bias / w_sum: only the offset).
Layout layout_of(LayoutKind l, int slot) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {slot == kY || slot == kDy ? 2 : 64, 0};
    case LayoutKind::kOddStride:
      return {3, 0};
    case LayoutKind::kUnaligned:
      return {0, 1};
    case LayoutKind::kMixed:  // x, dweight, w_sum aligned; weight, dx and the vectors one element off
      return {0, slot == kX || slot == kDw || slot == kWs ? 0 : 1};
  }
  return {};
}

// A [T] vector with stride 1 + row_pad: a [T, 1] allocation viewed as [T].
struct VecDev {
  DeviceTensor d;
  VecDev(DType t, int64_t n, Layout l) : d(t, {n, 1}, l) {}
  TensorView view() const {
    TensorView v = d.view();
    v.ndim = 1;
    return v;
  }
  HostTensor download() const {
    HostTensor h = d.download();
    h.shape = {h.shape[0]};
    return h;
  }
  void upload(const HostTensor& h) {
    HostTensor two = h;
    two.shape = {h.shape[0], 1};
    d.upload(two);
  }
};

DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// A workspace of the size the API asks for, poisoned with NaN.
struct Workspace {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Workspace(size_t b) : bytes(b) {
    if (cudaMalloc(&p, bytes < 16 ? 16 : bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    poison();
  }
  ~Workspace() {
    if (p) cudaFree(p);
  }
  void poison() {
    if (!p) return;
    cudaMemset(p, 0xFF, bytes < 16 ? 16 : bytes);
    cudaDeviceSynchronize();
  }
};

using Case = std::tuple<DType, Shape, LayoutKind>;

class FlrsGpuBase {
 protected:
  cudaStream_t stream_ = nullptr;
  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  static uint64_t seed(const std::string& what) {
    return hash_str(what + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  // The float64 oracle of the forward: y and w_sum (float32).
  static void ref_forward(const FlrsHost& h, HostTensor* y, HostTensor* ws) {
    *y = HostTensor(h.x.dtype, {h.T});
    *ws = HostTensor(DType::kFloat32, {h.K});
    const TensorView b = h.b.view();
    const Status s = ref::fused_linear_rowsum(h.x.view(), h.w.view(), h.has_bias ? &b : nullptr, y->view(), ws->view());
    EXPECT_TRUE(s.ok()) << s.message();
  }

  // Forward on the GPU with `plan` (nullptr: the API's own plan); checks y, w_sum, inputs, guards and a
  // second bit-identical run.
  void check_forward(const FlrsHost& h, LayoutKind l, const kf::FlrsPlan* plan) {
    const DType t = h.x.dtype;
    HostTensor want_y, want_ws;
    ref_forward(h, &want_y, &want_ws);
    DeviceTensor x = to_device(h.x, layout_of(l, kX)), w = to_device(h.w, layout_of(l, kW));
    DeviceTensor b = to_device(h.b, layout_of(l, kB));
    VecDev y(t, h.T, layout_of(l, kY));
    DeviceTensor ws(DType::kFloat32, {h.K}, layout_of(l, kWs));
    Workspace work(kf::fused_linear_rowsum_workspace_size(h.T, h.K, h.O));
    const TensorView bv = b.view();
    const TensorView* bp = h.has_bias ? &bv : nullptr;
    auto call = [&] {
      if (plan == nullptr)
        return kf::fused_linear_rowsum(x.view(), w.view(), bp, y.view(), ws.view(), work.p, work.bytes, stream_);
      const TensorView xv = x.view(), wv = w.view(), yv = y.view(), wsv = ws.view();
      kf::FlrsCall c;
      c.name = "fused_linear_rowsum";
      c.x = &xv, c.weight = &wv, c.bias = bp, c.y = &yv, c.w_sum = &wsv;
      return kf::launch_with_plan(*plan, c, work.p, work.bytes, stream_);
    };
    ASSERT_TRUE(finish(call()));
    const HostTensor y1 = y.download(), ws1 = ws.download();
    EXPECT_TRUE(flrs_close("y", y1, want_y, tolerance(t), flrs_y_mag(h)));
    if (h.T > 0) {  // with no rows nothing is launched and w_sum is not written
      std::vector<double> smag(size_t(h.K), 0.0);
      for (int64_t o = 0; o < h.O; ++o)
        for (int64_t k = 0; k < h.K; ++k) smag[size_t(k)] += std::fabs(h.w.get(o * h.K + k));
      EXPECT_TRUE(flrs_close("w_sum", ws1, want_ws, tolerance(DType::kFloat32), smag));
    }
    EXPECT_TRUE(y.d.check_untouched("y"));
    EXPECT_TRUE(ws.check_untouched("w_sum"));
    EXPECT_TRUE(bit_equal("x is not written", x.download(), h.x));
    EXPECT_TRUE(bit_equal("weight is not written", w.download(), h.w));
    // again, over a poisoned workspace and outputs: the same bits
    y.d.poison();
    work.poison();
    ASSERT_TRUE(finish(call()));
    EXPECT_TRUE(bit_equal("y (second run)", y.download(), y1));
    if (h.T > 0) {
      EXPECT_TRUE(bit_equal("w_sum (second run)", ws.download(), ws1));
    }
  }

  // Backward on the GPU: every gradient (want_dx/dw/db), then (with the API's plan) each one alone.
  void check_backward(const FlrsHost& h, LayoutKind l, const kf::FlrsPlan* plan) {
    const DType t = h.x.dtype;
    HostTensor want_y, ws_host;
    ref_forward(h, &want_y, &ws_host);
    if (h.T == 0) {  // the forward wrote no w_sum: any values do (dx is empty)
      ws_host = HostTensor(DType::kFloat32, {h.K});
      for (int64_t k = 0; k < h.K; ++k) ws_host.set(k, 0.5 + k);
    }
    HostTensor want_dx(t, {h.T, h.K}), want_dw(t, {h.O, h.K}), want_db(t, {h.O});
    {
      const TensorView dxv = want_dx.view(), dwv = want_dw.view(), dbv = want_db.view();
      const Status s = ref::fused_linear_rowsum_backward(h.dy.view(), h.x.view(), ws_host.view(), &dxv, &dwv, &dbv);
      ASSERT_TRUE(s.ok()) << s.message();
    }
    DeviceTensor x = to_device(h.x, layout_of(l, kX));
    DeviceTensor ws = to_device(ws_host, layout_of(l, kWs));
    VecDev dy(t, h.T, layout_of(l, kDy));
    dy.upload(h.dy);
    Workspace work(kf::fused_linear_rowsum_workspace_size(h.T, h.K, h.O));
    const std::vector<double> dw_mag = flrs_dw_mag(h), db_mag = flrs_db_mag(h);
    for (int mask = 7; mask >= 1; --mask) {
      if (mask != 7 && plan != nullptr) break;  // the other plans: all gradients only
      SCOPED_TRACE("gradients " + std::string(mask & 1 ? "dx " : "") + (mask & 2 ? "dweight " : "") +
                   (mask & 4 ? "dbias" : ""));
      DeviceTensor dx(t, {h.T, h.K}, layout_of(l, kDx)), dw(t, {h.O, h.K}, layout_of(l, kDw));
      DeviceTensor db(t, {h.O}, layout_of(l, kB));
      const TensorView dxv = dx.view(), dwv = dw.view(), dbv = db.view();
      const TensorView* dxp = mask & 1 ? &dxv : nullptr;
      const TensorView* dwp = mask & 2 ? &dwv : nullptr;
      const TensorView* dbp = mask & 4 ? &dbv : nullptr;
      auto call = [&] {
        if (plan == nullptr)
          return kf::fused_linear_rowsum_backward(dy.view(), x.view(), ws.view(), dxp, dwp, dbp, work.p, work.bytes,
                                                  stream_);
        const TensorView dyv = dy.view(), xv = x.view(), wsv = ws.view();
        kf::FlrsCall c;
        c.name = "fused_linear_rowsum_backward";
        c.backward = true;
        c.dy = &dyv, c.x = &xv, c.w_sum = &wsv, c.dx = dxp, c.dweight = dwp, c.dbias = dbp;
        return kf::launch_with_plan(*plan, c, work.p, work.bytes, stream_);
      };
      ASSERT_TRUE(finish(call()));
      const HostTensor gx = dx.download(), gw = dw.download(), gb = db.download();
      if (mask & 1) {
        EXPECT_TRUE(flrs_close("dx", gx, want_dx, tolerance(t), {}));
      }
      if (mask & 2) {
        EXPECT_TRUE(flrs_close("dweight", gw, want_dw, tolerance(t), dw_mag));
      }
      if (mask & 4) {
        EXPECT_TRUE(flrs_close("dbias", gb, want_db, tolerance(t), db_mag));
      }
      // a gradient not asked for is not written
      if (!(mask & 1) && h.T * h.K > 0) {
        EXPECT_TRUE(std::isnan(gx.get(0))) << "dx written although not asked";
      }
      if (!(mask & 2) && h.O * h.K > 0) {
        EXPECT_TRUE(std::isnan(gw.get(0))) << "dweight written although not asked";
      }
      if (!(mask & 4) && h.O > 0) {
        EXPECT_TRUE(std::isnan(gb.get(0))) << "dbias written although not asked";
      }
      EXPECT_TRUE(dx.check_untouched("dx"));
      EXPECT_TRUE(dw.check_untouched("dweight"));
      EXPECT_TRUE(db.check_untouched("dbias"));
      EXPECT_TRUE(bit_equal("x is not written", x.download(), h.x));
      EXPECT_TRUE(bit_equal("dy is not written", dy.download(), h.dy));
      dx.poison(), dw.poison(), db.poison(), work.poison();
      ASSERT_TRUE(finish(call()));
      if (mask & 1) {
        EXPECT_TRUE(bit_equal("dx (second run)", dx.download(), gx));
      }
      if (mask & 2) {
        EXPECT_TRUE(bit_equal("dweight (second run)", dw.download(), gw));
      }
      if (mask & 4) {
        EXPECT_TRUE(bit_equal("dbias (second run)", db.download(), gb));
      }
    }
  }
  void set_up(DType t) {
    if (gpu_count() == 0) return;
    if (t == DType::kBFloat16 && gpu_capability() < 80) return;
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  }
  void tear_down() {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
};

class FlrsGpu : public ::testing::TestWithParam<Case>, public FlrsGpuBase {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (dtype() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    set_up(dtype());
    ASSERT_NE(stream_, nullptr);
  }
  void TearDown() override { tear_down(); }
  DType dtype() const { return std::get<0>(GetParam()); }
  const Shape& shape() const { return std::get<1>(GetParam()); }
  LayoutKind layout() const { return std::get<2>(GetParam()); }
};

TEST_P(FlrsGpu, Forward) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    Rng rng(seed(bias ? "fwd bias" : "fwd"));
    const FlrsHost h = flrs_random(dtype(), shape().T, shape().K, shape().O, bias, rng);
    check_forward(h, layout(), nullptr);
  }
}

TEST_P(FlrsGpu, Backward) {
  Rng rng(seed("bwd"));
  const FlrsHost h = flrs_random(dtype(), shape().T, shape().K, shape().O, false, rng);
  check_backward(h, layout(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlrsGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned,
                                                              LayoutKind::kMixed)));

// Every candidate plan (each access width, planned and single row chunk) of each shape, forward and
// backward, through launch_with_plan.
class FlrsGpuAllPlans : public ::testing::TestWithParam<std::tuple<DType, Shape, LayoutKind>>, public FlrsGpuBase {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (std::get<0>(GetParam()) == DType::kBFloat16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80+";
    set_up(std::get<0>(GetParam()));
    ASSERT_NE(stream_, nullptr);
  }
  void TearDown() override { tear_down(); }
};

TEST_P(FlrsGpuAllPlans, EveryCandidate) {
  const DType t = std::get<0>(GetParam());
  const Shape s = std::get<1>(GetParam());
  const LayoutKind l = std::get<2>(GetParam());
  Rng rng(seed("plans"));
  const FlrsHost h = flrs_random(t, s.T, s.K, s.O, true, rng);
  // the candidates of the forward and the backward of this shape and layout
  DeviceTensor x(t, {s.T, s.K}, layout_of(l, kX)), w(t, {s.O, s.K}, layout_of(l, kW)), b(t, {s.O}, layout_of(l, kB));
  VecDev y(t, s.T, layout_of(l, kY)), dy(t, s.T, layout_of(l, kDy));
  DeviceTensor ws(DType::kFloat32, {s.K}, layout_of(l, kWs)), dx(t, {s.T, s.K}, layout_of(l, kDx));
  DeviceTensor dw(t, {s.O, s.K}, layout_of(l, kDw));
  const TensorView xv = x.view(), wv = w.view(), bv = b.view(), yv = y.view(), dyv = dy.view(), wsv = ws.view();
  const TensorView dxv = dx.view(), dwv = dw.view(), dbv = b.view();
  kf::FlrsCall fc;
  fc.name = "fused_linear_rowsum";
  fc.x = &xv, fc.weight = &wv, fc.bias = &bv, fc.y = &yv, fc.w_sum = &wsv;
  kf::FlrsCall bc;
  bc.name = "fused_linear_rowsum_backward";
  bc.backward = true;
  bc.dy = &dyv, bc.x = &xv, bc.w_sum = &wsv, bc.dx = &dxv, bc.dweight = &dwv, bc.dbias = &dbv;
  std::vector<kf::FlrsPlan> fwd, bwd;
  KF_ASSERT_OK(kf::flrs_candidate_plans(fc, &fwd));
  KF_ASSERT_OK(kf::flrs_candidate_plans(bc, &bwd));
  ASSERT_FALSE(fwd.empty());
  ASSERT_FALSE(bwd.empty());
  for (const kf::FlrsPlan& p : fwd) {
    SCOPED_TRACE(kf::to_string(p));
    check_forward(h, l, &p);
  }
  for (const kf::FlrsPlan& p : bwd) {
    SCOPED_TRACE(kf::to_string(p));
    check_backward(h, l, &p);
  }
}

// The same data in aligned rows, in rows of an odd stride (every row at another alignment) and in rows
// one element off a 16-byte boundary: the shifted loads give each thread the columns of an aligned
// row, so y, w_sum, dx, dweight and dbias are bit-identical (not just close) across the layouts.
class FlrsGpuRowAlignment : public ::testing::TestWithParam<std::tuple<DType, Shape>>, public FlrsGpuBase {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (std::get<0>(GetParam()) == DType::kBFloat16 && gpu_capability() < 80) GTEST_SKIP() << "bfloat16 needs sm_80+";
    set_up(std::get<0>(GetParam()));
    ASSERT_NE(stream_, nullptr);
  }
  void TearDown() override { tear_down(); }
  // y, w_sum, dx, dweight, dbias of one forward and one backward with rows (x, weight, dx, dweight)
  // laid out as `rows`; w_sum and the vectors contiguous and aligned.
  std::vector<HostTensor> run(const FlrsHost& h, Layout rows) {
    const DType t = h.x.dtype;
    DeviceTensor x = to_device(h.x, rows), w = to_device(h.w, rows), b = to_device(h.b, {});
    VecDev y(t, h.T, {}), dy(t, h.T, {});
    dy.upload(h.dy);
    DeviceTensor ws(DType::kFloat32, {h.K}, {}), dx(t, {h.T, h.K}, rows), dw(t, {h.O, h.K}, rows), db(t, {h.O}, {});
    Workspace work(kf::fused_linear_rowsum_workspace_size(h.T, h.K, h.O));
    const TensorView bv = b.view(), dxv = dx.view(), dwv = dw.view(), dbv = db.view();
    EXPECT_TRUE(
        finish(kf::fused_linear_rowsum(x.view(), w.view(), &bv, y.view(), ws.view(), work.p, work.bytes, stream_)));
    EXPECT_TRUE(finish(kf::fused_linear_rowsum_backward(dy.view(), x.view(), ws.view(), &dxv, &dwv, &dbv, work.p,
                                                        work.bytes, stream_)));
    return {y.download(), ws.download(), dx.download(), dw.download(), db.download()};
  }
};

TEST_P(FlrsGpuRowAlignment, SameBits) {
  const DType t = std::get<0>(GetParam());
  const Shape s = std::get<1>(GetParam());
  Rng rng(seed("align"));
  const FlrsHost h = flrs_random(t, s.T, s.K, s.O, true, rng);
  const std::vector<HostTensor> want = run(h, {});
  // the aligned run is right (against the reference), then every layout gives its bits
  HostTensor want_y, want_ws;
  ref_forward(h, &want_y, &want_ws);
  EXPECT_TRUE(flrs_close("y", want[0], want_y, tolerance(t), flrs_y_mag(h)));
  const char* names[] = {"y", "w_sum", "dx", "dweight", "dbias"};
  for (Layout rows : {Layout{3, 0}, Layout{0, 1}, Layout{5, 3}}) {
    SCOPED_TRACE("row_pad " + std::to_string(rows.row_pad) + " offset " + std::to_string(rows.offset));
    const std::vector<HostTensor> got = run(h, rows);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bit_equal(names[i], got[i], want[i]));
  }
}

const Shape kAlignShapes[] = {{4097, 1023, 513}, {7, 127, 5}, {3, 4096, 300}, {33, 520, 64}, {1, 9, 2}, {2, 5, 3}};
INSTANTIATE_TEST_SUITE_P(Shapes, FlrsGpuRowAlignment,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(kAlignShapes)));

const Shape kPlanShapes[] = {{7, 127, 5}, {1100, 256, 17}, {3, 4096, 300}, {2, 64, 4100}};
INSTANTIATE_TEST_SUITE_P(Shapes, FlrsGpuAllPlans,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16),
                                            ::testing::ValuesIn(kPlanShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kUnaligned)));

}  // namespace
