// float64 CPU reference of the linear family: y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) in double,
// rounded once to y's dtype. The test oracle and the CPU implementation of the PyTorch op.
#include "common/host_convert.h"
#include "linear/linear_problem.h"

namespace kernelforge {
namespace ref {

Status linear(const LinearTensors& t) {
  LinearParams p;
  DType dt;
  Status s = validate_linear("linear", false, t, &p, &dt);
  if (!s.ok()) return s;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double acc = p.bias != nullptr ? load_as_double(p.bias, dt, n) : 0.0;
      for (int64_t k = 0; k < p.K; ++k)
        acc += load_as_double(p.x, dt, m * p.ldx + k) * load_as_double(p.w, dt, n * p.ldw + k);
      store_from_double(p.y, dt, m * p.ldy + n, acc);
    }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
