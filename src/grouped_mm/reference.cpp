// float64 CPU reference of the grouped_mm family: the same group rule (grouped_mm.h), products summed
// in double, each output rounded once. The test oracle and the CPU implementation of the PyTorch ops.
#include <algorithm>
#include <climits>

#include "common/host_convert.h"
#include "grouped_mm/grouped_mm_problem.h"

namespace kernelforge {

namespace {

// ends[e] = clamp(max(offsets[0..e]), 0, T).
std::vector<int64_t> group_ends(const GmmParams& p) {
  std::vector<int64_t> ends(size_t(p.groups));
  int m = INT_MIN;
  for (int e = 0; e < p.groups; ++e) {
    m = std::max(m, p.offsets[e]);
    ends[size_t(e)] = std::min<int64_t>(std::max(m, 0), p.t);
  }
  return ends;
}

Status run(const GmmCall& c) {
  GmmParams p;
  DType dt;
  Status s = validate_grouped_mm(c, &p, &dt);
  if (!s.ok()) return s;
  const std::vector<int64_t> ends = group_ends(p);
  int64_t lo = 0;
  for (int e = 0; e < p.groups; ++e) {
    const int64_t hi = ends[size_t(e)];
    if (p.op == GroupedMmOp::kWgrad) {
      for (int64_t n = 0; n < p.n; ++n)
        for (int64_t k = 0; k < p.k; ++k) {
          double acc = 0.0;
          for (int64_t r = lo; r < hi; ++r)
            acc += load_as_double(p.a, dt, r * p.a_ld + n) * load_as_double(p.b, dt, r * p.b_sn + k);
          store_from_double(p.out, dt, e * p.out_batch + n * p.out_ld + k, acc);
        }
    } else {
      for (int64_t r = lo; r < hi; ++r)
        for (int64_t n = 0; n < p.n; ++n) {
          double acc = 0.0;
          for (int64_t k = 0; k < p.k; ++k)
            acc += load_as_double(p.a, dt, r * p.a_ld + k) *
                   load_as_double(p.b, dt, e * p.b_batch + n * p.b_sn + k * p.b_sk);
          store_from_double(p.out, dt, r * p.out_ld + n, acc);
        }
    }
    lo = hi;
  }
  if (p.op != GroupedMmOp::kWgrad)  // rows of no group
    for (int64_t r = lo; r < p.t; ++r)
      for (int64_t n = 0; n < p.n; ++n) store_from_double(p.out, dt, r * p.out_ld + n, 0.0);
  return Status::Ok();
}

}  // namespace

namespace ref {

Status grouped_mm(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out) {
  GmmCall c;
  c.name = "grouped_mm";
  c.cuda = false;
  c.a = &x, c.b = &w, c.offsets = &offsets, c.out = &out;
  return run(c);
}

Status grouped_mm_wgrad(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw) {
  GmmCall c;
  c.name = "grouped_mm_wgrad";
  c.wgrad = true;
  c.cuda = false;
  c.a = &dy, c.b = &x, c.offsets = &offsets, c.out = &dw;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
