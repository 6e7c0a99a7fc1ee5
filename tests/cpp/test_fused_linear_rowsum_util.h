// Shared by the fused_linear_rowsum C++ tests: random operands of one call (x [T, K], weight [O, K],
// bias [O], dy [T]), the float64 oracle through kernelforge::ref, and the error bound of a float32
// sum: a result may be off by one rounding of its dtype plus kAccum times the sum of the magnitudes of
// its terms (the float32 accumulation error; y and dweight are sums of thousands of terms that cancel).
#pragma once

#include <cmath>
#include <sstream>
#include <vector>

#include "test_util.h"

namespace kftest {

// float32 accumulation: chains of at most a few thousand adds in fixed order, error ~ sqrt(n) eps
// of the terms' magnitude sum; 1e-5 is ten times that at n = 2048.
constexpr double kFlrsAccum = 1e-5;

struct FlrsHost {
  HostTensor x, w, b, dy;  // b empty when there is no bias
  bool has_bias = false;
  int64_t T = 0, K = 0, O = 0;
};

inline FlrsHost flrs_random(DType t, int64_t T, int64_t K, int64_t O, bool bias, Rng& rng) {
  FlrsHost h;
  h.T = T, h.K = K, h.O = O, h.has_bias = bias;
  h.x = random_tensor(t, {T, K}, rng);
  h.w = random_tensor(t, {O, K}, rng, -1.0, 1.0);
  h.b = bias ? random_tensor(t, {O}, rng) : HostTensor(t, {0});
  h.dy = random_tensor(t, {T}, rng);
  return h;
}

// Magnitude sums of the terms of each result: y[t] <- sum_k |x[t,k]| sum_o |W[o,k]| + sum_o |b[o]|;
// dweight[o, k] <- sum_t |dy[t] x[t,k]|; dbias[o] <- sum_t |dy[t]|.
inline std::vector<double> flrs_y_mag(const FlrsHost& h) {
  std::vector<double> wa(size_t(h.K), 0.0), mag(size_t(h.T), 0.0);
  double ba = 0.0;
  for (int64_t o = 0; o < h.O; ++o) {
    for (int64_t k = 0; k < h.K; ++k) wa[size_t(k)] += std::fabs(h.w.get(o * h.K + k));
    if (h.has_bias) ba += std::fabs(h.b.get(o));
  }
  for (int64_t r = 0; r < h.T; ++r) {
    double m = ba;
    for (int64_t k = 0; k < h.K; ++k) m += std::fabs(h.x.get(r * h.K + k)) * wa[size_t(k)];
    mag[size_t(r)] = m;
  }
  return mag;
}
inline std::vector<double> flrs_dw_mag(const FlrsHost& h) {
  std::vector<double> g(size_t(h.K), 0.0), mag(size_t(h.O * h.K), 0.0);
  for (int64_t r = 0; r < h.T; ++r)
    for (int64_t k = 0; k < h.K; ++k) g[size_t(k)] += std::fabs(h.dy.get(r) * h.x.get(r * h.K + k));
  for (int64_t o = 0; o < h.O; ++o)
    for (int64_t k = 0; k < h.K; ++k) mag[size_t(o * h.K + k)] = g[size_t(k)];
  return mag;
}
inline std::vector<double> flrs_db_mag(const FlrsHost& h) {
  double s = 0.0;
  for (int64_t r = 0; r < h.T; ++r) s += std::fabs(h.dy.get(r));
  return std::vector<double>(size_t(h.O), s);
}

// Every element: |got - want| <= atol + rtol |want| + kFlrsAccum * mag[i]; NaN / Inf never pass.
inline ::testing::AssertionResult flrs_close(const char* what, const HostTensor& got, const HostTensor& want, Tol tol,
                                             const std::vector<double>& mag) {
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << what << ": " << got.numel() << " elements, expected " << want.numel();
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const double bound =
        tol.atol + tol.rtol * std::fabs(w) + kFlrsAccum * (i < int64_t(mag.size()) ? mag[size_t(i)] : 0);
    if (std::isfinite(g) && std::isfinite(w) && std::fabs(g - w) <= bound) continue;
    if (bad < 8) first << "\n    [" << i << "] got " << g << " want " << w << " (bound " << bound << ")";
    ++bad;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << kernelforge::dtype_name(got.dtype) << ": " << bad << " of "
                                       << got.numel() << " elements differ from the reference; first:" << first.str();
}

}  // namespace kftest
