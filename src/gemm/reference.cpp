// float64 CPU reference of the GEMM family: pre[m, n] = sum_k a[m, k] b[n, k] (+ bias[n], or + out[m, n]
// when accumulating) in double;
// out = act(pre), aux = pre and a_sum[m] = sum_k a[m, k], each rounded once to the dtype. The test oracle
// and the CPU implementation of the PyTorch ops.
#include <cmath>

#include "common/host_convert.h"
#include "gemm/gemm_problem.h"

namespace kernelforge {

namespace {

int64_t at(const GemmMatrix& m, int64_t r, int64_t c) { return m.row_major ? r * m.ld + c : r + c * m.ld; }

double gemm_activation(GemmActivation act, double x) {
  switch (act) {
    case GemmActivation::kRelu:
      return x > 0.0 ? x : 0.0;
    case GemmActivation::kGeluTanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case GemmActivation::kNone:
      break;
  }
  return x;
}

}  // namespace

namespace ref {

Status gemm(const GemmTensors& t, GemmActivation act) {
  GemmParams p;
  DType dt;
  Status s = validate_gemm("gemm", false, t, act, &p, &dt);
  if (!s.ok()) return s;
  for (int64_t i = 0; i < p.batch; ++i) {
    for (int64_t m = 0; m < p.M; ++m) {
      for (int64_t n = 0; n < p.N; ++n) {
        double acc = p.bias != nullptr ? load_as_double(p.bias, dt, n) : 0.0;
        if (p.accumulate) acc = load_as_double(p.out, dt, i * p.out_bs + m * p.ldo + n);
        for (int64_t k = 0; k < p.K; ++k)
          acc += load_as_double(p.a.data, dt, i * p.a.bs + at(p.a, m, k)) *
                 load_as_double(p.b.data, dt, i * p.b.bs + at(p.b, n, k));
        store_from_double(p.out, dt, i * p.out_bs + m * p.ldo + n, gemm_activation(act, acc));
        if (p.aux != nullptr) store_from_double(p.aux, dt, (i * p.M + m) * p.N + n, acc);
      }
    }
  }
  for (int64_t m = 0; m < p.M; ++m) {
    if (p.a_sum != nullptr) {
      double sum = 0.0;
      for (int64_t k = 0; k < p.K; ++k) sum += load_as_double(p.a.data, dt, at(p.a, m, k));
      store_from_double(p.a_sum, dt, m, sum);
    }
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
