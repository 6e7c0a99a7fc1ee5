// float64 CPU reference of the cross-entropy family: the test oracle and the CPU implementation of
// the PyTorch ops. The formulas of cross_entropy.h in double; float32 outputs rounded once, the
// gradient rounded once to the logits' dtype. The backward recomputes lse in double (the lse
// argument is only checked), so the reference gradient does not inherit a float32 rounding; the
// mean's divisor is the `valid` argument, as on the GPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/host_convert.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/flce_problem.h"

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

// The fused linear cross-entropy in double: the whole [T, V] logits (h W^T + b), the loss and its
// gradient through the functions above on those float64 logits, then dhidden = dl W, dweight = dl^T h
// and dbias = the column sums of dl, each output rounded once.
namespace {

Status flce(const char* name, bool backward, const FlceTensors& t, const CrossEntropyOptions& opts) {
  FlceParams p;
  Status s = validate_flce(name, false, backward, t, opts, &p);
  if (!s.ok()) return s;
  const int64_t T = p.tokens, H = p.hidden, V = p.vocab;
  const DType dt = p.dtype;
  // hidden and weight in double once (row-major, contiguous): the loops below then run over contiguous rows
  std::vector<double> h(size_t(T * H)), w(size_t(V * H));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t k = 0; k < H; ++k) h[size_t(i * H + k)] = load_as_double(t.hidden->data, dt, i * p.ldh + k);
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < H; ++k) w[size_t(v * H + k)] = load_as_double(t.weight->data, dt, v * p.ldw + k);
  std::vector<double> logits(size_t(T * V)), dl(size_t(T * V));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t v = 0; v < V; ++v) {
      double acc = t.bias != nullptr ? load_as_double(t.bias->data, dt, v) : 0.0;
      for (int64_t k = 0; k < H; ++k) acc += h[size_t(i * H + k)] * w[size_t(v * H + k)];
      logits[size_t(i * V + v)] = acc;
    }
  const Device cpu{DeviceType::kCPU, 0};
  const TensorView lv = make_view(logits.data(), DType::kFloat64, {T, V}, cpu);
  const TensorView dv = make_view(dl.data(), DType::kFloat64, {T, V}, cpu);
  float local_loss = 0.f, local_valid = 0.f, one = 1.f;
  const TensorView local_loss_v = make_view(&local_loss, DType::kFloat32, {}, cpu),
                   local_valid_v = make_view(&local_valid, DType::kFloat32, {}, cpu),
                   one_v = make_view(&one, DType::kFloat32, {}, cpu);
  if (!backward) {
    const TensorView& loss = opts.reduction != Reduction::kNone ? *t.loss : local_loss_v;
    if (!(s = cross_entropy(lv, *t.target, opts, *t.row_loss, *t.lse, loss, *t.valid)).ok()) return s;
    if (!p.grads) return Status::Ok();
    if (!(s = cross_entropy_backward(one_v, lv, *t.target, *t.lse, *t.valid, opts, dv)).ok()) return s;
  } else if (!(s = cross_entropy_backward(*t.dloss, lv, *t.target, *t.lse, local_valid_v, opts, dv)).ok()) {
    return s;
  }
  std::vector<double> acc(static_cast<size_t>(H));
  if (t.dhidden != nullptr)
    for (int64_t i = 0; i < T; ++i) {  // dhidden[i] = sum_v dl[i, v] w[v]
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t v = 0; v < V; ++v)
        for (int64_t k = 0; k < H; ++k) acc[size_t(k)] += dl[size_t(i * V + v)] * w[size_t(v * H + k)];
      for (int64_t k = 0; k < H; ++k) store_from_double(t.dhidden->data, dt, i * p.lddh + k, acc[size_t(k)]);
    }
  if (t.dweight != nullptr)
    for (int64_t v = 0; v < V; ++v) {  // dweight[v] = sum_i dl[i, v] h[i]
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t k = 0; k < H; ++k) acc[size_t(k)] += dl[size_t(i * V + v)] * h[size_t(i * H + k)];
      for (int64_t k = 0; k < H; ++k) store_from_double(t.dweight->data, dt, v * p.lddw + k, acc[size_t(k)]);
    }
  if (t.dbias != nullptr)
    for (int64_t v = 0; v < V; ++v) {
      double sum = 0;
      for (int64_t i = 0; i < T; ++i) sum += dl[size_t(i * V + v)];
      static_cast<float*>(t.dbias->data)[v] = float(sum);
    }
  return Status::Ok();
}

}  // namespace

Status fused_linear_cross_entropy(const FlceTensors& t, const CrossEntropyOptions& opts) {
  return flce("fused_linear_cross_entropy", false, t, opts);
}
Status fused_linear_cross_entropy_backward(const FlceTensors& t, const CrossEntropyOptions& opts) {
  return flce("fused_linear_cross_entropy_backward", true, t, opts);
}

}  // namespace ref
}  // namespace kernelforge
