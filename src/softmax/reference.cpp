// float64 CPU reference of the softmax family: the test oracle and the CPU implementation of the
// PyTorch ops. Textbook formulas (softmax.h) in double, every output rounded once to its dtype.
// Special values follow torch.softmax: the max skips NaN (x > m is false for it), and a NaN, a +inf
// or an all -inf row turns s (and so every output of the row) into NaN through exp(NaN).
#include <cmath>

#include "common/host_convert.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {
namespace ref {

namespace {

Status run(const SoftmaxCall& c) {
  SoftmaxParams p;
  DType t;
  Status s = validate_softmax(c, &p, &t);
  if (!s.ok() || p.rows == 0) return s;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t in = r * p.in_stride, yo = r * p.y_stride, out = r * p.out_stride;
    if (!c.backward) {
      // m = max_j x_j, s = sum_j exp(x_j - m); every x is read before the first write (in place).
      double m = -INFINITY;
      for (int64_t j = 0; j < p.n; ++j) {
        const double x = load_as_double(p.in, t, in + j);
        if (x > m) m = x;
      }
      double sum = 0.0;
      for (int64_t j = 0; j < p.n; ++j) sum += std::exp(load_as_double(p.in, t, in + j) - m);
      const double log_s = std::log(sum);
      for (int64_t j = 0; j < p.n; ++j) {
        const double x = load_as_double(p.in, t, in + j);
        store_from_double(p.out, t, out + j, c.log ? (x - m) - log_s : std::exp(x - m) / sum);
      }
    } else {
      // softmax: dot = sum_k g_k y_k, dx = y (g - dot); log_softmax: sg = sum_k g_k, dx = g - exp(y) sg
      double acc = 0.0;
      for (int64_t j = 0; j < p.n; ++j) {
        const double g = load_as_double(p.in, t, in + j);
        acc += c.log ? g : g * load_as_double(p.y, t, yo + j);
      }
      for (int64_t j = 0; j < p.n; ++j) {
        const double g = load_as_double(p.in, t, in + j), y = load_as_double(p.y, t, yo + j);
        store_from_double(p.out, t, out + j, c.log ? g - std::exp(y) * acc : y * (g - acc));
      }
    }
  }
  return Status::Ok();
}

SoftmaxCall make(const char* name, bool log, bool bwd) {
  SoftmaxCall c;
  c.name = name;
  c.log = log;
  c.backward = bwd;
  c.cuda = false;
  return c;
}

}  // namespace

Status softmax(const TensorView& x, const TensorView& y) {
  SoftmaxCall c = make("softmax", false, false);
  c.x = &x, c.y = &y;
  return run(c);
}

Status log_softmax(const TensorView& x, const TensorView& y) {
  SoftmaxCall c = make("log_softmax", true, false);
  c.x = &x, c.y = &y;
  return run(c);
}

Status softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx) {
  SoftmaxCall c = make("softmax_backward", false, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c);
}

Status log_softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx) {
  SoftmaxCall c = make("log_softmax_backward", true, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
