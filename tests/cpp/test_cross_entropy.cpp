// The CUDA cross-entropy kernels against the float64 reference (kernelforge::ref), on the GPU.
//
// Every case runs the forward, then the backward twice (out of place, and in place: dlogits ==
// logits), on fresh random logits (normal, sigma 3, or 20 with the softcap, so the softmax is far
// from flat; never zeros) with targets that include the last class, class 0 and ignore_index rows.
// Every output is poisoned with NaN (0xFF bytes) before the run and every element is compared with
// the one tolerance table per dtype below; NaN never passes (an expected NaN is checked against a
// finite sentinel written before the run, so a missing write cannot pass either). Inputs must come
// back unchanged (the logits too, except after the in-place backward), and bytes outside each view
// (row padding, base offset, strided-vector gaps, a guard after the last row) must stay untouched.
//
// Shapes (T x V): one class, odd and prime vocabularies (a scalar head, then 16-byte vectors and a
// partial last one, where logits and dlogits share their misalignment; one element per access else),
// the forward's segment boundary (16384 bf16/fp16 or 8192 fp32 logits per CTA: 3 x 16383, 3 x 16385),
// the common LLM vocabularies (32000, 128256, 262144), no rows, and many rows (two finalize blocks);
// layouts contiguous, row-padded, odd row stride, unaligned base pointer (one element past 16 B),
// and mixed (aligned logits, unaligned gradient). Options: label smoothing, z-loss, softcap, int32
// targets, an ignore_index inside the vocabulary, each reduction (mean / sum / none, with a strided
// dloss for none). Out-of-range targets give NaN rows; every row ignored gives a NaN mean, valid 0
// and a zero gradient. Tests skip without a GPU, and fail instead when KF_REQUIRE_GPU=1.
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace {

using namespace kftest;
namespace kf = kernelforge;
namespace ref = kernelforge::ref;
using kernelforge::CrossEntropyOptions;
using kernelforge::Reduction;

constexpr DType F32 = DType::kFloat32;
constexpr DType I64 = DType::kInt64;
constexpr DType I32 = DType::kInt32;
constexpr double kSentinel = 12345.0;  // written where NaN is expected: a NaN then proves the write

// ---- tolerances -----------------------------------------------------------------------------------
// row_loss and lse are float32 results of float32 math on logits that are exactly representable,
// so they are compared relative to the magnitudes that enter them: lse within rtol * (1 + |lse|),
// row_loss within rtol * (1 + |lse| + |row_loss|) (row_loss = lse - z_t - ...: its error is lse's
// error plus a rounding of the difference). Float32 alone (ex2.approx/lg2.approx, tanhf of the
// softcap: ~1e-6 relative at |lse| ~ 40) stays well inside 1e-5; the 16-bit dtypes get 2e-5 (more
// elements per thread in a segment). The loss sums those rows in float32: its tolerance is the sum
// of the row tolerances, divided like the loss.
//
// The gradient is G * (p_j (1 + 2 z lse) - ...) computed in float32 and rounded once to the dtype,
// the reference the float64 value rounded once. The natural scale of a row is
// s_i = max(|G_i|, max_j |want_ij|): every element is G_i times a number of magnitude <= ~1, and
// float32 gives p_j to ~1e-5 relative at worst (the lse rounding times |lse| ~ 40 with the softcap,
// tanhf, ex2.approx), so an absolute error of that size relative to s_i is expected even where the
// exact gradient is tiny (a confident row's 1 - p_t). The 16-bit dtypes may then round the two
// values to neighbours: one ulp is <= 2^-10 |want| (fp16) or 2^-7 |want| (bf16), hence
//   |got - want| <= g * (|want| + s_i),   g = 1e-5 (fp32), 1e-3 (fp16), 8e-3 (bf16).
// An ignored row has G_i = 0 and so must be exactly 0.
struct CeTol {
  double row;   // row_loss, lse (and the loss)
  double grad;  // dlogits
};
CeTol ce_tolerance(DType t) {
  switch (t) {
    case DType::kFloat32:
      return {1e-5, 1e-5};
    case DType::kFloat16:
      return {2e-5, 1e-3};
    case DType::kBFloat16:
      return {2e-5, 8e-3};
    default:
      return {0, 0};
  }
}

// ---- cases ------------------------------------------------------------------------------------------
struct Shape {
  int64_t rows, vocab;
};
const Shape kShapes[] = {{1, 1},     {1, 7},      {7, 13},     {5, 4099}, {3, 16383}, {3, 16385},
                         {4, 32000}, {2, 128256}, {1, 262144}, {0, 100},  {257, 130}, {3, 50257}};

enum class LayoutKind { kContiguous, kRowPadded, kOddStride, kUnaligned, kMixed };
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
    case LayoutKind::kMixed:
      return "mixed";
  }
  return "?";
}
// Logits and (out-of-place) dlogits layouts differ in padding / offset, so a kernel that used one's
// row stride or alignment for the other would fail.
Layout logits_layout(LayoutKind l) {
  switch (l) {
    case LayoutKind::kContiguous:
    case LayoutKind::kMixed:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {64, 0};  // rows stay 16-byte aligned when V allows
    case LayoutKind::kOddStride:
      return {3, 0};  // every row starts at a different alignment
    case LayoutKind::kUnaligned:
      return {0, 1};  // base pointer one element past 16 B
  }
  return {};
}
Layout dlogits_layout(LayoutKind l) {
  switch (l) {
    case LayoutKind::kContiguous:
      return {0, 0};
    case LayoutKind::kRowPadded:
      return {16, 0};
    case LayoutKind::kOddStride:
      return {5, 0};
    case LayoutKind::kUnaligned:
      return {0, 2};
    case LayoutKind::kMixed:
      return {0, 1};  // aligned logits, unaligned gradient: the backward must not take the vector path
  }
  return {};
}
// float32 vectors (row_loss, lse) are contiguous by contract; they move their base by one element.
int64_t vector_offset(LayoutKind l) { return l == LayoutKind::kUnaligned || l == LayoutKind::kMixed ? 1 : 0; }
// target and (for none) dloss take any stride.
int64_t vector_stride(LayoutKind l) { return l == LayoutKind::kRowPadded ? 2 : l == LayoutKind::kOddStride ? 3 : 1; }

struct Opt {
  const char* name;
  double eps = 0, zl = 0, cap = 0;
  Reduction red = Reduction::kMean;
  DType target = I64;
  int64_t ignore = -100;
  double sigma = 3.0;  // logits ~ N(0, sigma)
  CrossEntropyOptions opts() const {
    CrossEntropyOptions o;
    o.ignore_index = ignore;
    o.label_smoothing = eps;
    o.z_loss_scale = zl;
    o.softcap = cap;
    o.reduction = red;
    return o;
  }
};
Opt make_opt(const char* name, double eps, double zl, double cap, Reduction red, DType target = I64,
             int64_t ignore = -100) {
  Opt o;
  o.name = name;
  o.eps = eps, o.zl = zl, o.cap = cap, o.red = red, o.target = target, o.ignore = ignore;
  o.sigma = cap > 0 ? 20.0 : 3.0;  // softcap 30: logits well into the tanh's curve
  return o;
}
const Opt kMeanOpt = make_opt("mean", 0, 0, 0, Reduction::kMean);
const Opt kOpts[] = {
    make_opt("sum", 0, 0, 0, Reduction::kSum),
    make_opt("none", 0, 0, 0, Reduction::kNone),
    make_opt("smooth", 0.1, 0, 0, Reduction::kMean),
    make_opt("zloss_sum", 0, 1e-4, 0, Reduction::kSum),
    make_opt("softcap", 0, 0, 30, Reduction::kMean),
    make_opt("softcap_none", 0, 0, 30, Reduction::kNone),
    make_opt("all_mean", 0.1, 1e-4, 30, Reduction::kMean),
    make_opt("all_sum", 0.1, 1e-4, 30, Reduction::kSum),
    make_opt("all_none", 0.1, 1e-4, 30, Reduction::kNone),
    make_opt("int32", 0, 0, 0, Reduction::kMean, I32),
    make_opt("int32_smooth_none", 0.1, 0, 0, Reduction::kNone, I32),
    make_opt("ignore1_sum", 0, 1e-4, 0, Reduction::kSum, I64, 1),  // ignore_index inside [0, V)
};
const Opt kBigOpts[] = {kOpts[6], kOpts[5], kOpts[3]};  // all_mean, softcap_none, zloss_sum

using Case = std::tuple<DType, Shape, LayoutKind, Opt>;
void PrintTo(const Shape& s, std::ostream* os) { *os << s.rows << "x" << s.vocab; }
void PrintTo(LayoutKind l, std::ostream* os) { *os << layout_name(l); }
void PrintTo(const Opt& o, std::ostream* os) { *os << o.name; }

const char* dtype_tag(DType t) { return t == F32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16"; }

// ---- device helpers -----------------------------------------------------------------------------------
DeviceTensor to_device(const HostTensor& h, Layout l) {
  DeviceTensor d(h.dtype, h.shape, l);
  d.upload(h);
  return d;
}

// A [n] vector with element stride `stride` and a base offset: a [n, 1] DeviceTensor whose rows are
// `stride` elements apart (the gaps are checked like row padding).
struct DevVec {
  DeviceTensor d;
  int64_t n = 0, stride = 1;
  DevVec(DType t, int64_t n_, int64_t stride_ = 1, int64_t offset = 0)
      : d(t, {n_, 1}, Layout{stride_ - 1, offset}), n(n_), stride(stride_) {}
  TensorView view() const {
    TensorView v = d.view();
    v.ndim = 1;
    v.shape[0] = n;
    v.strides[0] = stride;
    v.shape[1] = v.strides[1] = 0;
    return v;
  }
  void upload(const HostTensor& h) {
    HostTensor c = h;
    c.shape = {n, 1};
    d.upload(c);
  }
  HostTensor download() const {
    HostTensor h = d.download();
    h.shape = {n};
    return h;
  }
};

HostTensor filled(DType t, std::vector<int64_t> shape, double v) {
  HostTensor h(t, std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, v);
  return h;
}

// ---- comparisons --------------------------------------------------------------------------------------
// Per-row float32 outputs: rows in `nan_rows` must be NaN, the others within tol * scale[i].
::testing::AssertionResult rows_close(const char* what, const HostTensor& got, const HostTensor& want,
                                      const std::vector<double>& scale, double tol,
                                      const std::set<int64_t>& nan_rows = {}) {
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const bool fail = nan_rows.count(i) ? !std::isnan(g) : !(std::isfinite(g) && std::fabs(g - w) <= tol * scale[i]);
    if (!fail) continue;
    if (bad < 8) first << "\n    row " << i << ": got " << g << " want " << (nan_rows.count(i) ? NAN : w);
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.numel()
                                       << " rows differ from the reference (rtol " << tol << "); first:" << first.str();
}

// dlogits [T, V]: rows in `nan_rows` all NaN; otherwise |got - want| <= g (|want| + max(|G_i|, max_j |want_ij|)).
::testing::AssertionResult grad_close(const char* what, const HostTensor& got, const HostTensor& want,
                                      const std::vector<double>& G, double g, const std::set<int64_t>& nan_rows = {}) {
  const int64_t rows = got.shape[0], v = got.shape[1];
  int64_t bad = 0;
  double worst = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < rows; ++i) {
    double s = std::fabs(G[i]);
    for (int64_t j = 0; j < v; ++j) s = std::fmax(s, std::fabs(want.get(i * v + j)));
    for (int64_t j = 0; j < v; ++j) {
      const double a = got.get(i * v + j), w = want.get(i * v + j);
      bool fail;
      if (nan_rows.count(i)) {
        fail = !std::isnan(a);
      } else {
        const double err = std::fabs(a - w);
        fail = !std::isfinite(a) || !(err <= g * (std::fabs(w) + s));
        if (fail && std::isfinite(a)) worst = std::fmax(worst, err / (std::fabs(w) + s));
      }
      if (!fail) continue;
      if (bad < 8) first << "\n    [" << i << ", " << j << "] got " << a << " want " << w << " (row scale " << s << ")";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << dtype_name(got.dtype) << " [" << rows << ", " << v
                                       << "]: " << bad << " elements differ from the reference (g " << g
                                       << ", worst relative error " << worst << "); first:" << first.str();
}

bool all_poison(const HostTensor& h) {
  const size_t n = static_cast<size_t>(h.numel()) * kernelforge::dtype_size(h.dtype);
  for (size_t b = 0; b < n; ++b)
    if (h.bytes[b] != 0xFF) return false;
  return true;
}

// ---- the fixture ----------------------------------------------------------------------------------------
class CeGpuBase {
 protected:
  cudaStream_t stream_ = nullptr;

  ::testing::AssertionResult finish(const Status& st) {
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return ::testing::AssertionFailure() << "kernel failed: " << cudaGetErrorString(e);
    return ::testing::AssertionSuccess();
  }
  static uint64_t seed(const std::string& what) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return hash_str(what + info->test_suite_name() + "." + info->name());
  }
  static HostTensor random_logits(DType t, int64_t rows, int64_t vocab, double sigma, Rng& rng) {
    HostTensor h(t, {rows, vocab});
    for (int64_t i = 0; i < h.numel(); ++i) {
      double v = rng.normal(sigma);
      if (v == 0.0) v = sigma * 1e-3;  // never zeros
      h.set(i, v);
    }
    return h;
  }
  // Row 0 targets the last class, row 1 class 0, every 5th row from row 3 is ignored, the rest are
  // random classes.
  static HostTensor make_targets(DType t, int64_t rows, int64_t vocab, int64_t ignore, Rng& rng) {
    HostTensor h(t, {rows});
    for (int64_t i = 0; i < rows; ++i) {
      int64_t c = static_cast<int64_t>(rng.uniform(0.0, static_cast<double>(vocab)));
      if (c >= vocab) c = vocab - 1;
      if (i == 0) c = vocab - 1;
      if (i == 1) c = 0;
      if (i % 5 == 3) c = ignore;
      h.set(i, static_cast<double>(c));
    }
    return h;
  }
  // The backward's per-row scale G_i (0 for an ignored row).
  static std::vector<double> row_g(const HostTensor& target, int64_t ignore, Reduction red, const HostTensor& dloss,
                                   double valid) {
    std::vector<double> g(static_cast<size_t>(target.numel()));
    for (int64_t i = 0; i < target.numel(); ++i) {
      const double d = red == Reduction::kNone ? dloss.get(i) : dloss.get(0);
      g[i] = static_cast<int64_t>(target.get(i)) == ignore ? 0.0 : red == Reduction::kMean ? d / valid : d;
    }
    return g;
  }
};

class CeGpu : public CeGpuBase, public ::testing::TestWithParam<Case> {
 protected:
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
  int64_t T() const { return std::get<1>(GetParam()).rows; }
  int64_t V() const { return std::get<1>(GetParam()).vocab; }
  LayoutKind layout() const { return std::get<2>(GetParam()); }
  const Opt& opt() const { return std::get<3>(GetParam()); }
};

TEST_P(CeGpu, ForwardBackward) {
  const DType dt = dtype();
  const int64_t T = this->T(), V = this->V();
  const LayoutKind lk = layout();
  const Opt& op = opt();
  const CrossEntropyOptions o = op.opts();
  const CeTol tol = ce_tolerance(dt);
  Rng rng(seed("fwd+bwd"));
  const HostTensor x = random_logits(dt, T, V, op.sigma, rng);
  const HostTensor tgt = make_targets(op.target, T, V, op.ignore, rng);

  // reference forward
  HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
  KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
  std::vector<double> lse_scale(static_cast<size_t>(T)), rl_scale(static_cast<size_t>(T));
  double loss_scale = 0;
  for (int64_t i = 0; i < T; ++i) {
    lse_scale[i] = 1 + std::fabs(lse.get(i));
    rl_scale[i] = 1 + std::fabs(lse.get(i)) + std::fabs(rl.get(i));
    if (static_cast<int64_t>(tgt.get(i)) != op.ignore) loss_scale += rl_scale[i];  // the loss sums valid rows
  }
  if (op.red == Reduction::kMean) loss_scale /= valid.get(0);

  // device forward: every output poisoned (a sentinel where NaN is expected)
  const int64_t vs = vector_stride(lk), voff = vector_offset(lk);
  DeviceTensor d_x = to_device(x, logits_layout(lk));
  DevVec d_t(op.target, T, vs, voff);
  d_t.upload(tgt);
  DeviceTensor d_rl(F32, {T}, {0, voff}), d_lse(F32, {T}, {0, voff}), d_loss(F32, {}), d_valid(F32, {});
  const bool nan_loss = op.red != Reduction::kNone && std::isnan(loss.get(0));
  if (nan_loss) d_loss.upload(filled(F32, {}, kSentinel));
  const size_t ws_bytes = kf::cross_entropy_workspace_size(T, V);
  DeviceTensor ws(F32, {static_cast<int64_t>((ws_bytes + 3) / 4)});
  ASSERT_TRUE(d_x.ok() && ws.ok());
  ASSERT_TRUE(finish(kf::cross_entropy(d_x.view(), d_t.view(), o, d_rl.view(), d_lse.view(), d_loss.view(),
                                       d_valid.view(), ws.view().data, ws_bytes, stream_)));
  const HostTensor g_lse = d_lse.download(), g_valid = d_valid.download();
  EXPECT_TRUE(rows_close("lse", g_lse, lse, lse_scale, tol.row));
  EXPECT_TRUE(rows_close("row_loss", d_rl.download(), rl, rl_scale, tol.row));
  EXPECT_EQ(g_valid.get(0), valid.get(0)) << "valid";
  const HostTensor g_loss = d_loss.download();
  if (op.red == Reduction::kNone) {
    EXPECT_TRUE(all_poison(g_loss)) << "loss is not written for Reduction::kNone, got " << g_loss.get(0);
  } else if (nan_loss) {
    EXPECT_TRUE(std::isnan(g_loss.get(0))) << "mean over no valid rows is NaN, got " << g_loss.get(0);
  } else {
    EXPECT_TRUE(std::isfinite(g_loss.get(0)) &&
                std::fabs(g_loss.get(0) - loss.get(0)) <= tol.row * (loss_scale + 1e-30))
        << "loss: got " << g_loss.get(0) << " want " << loss.get(0) << " (tolerance " << tol.row * loss_scale << ")";
  }
  EXPECT_TRUE(d_rl.check_untouched("row_loss"));
  EXPECT_TRUE(d_lse.check_untouched("lse"));
  EXPECT_TRUE(d_loss.check_untouched("loss"));
  EXPECT_TRUE(d_valid.check_untouched("valid"));
  EXPECT_TRUE(d_x.check_untouched("logits"));
  EXPECT_TRUE(d_t.d.check_untouched("target"));
  EXPECT_TRUE(bit_equal("logits are not written by the forward", d_x.download(), x));
  EXPECT_TRUE(bit_equal("target is not written", d_t.download(), tgt));

  // backward: dloss random (scalar, or [T] strided for none); the GPU's lse and valid feed both
  HostTensor dloss(F32, op.red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{});
  for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, rng.uniform(0.5, 2.0) * (rng.uniform(0, 1) < 0.3 ? -1 : 1));
  HostTensor want(dt, {T, V});
  KF_ASSERT_OK(
      ref::cross_entropy_backward(dloss.view(), x.view(), tgt.view(), lse.view(), g_valid.view(), o, want.view()));
  const std::vector<double> G = row_g(tgt, op.ignore, op.red, dloss, g_valid.get(0));
  DevVec d_dl(F32, dloss.numel(), op.red == Reduction::kNone ? vs : 1);
  d_dl.upload(dloss);
  TensorView dl_view = d_dl.view();
  if (op.red != Reduction::kNone) dl_view.ndim = 0;  // [1] -> [] (the contract's shape for mean / sum)

  DeviceTensor d_dx(dt, {T, V}, dlogits_layout(lk));
  ASSERT_TRUE(finish(kf::cross_entropy_backward(dl_view, d_x.view(), d_t.view(), d_lse.view(), d_valid.view(), o,
                                                d_dx.view(), stream_)));
  EXPECT_TRUE(grad_close("dlogits", d_dx.download(), want, G, tol.grad));
  EXPECT_TRUE(d_dx.check_untouched("dlogits"));
  EXPECT_TRUE(bit_equal("logits are not written by the backward", d_x.download(), x));
  EXPECT_TRUE(bit_equal("target is not written by the backward", d_t.download(), tgt));
  EXPECT_TRUE(bit_equal("lse is not written by the backward", d_lse.download(), g_lse));
  EXPECT_TRUE(bit_equal("valid is not written by the backward", d_valid.download(), g_valid));
  HostTensor g_dl = d_dl.download();
  g_dl.shape = dloss.shape;
  EXPECT_TRUE(bit_equal("dloss is not written", g_dl, dloss));
  EXPECT_TRUE(d_dl.d.check_untouched("dloss"));

  // in place: the gradient overwrites a fresh copy of the logits
  DeviceTensor d_x2 = to_device(x, logits_layout(lk));
  ASSERT_TRUE(finish(kf::cross_entropy_backward(dl_view, d_x2.view(), d_t.view(), d_lse.view(), d_valid.view(), o,
                                                d_x2.view(), stream_)));
  EXPECT_TRUE(grad_close("dlogits in place", d_x2.download(), want, G, tol.grad));
  EXPECT_TRUE(d_x2.check_untouched("dlogits in place"));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Shape s = std::get<1>(info.param);
  return std::string(dtype_tag(std::get<0>(info.param))) + "_" + std::to_string(s.rows) + "x" +
         std::to_string(s.vocab) + "_" + layout_name(std::get<2>(info.param)) + "_" + std::get<3>(info.param).name;
}

#define KF_CE_DTYPES ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16)

// Every shape and layout, mean reduction.
INSTANTIATE_TEST_SUITE_P(Shapes, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kRowPadded,
                                                              LayoutKind::kOddStride, LayoutKind::kUnaligned,
                                                              LayoutKind::kMixed),
                                            ::testing::Values(kMeanOpt)),
                         case_name);

// Every option set on small and boundary shapes.
const Shape kOptShapes[] = {{7, 13}, {5, 4099}, {3, 16385}, {257, 130}};
INSTANTIATE_TEST_SUITE_P(Options, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kOptShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kOddStride,
                                                              LayoutKind::kUnaligned),
                                            ::testing::ValuesIn(kOpts)),
                         case_name);

// A few option sets on the large vocabularies (many segments per row).
const Shape kBigShapes[] = {{4, 32000}, {2, 128256}, {1, 262144}};
INSTANTIATE_TEST_SUITE_P(Big, CeGpu,
                         ::testing::Combine(KF_CE_DTYPES, ::testing::ValuesIn(kBigShapes),
                                            ::testing::Values(LayoutKind::kContiguous, LayoutKind::kUnaligned),
                                            ::testing::ValuesIn(kBigOpts)),
                         case_name);

// ---- special cases (per dtype) ----------------------------------------------------------------------
class CeGpuSpecial : public CeGpuBase, public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    KF_NEED_GPU();
    if (GetParam() == DType::kBFloat16 && gpu_capability() < 80)
      GTEST_SKIP() << "bfloat16 needs sm_80+, device is sm_" << gpu_capability();
    KF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  struct Fwd {
    DeviceTensor rl, lse, loss, valid, ws;
    size_t ws_bytes;
    Fwd(int64_t T, int64_t V)
        : rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {}), ws_bytes(kf::cross_entropy_workspace_size(T, V)) {
      ws = DeviceTensor(F32, {static_cast<int64_t>((ws_bytes + 3) / 4)});
    }
    Status run(const TensorView& x, const TensorView& t, const CrossEntropyOptions& o, cudaStream_t s) {
      return kf::cross_entropy(x, t, o, rl.view(), lse.view(), loss.view(), valid.view(), ws.view().data, ws_bytes, s);
    }
  };
};

// A target outside [0, V) that is not ignore_index: on the GPU that row's row_loss, lse and gradient
// row are NaN (the row counts as valid, so a mean or sum is NaN); the other rows are exact.
TEST_P(CeGpuSpecial, OutOfRangeTarget) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  for (int64_t V : {int64_t{7}, int64_t{4099}}) {
    for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      for (DType tdt : {I64, I32}) {
        SCOPED_TRACE("V " + std::to_string(V) + ", reduction " + std::to_string(static_cast<int>(red)) + ", " +
                     dtype_name(tdt));
        const int64_t T = 6;
        Rng rng(seed("oor" + std::to_string(V) + std::to_string(static_cast<int>(red)) + dtype_name(tdt)));
        const HostTensor x = random_logits(dt, T, V, 3.0, rng);
        HostTensor tgt(tdt, {T}), tgt_ok(tdt, {T});  // tgt_ok: the bad rows ignored (the reference's input)
        const std::vector<int64_t> tv = {V - 1, -100, V, 0, -1, 3};
        const std::set<int64_t> bad = {2, 4};
        for (int64_t i = 0; i < T; ++i) {
          tgt.set(i, static_cast<double>(tv[i]));
          tgt_ok.set(i, bad.count(i) ? -100.0 : static_cast<double>(tv[i]));
        }
        CrossEntropyOptions o;
        o.reduction = red;
        o.label_smoothing = 0.05;
        HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
        // the reference itself refuses the bad targets; it gets them ignored instead
        EXPECT_FALSE(
            ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()).ok());
        KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt_ok.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));

        DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
        Fwd f(T, V);
        f.rl.upload(filled(F32, {T}, kSentinel));  // a NaN row must be written, not left poisoned
        f.lse.upload(filled(F32, {T}, kSentinel));
        if (red != Reduction::kNone) f.loss.upload(filled(F32, {}, kSentinel));
        ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
        std::vector<double> lse_scale(T), rl_scale(T);
        for (int64_t i = 0; i < T; ++i) {
          lse_scale[i] = 1 + std::fabs(lse.get(i));
          rl_scale[i] = lse_scale[i] + std::fabs(rl.get(i));
        }
        const HostTensor g_valid = f.valid.download();
        EXPECT_TRUE(rows_close("lse", f.lse.download(), lse, lse_scale, tol.row, bad));
        EXPECT_TRUE(rows_close("row_loss", f.rl.download(), rl, rl_scale, tol.row, bad));
        EXPECT_EQ(g_valid.get(0), valid.get(0) + 2) << "the out-of-range rows count as valid";
        if (red != Reduction::kNone) {
          EXPECT_TRUE(std::isnan(f.loss.download().get(0))) << "the loss is NaN";
        }
        if (red == Reduction::kNone) {
          EXPECT_TRUE(all_poison(f.loss.download()));
        }

        // backward: out of place and in place; the reference (bad rows ignored) with the GPU's valid
        HostTensor dloss(F32, red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{});
        for (int64_t i = 0; i < dloss.numel(); ++i) dloss.set(i, rng.uniform(0.5, 2.0));
        HostTensor want(dt, {T, V});
        KF_ASSERT_OK(ref::cross_entropy_backward(dloss.view(), x.view(), tgt_ok.view(), lse.view(), g_valid.view(), o,
                                                 want.view()));
        const std::vector<double> G = row_g(tgt_ok, -100, red, dloss, g_valid.get(0));
        DeviceTensor d_dl = to_device(dloss, {});
        DeviceTensor d_dx = to_device(filled(dt, {T, V}, kSentinel), {});
        ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                      o, d_dx.view(), stream_)));
        EXPECT_TRUE(grad_close("dlogits", d_dx.download(), want, G, tol.grad, bad));
        ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                      o, d_x.view(), stream_)));
        EXPECT_TRUE(grad_close("dlogits in place", d_x.download(), want, G, tol.grad, bad));
      }
    }
  }
}

// Every row ignored: row_loss 0, lse still written, valid 0, the mean NaN (0 / 0), the sum 0, and a
// zero gradient (the mean's 0 / 0 never reaches it), in place too.
TEST_P(CeGpuSpecial, AllRowsIgnored) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (DType tdt : {I64, I32}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(red)) + ", " + dtype_name(tdt));
      const int64_t T = 5, V = 1000;
      Rng rng(seed("ignored" + std::to_string(static_cast<int>(red)) + dtype_name(tdt)));
      const HostTensor x = random_logits(dt, T, V, 3.0, rng);
      const HostTensor tgt = filled(tdt, {T}, -100);
      CrossEntropyOptions o;
      o.reduction = red;
      o.z_loss_scale = 1e-4;
      HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
      KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
      DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
      Fwd f(T, V);
      f.rl.upload(filled(F32, {T}, kSentinel));
      f.valid.upload(filled(F32, {}, kSentinel));
      if (red != Reduction::kNone) f.loss.upload(filled(F32, {}, kSentinel));
      ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
      const HostTensor g_rl = f.rl.download(), g_valid = f.valid.download(), g_loss = f.loss.download();
      for (int64_t i = 0; i < T; ++i) EXPECT_EQ(g_rl.get(i), 0.0) << "row " << i;
      std::vector<double> lse_scale(T);
      for (int64_t i = 0; i < T; ++i) lse_scale[i] = 1 + std::fabs(lse.get(i));
      EXPECT_TRUE(rows_close("lse", f.lse.download(), lse, lse_scale, tol.row));
      EXPECT_EQ(g_valid.get(0), 0.0);
      if (red == Reduction::kMean) {
        EXPECT_TRUE(std::isnan(g_loss.get(0))) << g_loss.get(0);
      }
      if (red == Reduction::kSum) {
        EXPECT_EQ(g_loss.get(0), 0.0);
      }
      if (red == Reduction::kNone) {
        EXPECT_TRUE(all_poison(g_loss));
      }

      HostTensor dloss = filled(F32, red == Reduction::kNone ? std::vector<int64_t>{T} : std::vector<int64_t>{}, 1.5);
      DeviceTensor d_dl = to_device(dloss, {});
      DeviceTensor d_dx(dt, {T, V});
      ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                    o, d_dx.view(), stream_)));
      const HostTensor zeros = filled(dt, {T, V}, 0.0);
      EXPECT_TRUE(bit_equal("dlogits (all zero)", d_dx.download(), zeros));
      ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), f.lse.view(), f.valid.view(),
                                                    o, d_x.view(), stream_)));
      EXPECT_TRUE(bit_equal("dlogits in place (all zero)", d_x.download(), zeros));
    }
  }
}

// The reduction is deterministic (fixed order, no atomics): two runs give identical bits, for the
// loss over two finalize blocks and over many segments, and the gradient too.
TEST_P(CeGpuSpecial, Deterministic) {
  const DType dt = GetParam();
  for (Shape s : {Shape{257, 130}, Shape{4, 32000}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.vocab));
    Rng rng(seed("det" + std::to_string(s.vocab)));
    const HostTensor x = random_logits(dt, s.rows, s.vocab, 3.0, rng);
    const HostTensor tgt = make_targets(I64, s.rows, s.vocab, -100, rng);
    CrossEntropyOptions o;
    o.label_smoothing = 0.1;
    DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
    Fwd a(s.rows, s.vocab), b(s.rows, s.vocab);
    ASSERT_TRUE(finish(a.run(d_x.view(), d_t.view(), o, stream_)));
    ASSERT_TRUE(finish(b.run(d_x.view(), d_t.view(), o, stream_)));
    EXPECT_TRUE(bit_equal("row_loss", a.rl.download(), b.rl.download()));
    EXPECT_TRUE(bit_equal("lse", a.lse.download(), b.lse.download()));
    EXPECT_TRUE(bit_equal("loss", a.loss.download(), b.loss.download()));
    DeviceTensor d_dl = to_device(filled(F32, {}, 1.0), {});
    DeviceTensor g1(dt, {s.rows, s.vocab}), g2(dt, {s.rows, s.vocab});
    ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), a.lse.view(), a.valid.view(), o,
                                                  g1.view(), stream_)));
    ASSERT_TRUE(finish(kf::cross_entropy_backward(d_dl.view(), d_x.view(), d_t.view(), a.lse.view(), a.valid.view(), o,
                                                  g2.view(), stream_)));
    EXPECT_TRUE(bit_equal("dlogits", g1.download(), g2.download()));
  }
}

// More rows than the one-block reduction has threads x finalize rows (512 x 256): its loop runs.
TEST_P(CeGpuSpecial, ManyRows) {
  const DType dt = GetParam();
  const CeTol tol = ce_tolerance(dt);
  const int64_t T = 140000, V = 3;
  Rng rng(seed("many"));
  const HostTensor x = random_logits(dt, T, V, 3.0, rng);
  const HostTensor tgt = make_targets(I32, T, V, -100, rng);
  CrossEntropyOptions o;
  HostTensor rl(F32, {T}), lse(F32, {T}), loss(F32, {}), valid(F32, {});
  KF_ASSERT_OK(ref::cross_entropy(x.view(), tgt.view(), o, rl.view(), lse.view(), loss.view(), valid.view()));
  DeviceTensor d_x = to_device(x, {}), d_t = to_device(tgt, {});
  Fwd f(T, V);
  ASSERT_TRUE(finish(f.run(d_x.view(), d_t.view(), o, stream_)));
  std::vector<double> rl_scale(T);
  double loss_scale = 0;
  for (int64_t i = 0; i < T; ++i) loss_scale += rl_scale[i] = 1 + std::fabs(lse.get(i)) + std::fabs(rl.get(i));
  EXPECT_TRUE(rows_close("row_loss", f.rl.download(), rl, rl_scale, tol.row));
  EXPECT_EQ(f.valid.download().get(0), valid.get(0));
  const double got = f.loss.download().get(0);
  EXPECT_NEAR(got, loss.get(0), tol.row * loss_scale / valid.get(0));
}

INSTANTIATE_TEST_SUITE_P(All, CeGpuSpecial, KF_CE_DTYPES, [](const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_tag(info.param));
});

}  // namespace
