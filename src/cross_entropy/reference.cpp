// float64 CPU reference of the cross-entropy family: the test oracle and the CPU implementation of
// the PyTorch ops. The formulas of cross_entropy.h in double; float32 outputs rounded once, the
// gradient rounded once to the logits' dtype. The backward recomputes lse in double (the lse
// argument is only checked), so the reference gradient does not inherit a float32 rounding; the
// mean's divisor is the `valid` argument, as on the GPU.
#include <cmath>
#include <string>
#include <vector>

#include "common/host_convert.h"
#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {
namespace ref {

namespace {

int64_t target_at(const CeParams& p, int64_t i) {
  return p.target64 ? static_cast<const int64_t*>(p.target)[i * p.target_stride]
                    : int64_t(static_cast<const int32_t*>(p.target)[i * p.target_stride]);
}

// z_j of row i (softcapped logits) in double.
void row_z(const CeParams& p, DType t, int64_t i, std::vector<double>& z) {
  z.resize(size_t(p.vocab));
  for (int64_t j = 0; j < p.vocab; ++j) {
    const double x = load_as_double(p.logits, t, i * p.ld + j);
    z[size_t(j)] = p.softcap > 0.f ? double(p.softcap) * std::tanh(x / double(p.softcap)) : x;
  }
}

double row_lse(const std::vector<double>& z) {
  double m = -INFINITY;
  for (double v : z) m = std::fmax(m, v);
  if (std::isinf(m)) return m;
  double s = 0;
  for (double v : z) s += std::exp(v - m);
  return m + std::log(s);
}

Status out_of_range(const char* name, int64_t i, int64_t t, int64_t vocab) {
  return Status::Invalid(std::string(name) + ": target[" + std::to_string(i) + "] = " + std::to_string(t) +
                         " is outside [0, " + std::to_string(vocab) + ") and is not ignore_index");
}

}  // namespace

Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss,
                     const TensorView& valid) {
  CeCall c;
  c.name = "cross_entropy";
  c.cuda = false;
  c.opts = opts;
  c.logits = &logits, c.target = &target, c.row_loss = &row_loss, c.lse_out = &lse, c.loss = &loss,
  c.valid_out = &valid;
  CeParams p;
  DType dt;
  Status s = validate_cross_entropy(c, &p, &dt);
  if (!s.ok()) return s;
  const double eps = opts.label_smoothing, zl = opts.z_loss_scale;
  std::vector<double> z;
  double total = 0, count = 0;
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t t = target_at(p, i);
    row_z(p, dt, i, z);
    const double l = row_lse(z);
    double r = 0;
    if (t != p.ignore_index) {
      if (t < 0 || t >= p.classes) return out_of_range(c.name, i, t, p.classes);
      const int64_t tl = t - p.class_start;  // a vocabulary shard holds z_t only for its own classes
      double sz = 0;
      for (double v : z) sz += v;
      r = l - (1 - eps) * (tl >= 0 && tl < p.vocab ? z[size_t(tl)] : 0.0);
      if (eps > 0) r -= eps / double(p.classes) * sz;
      if (zl > 0) r += zl * l * l;
      total += r;
      count += 1;
    }
    p.row_loss[i] = float(r);
    p.lse_out[i] = float(l);
  }
  *p.valid_out = float(count);
  if (opts.reduction == Reduction::kMean) *p.loss = float(total / count);  // 0 / 0 = NaN, as PyTorch
  if (opts.reduction == Reduction::kSum) *p.loss = float(total);
  return Status::Ok();
}

Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits) {
  CeCall c;
  c.name = "cross_entropy_backward";
  c.cuda = false;
  c.backward = true;
  c.opts = opts;
  c.dloss = &dloss, c.logits = &logits, c.target = &target, c.lse = &lse, c.valid = &valid, c.dlogits = &dlogits;
  CeParams p;
  DType dt;
  Status s = validate_cross_entropy(c, &p, &dt);
  if (!s.ok()) return s;
  const double eps = opts.label_smoothing, zl = opts.z_loss_scale, cap = opts.softcap;
  const double count = double(*p.valid);  // the forward's count (a chunk of a longer call may pass the total)
  const bool sharded = p.class_start != 0 || p.classes != p.vocab;
  std::vector<double> z;
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t t = target_at(p, i);
    if (t == p.ignore_index) {
      for (int64_t j = 0; j < p.vocab; ++j) store_from_double(p.dlogits, dt, i * p.dld + j, 0.0);
      continue;
    }
    if (t < 0 || t >= p.classes) return out_of_range(c.name, i, t, p.classes);
    const int64_t tl = t - p.class_start;
    const double g = opts.reduction == Reduction::kNone   ? double(p.dloss[i * p.dloss_stride])
                     : opts.reduction == Reduction::kMean ? double(p.dloss[0]) / count
                                                          : double(p.dloss[0]);
    row_z(p, dt, i, z);  // read the whole row before writing: dlogits may be logits
    // A shard's softmax needs the lse over every class (the caller's, combined over the shards).
    const double l = sharded ? double(p.lse[i]) : row_lse(z);
    for (int64_t j = 0; j < p.vocab; ++j) {
      const double pj = std::exp(z[size_t(j)] - l);
      double d = g * (pj * (1 + 2 * zl * l) - (j == tl ? 1 - eps : 0.0) - eps / double(p.classes));
      if (cap > 0) d *= 1 - (z[size_t(j)] / cap) * (z[size_t(j)] / cap);
      store_from_double(p.dlogits, dt, i * p.dld + j, d);
    }
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
