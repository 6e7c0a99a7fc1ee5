// Test helpers: host tensors with random data, device tensors with a chosen row layout (row
// stride, base-pointer offset) that are poisoned with NaN and checked for writes outside the view,
// a comparison that visits every element, and the GPU-present / KF_REQUIRE_GPU policy.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "kernelforge/kernelforge.h"

namespace kernelforge {
// gtest prints test parameters with this (found by argument-dependent lookup)
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace kernelforge

namespace kftest {

using kernelforge::Device;
using kernelforge::DeviceType;
using kernelforge::DType;
using kernelforge::Status;
using kernelforge::TensorView;

// ---- float <-> 16-bit float conversions on the host (round to nearest even) ------------------
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a (quiet) NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal half (or zero)
    // value = abs_float; half subnormal unit = 2^-24. Round abs_float / 2^-24 to nearest even.
    const float scaled = bits_float(abs) * 16777216.0f;  // exact: scaling by a power of two
    const float r = std::nearbyint(scaled);              // default rounding mode: nearest even
    return sign | static_cast<uint16_t>(r);
  }
  // normal: rebias exponent (127 -> 15) and round the 23-bit mantissa to 10 bits
  uint32_t m = abs - 0x38000000u;  // exponent - 112
  m += 0xFFFu + ((m >> 13) & 1u);
  return sign | static_cast<uint16_t>(m >> 13);
}
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Rounds v to `t` the way the library does (double -> float -> 16-bit for the half types).
inline double round_to(DType t, double v) {
  switch (t) {
    case DType::kFloat64:
      return v;
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat16:
      return fp16_to_float(float_to_fp16(static_cast<float>(v)));
    case DType::kBFloat16:
      return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    default:
      return std::nan("");
  }
}

inline double load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt32:  // integer tensors (indices) hold exact integers as doubles
      return static_cast<double>(static_cast<const int32_t*>(base)[i]);
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    default:
      return std::nan("");
  }
}
inline void store(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kFloat64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_fp16(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    default:
      break;
  }
}

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

inline int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// ---- host tensors (contiguous) ---------------------------------------------------------------
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
    // poisoned like the device outputs: all-ones bytes are NaN in every float dtype
    bytes.assign(static_cast<size_t>(numel() * kernelforge::dtype_size(t)) + 1, 0xFF);
  }
  int64_t numel() const { return numel_of(shape); }
  double get(int64_t i) const { return load(bytes.data(), dtype, i); }
  void set(int64_t i, double v) { store(bytes.data(), dtype, i, v); }

  TensorView view() const {
    TensorView v;
    v.data = const_cast<unsigned char*>(bytes.data());
    v.dtype = dtype;
    v.device = Device{DeviceType::kCPU, 0};
    v.ndim = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = shape[d];
      v.strides[d] = stride;
      stride *= shape[d];
    }
    return v;
  }
};

// Deterministic random numbers (splitmix64: fast, and the same on every platform); a test seeds its
// own stream so that each case gets fresh data. KF_TEST_SEED overrides the base seed.
class Rng {
 public:
  explicit Rng(uint64_t salt) {
    uint64_t base = 0x6b666f726765ull;  // "kforge"
    if (const char* s = std::getenv("KF_TEST_SEED")) base = std::strtoull(s, nullptr, 0);
    state_ = base ^ (salt * 0x9E3779B97F4A7C15ull);
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // uniform in [lo, hi)
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  }
  // normal with mean 0 and standard deviation `sigma` (Box-Muller; 1 - u keeps the log finite)
  double normal(double sigma = 1.0) {
    const double u = 1.0 - uniform(0.0, 1.0), v = uniform(0.0, 1.0);
    return sigma * std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }

 private:
  uint64_t state_;
};

inline uint64_t hash_str(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Random values in [lo, hi) rounded to the dtype; `offset` shifts them (e.g. a row mean for
// layer_norm); values are never all zero.
inline HostTensor random_tensor(DType t, std::vector<int64_t> shape, Rng& rng, double lo = -2.0, double hi = 2.0) {
  HostTensor h(t, std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, rng.uniform(lo, hi));
  return h;
}

// Weights: magnitude in [0.5, 1.5), random sign.
inline HostTensor random_weight(DType t, std::vector<int64_t> shape, Rng& rng) {
  HostTensor h(t, std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double m = rng.uniform(0.5, 1.5);
    h.set(i, rng.uniform(0.0, 1.0) < 0.5 ? -m : m);
  }
  return h;
}

// ---- GPU presence ----------------------------------------------------------------------------
inline int gpu_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      (void)cudaGetLastError();
      c = 0;
    }
    return c;
  }();
  return n;
}
inline bool gpu_required() {
  const char* s = std::getenv("KF_REQUIRE_GPU");
  return s && std::string(s) == "1";
}
inline int gpu_capability() {
  static const int cap = [] {
    int c = 0;
    if (gpu_count() == 0 || !kernelforge::device_capability(0, &c).ok()) return 0;
    return c;
  }();
  return cap;
}

// In a test body or SetUp: skip without a GPU, or fail when KF_REQUIRE_GPU=1.
#define KF_NEED_GPU()                                                                           \
  do {                                                                                          \
    if (::kftest::gpu_count() == 0) {                                                           \
      if (::kftest::gpu_required()) FAIL() << "KF_REQUIRE_GPU=1 but no CUDA device is present"; \
      GTEST_SKIP() << "no CUDA device";                                                         \
    }                                                                                           \
  } while (0)

#define KF_ASSERT_OK(expr)                                              \
  do {                                                                  \
    const ::kernelforge::Status _kf_s = (expr);                         \
    ASSERT_TRUE(_kf_s.ok()) << #expr << " failed: " << _kf_s.message(); \
  } while (0)

#define KF_CUDA_CHECK(expr)                                                      \
  do {                                                                           \
    const cudaError_t _kf_e = (expr);                                            \
    ASSERT_EQ(_kf_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_kf_e); \
  } while (0)

// ---- device tensors with a row layout --------------------------------------------------------
// Row layout of a device tensor [..., N]: rows are `row_stride` elements apart (>= N) and the
// first element sits `offset` elements past a 256-byte aligned allocation. A guard region follows
// the last row. Every byte the view does not cover stays 0xFF, which check_untouched() verifies.
struct Layout {
  int64_t row_pad = 0;  // row_stride = N + row_pad
  int64_t offset = 0;   // base pointer offset in elements
};

class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType t, std::vector<int64_t> shape, Layout layout = {}) : dtype_(t), shape_(shape) {
    const int nd = static_cast<int>(shape_.size());
    n_ = nd ? shape_[nd - 1] : 1;
    rows_ = nd ? numel_of(std::vector<int64_t>(shape_.begin(), shape_.end() - 1)) : 1;
    row_stride_ = n_ + layout.row_pad;
    offset_ = layout.offset;
    alloc_elems_ = offset_ + rows_ * row_stride_ + kGuard;
    esize_ = kernelforge::dtype_size(t);
    if (cudaMalloc(&base_, static_cast<size_t>(alloc_elems_) * esize_) != cudaSuccess) {
      (void)cudaGetLastError();
      base_ = nullptr;
    }
    poison();
  }
  ~DeviceTensor() {
    if (base_) cudaFree(base_);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept { *this = std::move(o); }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(dtype_, o.dtype_);
    std::swap(shape_, o.shape_);
    std::swap(n_, o.n_);
    std::swap(rows_, o.rows_);
    std::swap(row_stride_, o.row_stride_);
    std::swap(offset_, o.offset_);
    std::swap(alloc_elems_, o.alloc_elems_);
    std::swap(esize_, o.esize_);
    std::swap(base_, o.base_);
    return *this;
  }

  bool ok() const { return base_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }

  TensorView view() const {
    TensorView v;
    v.data = static_cast<unsigned char*>(base_) + offset_ * esize_;
    v.dtype = dtype_;
    v.device = Device{DeviceType::kCUDA, 0};
    v.ndim = static_cast<int>(shape_.size());
    if (v.ndim == 0) return v;
    v.shape[v.ndim - 1] = shape_[v.ndim - 1];
    v.strides[v.ndim - 1] = 1;
    int64_t stride = row_stride_;
    for (int d = v.ndim - 2; d >= 0; --d) {
      v.shape[d] = shape_[d];
      v.strides[d] = stride;
      stride *= shape_[d];
    }
    return v;
  }

  // Fills the whole allocation (view, padding and guard) with 0xFF bytes: NaN in every float dtype.
  // cudaMemset runs on the legacy default stream and may return before it is done; the tests launch
  // on non-blocking streams, which do not wait for that stream, so the fill is awaited here (without
  // the wait a late fill can overwrite the tail of a kernel's output with NaN).
  void poison() {
    if (!base_) return;
    cudaMemset(base_, 0xFF, static_cast<size_t>(alloc_elems_) * esize_);
    cudaDeviceSynchronize();
  }

  void upload(const HostTensor& h) {
    std::vector<unsigned char> img(static_cast<size_t>(alloc_elems_) * esize_, 0xFF);
    for (int64_t r = 0; r < rows_; ++r)
      std::memcpy(img.data() + (offset_ + r * row_stride_) * esize_, h.bytes.data() + r * n_ * esize_,
                  static_cast<size_t>(n_) * esize_);
    cudaMemcpy(base_, img.data(), img.size(), cudaMemcpyHostToDevice);
    // From pageable memory cudaMemcpy may return before the DMA has landed, and the tests' non-blocking
    // streams do not wait for the legacy stream: an in-place kernel's output can be overwritten by
    // the late copy of its input. Wait here.
    cudaDeviceSynchronize();
  }

  std::vector<unsigned char> raw() const {
    std::vector<unsigned char> img(static_cast<size_t>(alloc_elems_) * esize_);
    cudaMemcpy(img.data(), base_, img.size(), cudaMemcpyDeviceToHost);
    return img;
  }

  HostTensor download() const {
    HostTensor h(dtype_, shape_);
    const std::vector<unsigned char> img = raw();
    for (int64_t r = 0; r < rows_; ++r)
      std::memcpy(h.bytes.data() + r * n_ * esize_, img.data() + (offset_ + r * row_stride_) * esize_,
                  static_cast<size_t>(n_) * esize_);
    return h;
  }

  // Every byte outside the view (offset, row padding, guard) must still be 0xFF.
  ::testing::AssertionResult check_untouched(const char* what) const {
    const std::vector<unsigned char> img = raw();
    std::vector<bool> covered(static_cast<size_t>(alloc_elems_), false);
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < n_; ++c) covered[offset_ + r * row_stride_ + c] = true;
    for (int64_t e = 0; e < alloc_elems_; ++e) {
      if (covered[e]) continue;
      for (size_t b = 0; b < esize_; ++b)
        if (img[e * esize_ + b] != 0xFF)
          return ::testing::AssertionFailure()
                 << what << ": element " << e << " of the allocation lies outside the view " << shape_str(shape_)
                 << " (offset " << offset_ << ", row stride " << row_stride_ << ") and was written";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  static constexpr int64_t kGuard = 64;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  int64_t n_ = 0, rows_ = 0, row_stride_ = 0, offset_ = 0, alloc_elems_ = 0;
  size_t esize_ = 4;
  void* base_ = nullptr;
};

// ---- comparison ------------------------------------------------------------------------------
struct Tol {
  double rtol;
  double atol;
};

// The one tolerance table. Outputs and reference are both rounded to the dtype, so a correct
// kernel is within about one rounding step (two for rms_norm's intermediate cast) of the
// reference; float32 also absorbs float32-vs-float64 accumulation over a row.
inline Tol tolerance(DType t) {
  switch (t) {
    case DType::kFloat32:
      return {1e-5, 1e-5};
    case DType::kFloat16:
      return {2e-3, 2e-3};
    case DType::kBFloat16:
      return {1.6e-2, 1.6e-2};
    default:
      return {0.0, 0.0};
  }
}

// For outputs that are sums over `terms` rows (dweight, dbias, dscale, dshift): the float32
// accumulation error grows like sqrt(terms), so atol is scaled by it.
inline Tol reduction_tolerance(DType t, int64_t terms) {
  Tol tol = tolerance(t);
  tol.atol *= std::sqrt(static_cast<double>(terms > 1 ? terms : 1));
  return tol;
}

// Compares every element: |got - want| <= atol + rtol * |want|. NaN or Inf in `got` never
// passes (the reference of a finite input is finite).
inline ::testing::AssertionResult all_close(const char* what, const HostTensor& got, const HostTensor& want, Tol tol) {
  if (got.shape != want.shape)
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape)
                                         << " != " << shape_str(want.shape);
  int64_t bad = 0;
  double worst = 0.0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const double err = std::fabs(g - w);
    const bool fail = !std::isfinite(g) || !std::isfinite(w) || !(err <= tol.atol + tol.rtol * std::fabs(w));
    if (!fail) continue;
    if (bad < 8) first << "\n    [" << i << "] got " << g << " want " << w;
    if (std::isnan(err) || std::isnan(worst))
      worst = std::nan("");
    else
      worst = std::fmax(worst, err);
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << dtype_name(got.dtype) << " " << shape_str(got.shape) << ": "
                                       << bad << " of " << got.numel() << " elements differ from the reference (rtol "
                                       << tol.rtol << ", atol " << tol.atol << ", worst |err| " << worst
                                       << "); first:" << first.str();
}

inline ::testing::AssertionResult bit_equal(const char* what, const HostTensor& a, const HostTensor& b) {
  const size_t n = static_cast<size_t>(a.numel()) * kernelforge::dtype_size(a.dtype);
  if (a.shape != b.shape || std::memcmp(a.bytes.data(), b.bytes.data(), n) != 0) {
    int64_t first = -1;
    for (int64_t i = 0; i < a.numel() && first < 0; ++i)
      if (std::memcmp(a.bytes.data() + i * kernelforge::dtype_size(a.dtype),
                      b.bytes.data() + i * kernelforge::dtype_size(a.dtype), kernelforge::dtype_size(a.dtype)) != 0)
        first = i;
    return ::testing::AssertionFailure() << what << ": two runs differ, first at element " << first << " ("
                                         << a.get(first) << " vs " << b.get(first) << ")";
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult has_substrings(const Status& st, std::initializer_list<const char*> needles) {
  if (st.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  for (const char* n : needles)
    if (st.message().find(n) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << st.message() << "\" does not contain \"" << n << "\"";
  return ::testing::AssertionSuccess() << st.message();
}

// A contiguous CUDA view at a dummy address, for validation tests (validation never dereferences
// it). Distinct `addr`s keep views from looking like aliases of each other.
inline TensorView cuda_view(DType t, std::vector<int64_t> shape, int device = 0, uintptr_t addr = uintptr_t{1} << 40) {
  TensorView v;
  v.data = reinterpret_cast<void*>(addr);
  v.dtype = t;
  v.device = Device{DeviceType::kCUDA, device};
  v.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = stride;
    stride *= shape[d];
  }
  return v;
}

// Memory layouts the kernel tests put their row tensors in (each family maps them to row strides
// and offsets of its tensors): contiguous, rows padded to a wider stride, an odd row stride (every
// row at a different alignment), a base pointer one element off alignment, and tensors of one call
// in different layouts (kMixed).
enum class LayoutKind { kContiguous, kRowPadded, kOddStride, kUnaligned, kMixed };
inline const char* layout_name(LayoutKind l) {
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
inline void PrintTo(LayoutKind l, std::ostream* os) { *os << layout_name(l); }

}  // namespace kftest

// Checks that `status_expr` is a validation failure (InvalidArgument) mentioning every needle.
#define KF_EXPECT_INVALID(status_expr, ...)                                              \
  do {                                                                                   \
    const ::kernelforge::Status _st = (status_expr);                                     \
    EXPECT_EQ(_st.code(), ::kernelforge::StatusCode::kInvalidArgument) << _st.message(); \
    EXPECT_TRUE(::kftest::has_substrings(_st, {__VA_ARGS__}));                           \
  } while (0)
