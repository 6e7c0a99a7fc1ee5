// Shared by the cross-entropy GPU tests (test_cross_entropy.cpp, test_cross_entropy_special.cpp):
// the tolerance table, the cases (shapes, layouts, options), device helpers, comparisons and the
// fixture base. Everything here has internal linkage: each test file gets its own copy.
#pragma once

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

// Logits and (out-of-place) dlogits layouts differ in padding / offset, so a kernel that used one's
// row stride or alignment for the other would fail.
inline Layout logits_layout(LayoutKind l) {
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
inline Layout dlogits_layout(LayoutKind l) {
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
inline int64_t vector_offset(LayoutKind l) { return l == LayoutKind::kUnaligned || l == LayoutKind::kMixed ? 1 : 0; }
// target and (for none) dloss take any stride.
inline int64_t vector_stride(LayoutKind l) {
  return l == LayoutKind::kRowPadded ? 2 : l == LayoutKind::kOddStride ? 3 : 1;
}

struct Opt {
  const char* name;
  double eps = 0, zl = 0, cap = 0;
  Reduction red = Reduction::kMean;
  DType target = I64;
  int64_t ignore = -100;
  double sigma = 3.0;  // logits ~ N(0, sigma)
  // A vocabulary-parallel shard: the logits are classes [before, before + V) of before + V + after.
  int64_t before = 0, after = 0;
  bool shard() const { return before != 0 || after != 0; }
  CrossEntropyOptions opts(int64_t vocab) const {
    CrossEntropyOptions o;
    o.ignore_index = ignore;
    o.label_smoothing = eps;
    o.z_loss_scale = zl;
    o.softcap = cap;
    o.reduction = red;
    if (shard()) o.class_start = before, o.num_classes = before + vocab + after;
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
Opt make_shard_opt(const char* name, Opt o, int64_t before, int64_t after) {
  o.name = name;
  o.before = before, o.after = after;
  return o;
}
// Vocabulary-parallel shards: a middle shard (targets in it, before it and after it), the first and
// the last shard of their vocabularies.
const Opt kShardOpts[] = {
    make_shard_opt("shard_all_none", kOpts[8], 37, 1000),
    make_shard_opt("shard_first_smooth", kOpts[2], 0, 211),
    make_shard_opt("shard_last_softcap_sum", make_opt("", 0, 1e-4, 30, Reduction::kSum), 5, 0),
};

using Case = std::tuple<DType, Shape, LayoutKind, Opt>;
inline void PrintTo(const Shape& s, std::ostream* os) { *os << s.rows << "x" << s.vocab; }
inline void PrintTo(const Opt& o, std::ostream* os) { *os << o.name; }

inline const char* dtype_tag(DType t) { return t == F32 ? "fp32" : t == DType::kFloat16 ? "fp16" : "bf16"; }

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
  // Targets in [0, classes), with the shard's [lo, hi) ends (the whole range by default), class 0 and
  // the last class among them, and every fifth row ignored; half of a shard's rows target it.
  static HostTensor make_targets(DType t, int64_t rows, int64_t classes, int64_t ignore, Rng& rng, int64_t lo = 0,
                                 int64_t hi = -1) {
    if (hi < 0) hi = classes;
    HostTensor h(t, {rows});
    for (int64_t i = 0; i < rows; ++i) {
      const bool in = i % 2 == 0;
      const double a = in ? double(lo) : 0.0, b = in ? double(hi) : double(classes);
      int64_t c = static_cast<int64_t>(rng.uniform(a, b));
      if (c >= int64_t(b)) c = int64_t(b) - 1;
      if (i == 0) c = hi - 1;
      if (i == 1) c = lo;
      if (i == 2 && rows > 3) c = 0;
      if (i == 4 && rows > 5) c = classes - 1;
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

#define KF_CE_DTYPES ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16)

}  // namespace
