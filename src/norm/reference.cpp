// float64 CPU reference of the normalization family: the test oracle and the CPU implementation of
// the PyTorch ops. Straightforward loops in double; outputs rounded once to their dtype, plus the
// HF RMSNorm intermediate cast (x * rstd rounded to the input dtype before * weight).
#include <cmath>
#include <cstring>
#include <vector>

#include "common/host_convert.h"
#include "norm/norm_problem.h"

namespace kernelforge {
namespace ref {

namespace {

struct Row {  // element c of row r of a row view
  const void* base;
  DType t;
  int64_t stride;
  double get(int64_t r, int64_t c) const { return load_as_double(base, t, r * stride + c); }
};

double vec_at(const void* p, DType t, int64_t c) { return p ? load_as_double(p, t, c) : 0.0; }

// Per-row statistics in double: mean (0 for rms) and rstd.
void row_stats(bool layer, const std::vector<double>& v, double eps, double* mean, double* rstd) {
  const double n = double(v.size());
  double m = 0.0;
  if (layer) {
    for (double a : v) m += a;
    m /= n;
  }
  double var = 0.0;
  for (double a : v) var += (a - m) * (a - m);
  var /= n;
  *mean = m;
  *rstd = 1.0 / std::sqrt(var + eps);
}

Status forward(const NormCall& c) {
  NormParams p;
  DType t;
  Status s = validate_norm(c, &p, &t);
  if (!s.ok() || p.rows == 0) return s;
  const bool layer = norm_is_layer(c.op), ada = norm_is_ada(c.op);
  const int64_t n = p.n;
  std::vector<double> v(n);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double a = load_as_double(p.x, t, r * p.x_stride + j);
      if (c.op == NormOp::kAddRms) {
        a = round_as(t, a + load_as_double(p.residual, t, r * p.res_stride + j));
        store_from_double(p.sum, t, r * p.sum_stride + j, a);
      }
      v[j] = a;
    }
    double mean, rstd;
    row_stats(layer, v, p.eps, &mean, &rstd);
    const int64_t g = r / p.ada_rpg;
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (v[j] - mean) * rstd;
      double y;
      if (!ada && !layer) {  // HF: cast to the input dtype, then multiply by the weight
        y = p.weight ? round_as(t, xh) * vec_at(p.weight, t, j) : xh;
      } else {
        y = p.weight ? xh * vec_at(p.weight, t, j) : xh;
        if (p.bias) y += vec_at(p.bias, t, j);
        if (ada)
          y = y * (1.0 + load_as_double(p.scale, t, g * p.scale_stride + j)) +
              load_as_double(p.shift, t, g * p.shift_stride + j);
      }
      store_from_double(p.y, t, r * p.y_stride + j, y);
    }
  }
  return Status::Ok();
}

Status backward(const NormCall& c) {
  NormParams p;
  DType t;
  Status s = validate_norm(c, &p, &t);
  if (!s.ok()) return s;
  const bool layer = norm_is_layer(c.op), ada = norm_is_ada(c.op);
  const int64_t n = p.n;
  std::vector<double> dw(n, 0.0), db(n, 0.0);
  const int64_t mod_rows = ada ? p.ada_groups : 0;
  std::vector<double> dsc(mod_rows * n, 0.0), dsh(mod_rows * n, 0.0);
  std::vector<double> v(n), gn(n), dn(n);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t j = 0; j < n; ++j) v[j] = load_as_double(p.x, t, r * p.x_stride + j);
    double mean, rstd;
    row_stats(layer, v, p.eps, &mean, &rstd);
    const int64_t g = r / p.ada_rpg;
    double sum_dn = 0.0, sum_dn_xh = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (v[j] - mean) * rstd;
      const double dy = load_as_double(p.dy, t, r * p.dy_stride + j);
      double gj = dy;  // gradient w.r.t. the affine output norm(x) * w + b
      if (ada) {
        const double sc = load_as_double(p.scale, t, g * p.scale_stride + j);
        double nrm = p.weight ? xh * vec_at(p.weight, t, j) : xh;
        if (p.bias) nrm += vec_at(p.bias, t, j);
        dsc[g * n + j] += dy * nrm;
        dsh[g * n + j] += dy;
        gj = dy * (1.0 + sc);
      }
      gn[j] = gj;
      dn[j] = p.weight ? gj * vec_at(p.weight, t, j) : gj;
      dw[j] += gj * xh;
      db[j] += gj;
      sum_dn += dn[j];
      sum_dn_xh += dn[j] * xh;
    }
    const double mdn = layer ? sum_dn / double(n) : 0.0, mdnxh = sum_dn_xh / double(n);
    for (int64_t j = 0; j < n; ++j) {
      const double xh = (v[j] - mean) * rstd;
      double dx = rstd * (dn[j] - mdn - xh * mdnxh);
      if (p.dsum) dx += load_as_double(p.dsum, t, r * p.dsum_stride + j);
      store_from_double(p.dx, t, r * p.dx_stride + j, dx);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    if (p.dweight) store_from_double(p.dweight, t, j, dw[j]);
    if (p.dbias) store_from_double(p.dbias, t, j, db[j]);
  }
  for (int64_t i = 0; i < mod_rows * n; ++i) {
    if (p.dscale) store_from_double(p.dscale, t, i, dsc[i]);
    if (p.dshift) store_from_double(p.dshift, t, i, dsh[i]);
  }
  return Status::Ok();
}

NormCall call(const char* name, NormOp op, bool bwd, float eps) {
  NormCall c;
  c.name = name;
  c.op = op;
  c.backward = bwd;
  c.cuda = false;
  c.eps = eps;
  return c;
}

}  // namespace

Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y) {
  NormCall c = call("rms_norm", NormOp::kRms, false, eps);
  c.x = &x, c.weight = weight, c.y = &y;
  return forward(c);
}

Status add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight, float eps,
                    const TensorView& y, const TensorView& sum) {
  NormCall c = call("add_rms_norm", NormOp::kAddRms, false, eps);
  c.x = &x, c.residual = &residual, c.weight = weight, c.y = &y, c.sum = &sum;
  return forward(c);
}

Status layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias, float eps,
                  const TensorView& y) {
  NormCall c = call("layer_norm", NormOp::kLayer, false, eps);
  c.x = &x, c.weight = weight, c.bias = bias, c.y = &y;
  return forward(c);
}

Status ada_norm(const TensorView& x, const TensorView& scale, const TensorView& shift, const TensorView* weight,
                const TensorView* bias, float eps, NormKind kind, const TensorView& y) {
  NormCall c = call("ada_norm", kind == NormKind::kRms ? NormOp::kAdaRms : NormOp::kAdaLayer, false, eps);
  c.x = &x, c.scale = &scale, c.shift = &shift, c.weight = weight, c.bias = bias, c.y = &y, c.kind = kind;
  return forward(c);
}

Status rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, float eps,
                         const TensorView& dx, const TensorView* dweight) {
  NormCall c = call("rms_norm_backward", NormOp::kRms, true, eps);
  c.dy = &dy, c.x = &x, c.weight = weight, c.dx = &dx, c.dweight = dweight;
  return backward(c);
}

Status add_rms_norm_backward(const TensorView& dy, const TensorView* dsum, const TensorView& sum,
                             const TensorView* weight, float eps, const TensorView& dx, const TensorView* dweight) {
  NormCall c = call("add_rms_norm_backward", NormOp::kAddRms, true, eps);
  c.dy = &dy, c.dsum = dsum, c.x = &sum, c.weight = weight, c.dx = &dx, c.dweight = dweight;
  return backward(c);
}

Status layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, const TensorView* bias,
                           float eps, const TensorView& dx, const TensorView* dweight, const TensorView* dbias) {
  NormCall c = call("layer_norm_backward", NormOp::kLayer, true, eps);
  c.dy = &dy, c.x = &x, c.weight = weight, c.bias = bias, c.dx = &dx, c.dweight = dweight, c.dbias = dbias;
  return backward(c);
}

Status ada_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& scale, const TensorView& shift,
                         const TensorView* weight, const TensorView* bias, float eps, NormKind kind,
                         const TensorView& dx, const TensorView* dscale, const TensorView* dshift,
                         const TensorView* dweight, const TensorView* dbias) {
  NormCall c = call("ada_norm_backward", kind == NormKind::kRms ? NormOp::kAdaRms : NormOp::kAdaLayer, true, eps);
  c.dy = &dy, c.x = &x, c.scale = &scale, c.shift = &shift, c.weight = weight, c.bias = bias, c.dx = &dx, c.kind = kind;
  c.dscale = dscale, c.dshift = dshift, c.dweight = dweight, c.dbias = dbias;
  return backward(c);
}

}  // namespace ref
}  // namespace kernelforge
