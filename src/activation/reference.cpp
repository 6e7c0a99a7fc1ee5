// float64 CPU reference of the activation family: the test oracle and the CPU implementation of the
// PyTorch ops. Textbook formulas (activation.h) in double, every output rounded once to its dtype.
#include <cmath>
#include <vector>

#include "activation/activation_problem.h"
#include "common/host_convert.h"

namespace kernelforge {
namespace ref {

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kTanhK = 0.79788456080286535588;       // sqrt(2 / pi)
constexpr double kTanhC = 0.044715;

double act(ActFn fn, double a) {
  switch (fn) {
    case ActFn::kSilu:
      return a / (1.0 + std::exp(-a));
    case ActFn::kGeluErf:
      return 0.5 * a * (1.0 + std::erf(a * kSqrt1_2));
    case ActFn::kGeluTanh:
      return 0.5 * a * (1.0 + std::tanh(kTanhK * (a + kTanhC * a * a * a)));
  }
  return NAN;
}

double act_grad(ActFn fn, double a) {
  switch (fn) {
    case ActFn::kSilu: {  // s (1 + a (1 - s))
      const double s = 1.0 / (1.0 + std::exp(-a));
      return s * (1.0 + a * (1.0 - s));
    }
    case ActFn::kGeluErf:  // Phi(a) + a phi(a)
      return 0.5 * (1.0 + std::erf(a * kSqrt1_2)) + a * kInvSqrt2Pi * std::exp(-0.5 * a * a);
    case ActFn::kGeluTanh: {  // 0.5 (1 + t) + 0.5 a (1 - t^2) k (1 + 3 c a^2)
      const double t = std::tanh(kTanhK * (a + kTanhC * a * a * a));
      return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * kTanhK * (1.0 + 3.0 * kTanhC * a * a);
    }
  }
  return NAN;
}

Status run(const ActCall& c) {
  ActParams p;
  DType t;
  Status s = validate_activation(c, &p, &t);
  if (!s.ok()) return s;
  // gelu_backward_bias_grad: dbias = the float64 column sums of the unrounded gradients (0 for no rows)
  std::vector<double> bias_sum(c.dbias != nullptr ? size_t(p.n) : 0, 0.0);
  if (p.rows == 0) {
    for (int64_t j = 0; j < int64_t(bias_sum.size()); ++j)
      store_from_double(p.dbias, p.dbias_dtype, j * p.dbias_stride, 0.0);
    return s;
  }
  const ActFn fn = act_fn(c.op, c.approx);
  const bool gated = act_is_gated(c.op);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t j = 0; j < p.n; ++j) {
      const double a = load_as_double(p.a, t, r * p.a_stride + j);
      const double b = gated ? load_as_double(p.b, t, r * p.b_stride + j) : 1.0;
      if (!c.backward) {
        store_from_double(p.y, t, r * p.y_stride + j, act(fn, a) * b);
      } else {
        const double g = load_as_double(p.dy, t, r * p.dy_stride + j);
        const double da = g * b * act_grad(fn, a);
        if (gated) {
          const double db = g * act(fn, a);
          store_from_double(p.db, t, r * p.db_stride + j, db);
        }
        store_from_double(p.da, t, r * p.da_stride + j, da);
        if (!bias_sum.empty()) bias_sum[size_t(j)] += da;
      }
    }
  }
  for (int64_t j = 0; j < int64_t(bias_sum.size()); ++j)
    store_from_double(p.dbias, p.dbias_dtype, j * p.dbias_stride, bias_sum[size_t(j)]);
  return Status::Ok();
}

ActCall make(const char* name, ActOp op, bool bwd) {
  ActCall c;
  c.name = name;
  c.op = op;
  c.backward = bwd;
  c.cuda = false;
  return c;
}

}  // namespace

Status silu_and_mul(const TensorView& x, const TensorView& y) {
  ActCall c = make("silu_and_mul", ActOp::kSiluAndMul, false);
  c.x = &x, c.y = &y;
  return run(c);
}

Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& y) {
  ActCall c = make("swiglu", ActOp::kSwiglu, false);
  c.gate = &gate, c.up = &up, c.y = &y;
  return run(c);
}

Status gelu_and_mul(const TensorView& x, GeluApprox approximate, bool gate_first, const TensorView& y) {
  ActCall c = make("gelu_and_mul", ActOp::kGeluAndMul, false);
  c.x = &x, c.y = &y, c.approx = approximate, c.gate_first = gate_first;
  return run(c);
}

Status geglu(const TensorView& hidden, const TensorView& gate, GeluApprox approximate, const TensorView& y) {
  ActCall c = make("geglu", ActOp::kGeglu, false);
  c.up = &hidden, c.gate = &gate, c.y = &y, c.approx = approximate;
  return run(c);
}

Status gelu(const TensorView& x, GeluApprox approximate, const TensorView& y) {
  ActCall c = make("gelu", ActOp::kGelu, false);
  c.x = &x, c.y = &y, c.approx = approximate;
  return run(c);
}

Status silu_and_mul_backward(const TensorView& dy, const TensorView& x, const TensorView& dx) {
  ActCall c = make("silu_and_mul_backward", ActOp::kSiluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx;
  return run(c);
}

Status swiglu_backward(const TensorView& dy, const TensorView& gate, const TensorView& up, const TensorView& dgate,
                       const TensorView& dup) {
  ActCall c = make("swiglu_backward", ActOp::kSwiglu, true);
  c.dy = &dy, c.gate = &gate, c.up = &up, c.dgate = &dgate, c.dup = &dup;
  return run(c);
}

Status gelu_and_mul_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, bool gate_first,
                             const TensorView& dx) {
  ActCall c = make("gelu_and_mul_backward", ActOp::kGeluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate, c.gate_first = gate_first;
  return run(c);
}

Status geglu_backward(const TensorView& dy, const TensorView& hidden, const TensorView& gate, GeluApprox approximate,
                      const TensorView& dhidden, const TensorView& dgate) {
  ActCall c = make("geglu_backward", ActOp::kGeglu, true);
  c.dy = &dy, c.up = &hidden, c.gate = &gate, c.dup = &dhidden, c.dgate = &dgate, c.approx = approximate;
  return run(c);
}

Status gelu_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx) {
  ActCall c = make("gelu_backward", ActOp::kGelu, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate;
  return run(c);
}

Status gelu_backward_bias_grad(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                               const TensorView& dbias) {
  ActCall c = make("gelu_backward_bias_grad", ActOp::kGelu, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate, c.dbias = &dbias;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
