// float64 CPU reference of the fused_linear_rowsum family: the test oracle and the CPU implementation
// of the PyTorch ops. The formulas of fused_linear_rowsum.h in double, every output rounded once to
// its dtype (w_sum to float32, or kept in double when w_sum is float64).
#include <vector>

#include "common/host_convert.h"
#include "fused_linear_rowsum/fused_linear_rowsum_problem.h"

namespace kernelforge {
namespace ref {

namespace {

double at(const void* base, DType t, int64_t i) { return load_as_double(base, t, i); }

}  // namespace

Status fused_linear_rowsum(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& y,
                           const TensorView& w_sum) {
  FlrsCall c;
  c.name = "fused_linear_rowsum";
  c.cuda = false;
  c.x = &x, c.weight = &weight, c.bias = bias, c.y = &y, c.w_sum = &w_sum;
  FlrsParams p;
  DType t = DType::kFloat32, wt = DType::kFloat32;
  Status s = validate_fused_linear_rowsum(c, &p, &t, &wt);
  if (!s.ok()) return s;
  if (p.tokens == 0) return Status::Ok();  // as the CUDA path: nothing is written
  // w_sum[k] = sum_o W[o, k], b_sum = sum_o b[o], in double; y uses the double sums (w_sum's stored
  // float32 copy is for the backward).
  std::vector<double> ws(size_t(p.k), 0.0);
  double b_sum = 0.0;
  for (int64_t o = 0; o < p.o; ++o) {
    for (int64_t k = 0; k < p.k; ++k) ws[size_t(k)] += at(p.w, t, o * p.w_stride + k);
    if (p.bias != nullptr) b_sum += at(p.bias, t, o * p.bias_stride);
  }
  for (int64_t k = 0; k < p.k; ++k) store_from_double(w_sum.data, wt, k, ws[size_t(k)]);
  for (int64_t r = 0; r < p.tokens; ++r) {
    double acc = b_sum;
    for (int64_t k = 0; k < p.k; ++k) acc += at(p.x, t, r * p.x_stride + k) * ws[size_t(k)];
    store_from_double(p.y, t, r * p.y_stride, acc);
  }
  return Status::Ok();
}

Status fused_linear_rowsum_backward(const TensorView& dy, const TensorView& x, const TensorView& w_sum,
                                    const TensorView* dx, const TensorView* dweight, const TensorView* dbias) {
  FlrsCall c;
  c.name = "fused_linear_rowsum_backward";
  c.cuda = false;
  c.backward = true;
  c.dy = &dy, c.x = &x, c.w_sum = &w_sum, c.dx = dx, c.dweight = dweight, c.dbias = dbias;
  FlrsParams p;
  DType t = DType::kFloat32, wt = DType::kFloat32;
  Status s = validate_fused_linear_rowsum(c, &p, &t, &wt);
  if (!s.ok()) return s;
  // dx[t, k] = dy[t] * w_sum[k]
  if (p.dx != nullptr)
    for (int64_t r = 0; r < p.tokens; ++r) {
      const double g = at(p.dy, t, r * p.dy_stride);
      for (int64_t k = 0; k < p.k; ++k) store_from_double(p.dx, t, r * p.dx_stride + k, g * at(w_sum.data, wt, k));
    }
  if (p.dw == nullptr && p.db == nullptr) return Status::Ok();
  // g[k] = sum_t dy[t] x[t, k], the same row of dweight for every o; dbias[o] = sum_t dy[t]
  std::vector<double> g(size_t(p.k), 0.0);
  double dy_sum = 0.0;
  for (int64_t r = 0; r < p.tokens; ++r) {
    const double d = at(p.dy, t, r * p.dy_stride);
    dy_sum += d;
    if (p.dw != nullptr)
      for (int64_t k = 0; k < p.k; ++k) g[size_t(k)] += d * at(p.x, t, r * p.x_stride + k);
  }
  for (int64_t o = 0; o < p.o; ++o) {
    if (p.dw != nullptr)
      for (int64_t k = 0; k < p.k; ++k) store_from_double(p.dw, t, o * p.dw_stride + k, g[size_t(k)]);
    if (p.db != nullptr) store_from_double(p.db, t, o * p.db_stride, dy_sum);
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
