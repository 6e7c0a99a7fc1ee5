// float64 CPU reference of the diagonal_matmul family: the test oracle and the CPU implementation of
// the PyTorch ops. Products and sums in double (da of a broadcast a: rows summed in order, batch by
// batch), every output rounded once to its dtype.
#include <vector>

#include "common/host_convert.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"

namespace kernelforge {
namespace ref {

namespace {

Status run(const DmCall& c) {
  DmParams p;
  DType t;
  bool broadcast = false;
  Status s = validate_diagonal_matmul(c, &p, &t, &broadcast);
  if (!s.ok()) return s;
  if (!c.backward) {
    for (int64_t r = 0; r < p.rows; ++r) {
      const double a = load_as_double(p.a, t, p.a_row(r) * p.a_stride);
      for (int64_t j = 0; j < p.n; ++j)
        store_from_double(p.y, t, r * p.y_stride + j, a * load_as_double(p.b, t, r * p.b_stride + j));
    }
    return Status::Ok();
  }
  std::vector<double> da(size_t(p.a_rows), 0.0);  // Σ_n dy·b per row of a (summed over the batches)
  for (int64_t r = 0; r < p.rows; ++r) {
    const double a = load_as_double(p.a, t, p.a_row(r) * p.a_stride);
    double dot = 0.0;
    for (int64_t j = 0; j < p.n; ++j) {
      const double g = load_as_double(p.dy, t, r * p.dy_stride + j);
      if (p.da) dot += g * load_as_double(p.b, t, r * p.b_stride + j);
      if (p.db) store_from_double(p.db, t, r * p.db_stride + j, a * g);
    }
    da[size_t(p.a_row(r))] += dot;
  }
  if (p.da)
    for (int64_t i = 0; i < p.a_rows; ++i) store_from_double(p.da, t, i * p.da_stride, da[size_t(i)]);
  return Status::Ok();
}

}  // namespace

Status diagonal_matmul(const TensorView& a, const TensorView& b, const TensorView& y) {
  DmCall c;
  c.name = "diagonal_matmul";
  c.cuda = false;
  c.a = &a, c.b = &b, c.y = &y;
  return run(c);
}

Status diagonal_matmul_backward(const TensorView& dy, const TensorView& a, const TensorView& b, const TensorView* da,
                                const TensorView* db) {
  DmCall c;
  c.name = "diagonal_matmul_backward";
  c.backward = true;
  c.cuda = false;
  c.dy = &dy, c.a = &a, c.b = &b, c.da = da, c.db = db;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
