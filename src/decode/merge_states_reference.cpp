// float64 CPU reference of merge_attention_states (decode.h): the test oracle and the CPU
// implementation of the PyTorch op. The formula in double, each output rounded once to its dtype.
// In place (out is o_a or o_b) works here as in the kernel: a row's inputs are read before it is
// written.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/host_convert.h"
#include "decode/merge_states.h"

namespace kernelforge {
namespace ref {

Status merge_attention_states(const MergeStatesTensors& t) {
  MergeStatesParams p;
  DType dt = DType::kFloat32;
  Status s = validate_merge_states("merge_attention_states", false, t, &p, &dt);
  if (!s.ok()) return s;
  const DType la_t = t.lse_a->dtype, lb_t = t.lse_b->dtype, lo_t = t.out_lse ? t.out_lse->dtype : DType::kFloat32;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t n = 0; n < p.rows; ++n)
    for (int64_t h = 0; h < p.heads; ++h) {
      const double la = load_as_double(p.lse_a, la_t, n * p.la_sn + h * p.la_sh);
      const double lb = load_as_double(p.lse_b, lb_t, n * p.lb_sn + h * p.lb_sh);
      const double m = std::max(la, lb);
      double wa = 0.0, wb = 0.0, lse = kNegInf;
      if (m != kNegInf) {
        const double ea = std::exp(la - m), eb = std::exp(lb - m);
        wa = ea / (ea + eb), wb = eb / (ea + eb);
        lse = m + std::log(ea + eb);
      }
      const int64_t ao = n * p.oa_sn + h * p.oa_sh, bo = n * p.ob_sn + h * p.ob_sh, oo = n * p.out_sn + h * p.out_sh;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        const double xa = wa == 0.0 ? 0.0 : wa * load_as_double(p.o_a, dt, ao + d);  // -inf side: unused
        const double xb = wb == 0.0 ? 0.0 : wb * load_as_double(p.o_b, dt, bo + d);
        store_from_double(p.out, dt, oo + d, xa + xb);
      }
      if (p.out_lse != nullptr) store_from_double(p.out_lse, lo_t, n * p.lo_sn + h * p.lo_sh, lse);
    }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
