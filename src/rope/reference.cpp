// float64 CPU reference of the RoPE family: the test oracle and the CPU implementation of the
// PyTorch op. The formulas of rope.h in double, every output rounded once to its dtype.
#include <cmath>
#include <vector>

#include "common/host_convert.h"
#include "rope/rope_problem.h"

namespace kernelforge {
namespace ref {

namespace {

// Partner of rotated column j (its pair's other member) and whether j is the pair's first member.
inline int64_t partner(int64_t j, int64_t R, bool interleaved, bool* first) {
  if (interleaved) {
    *first = (j % 2) == 0;
    return *first ? j + 1 : j - 1;
  }
  *first = j < R / 2;
  return *first ? j + R / 2 : j - R / 2;
}

Status run(const RopeCall& c) {
  RopeParams p;
  DType t, ct;
  Status s = validate_rope(c, &p, &t, &ct);
  if (!s.ok()) return s;
  const int64_t D = p.head_dim, R = p.rot_dim;
  // Positions are checked here (the CUDA kernel cannot report them; it writes NaN instead).
  if (p.pos) {
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t q = 0; q < p.seq; ++q) {
        const int64_t v = p.pos[b * p.pos_sb + q * p.pos_ss];
        if (v < 0 || v >= p.max_pos)
          return Status::Invalid(std::string(c.name) + ": position_ids[" + std::to_string(b) + ", " +
                                 std::to_string(q) + "] = " + std::to_string(v) + " is outside the cos/sin cache [0, " +
                                 std::to_string(p.max_pos) + ")");
      }
  }
  std::vector<double> x(static_cast<size_t>(D)), y(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t q = 0; q < p.seq; ++q) {
      int64_t cos_off, sin_off;
      if (p.pos) {
        const int64_t v = p.pos[b * p.pos_sb + q * p.pos_ss];
        cos_off = v * p.cos_ss;
        sin_off = v * p.sin_ss;
      } else {
        cos_off = b * p.cos_sb + q * p.cos_ss;
        sin_off = b * p.sin_sb + q * p.sin_ss;
      }
      for (int which = 0; which < 2; ++which) {
        const RopeHeads& h = p.t[which];
        for (int64_t hh = 0; hh < h.heads; ++hh) {
          const int64_t in_off = b * h.in_sb + q * h.in_ss + hh * h.in_sh;
          const int64_t out_off = b * h.out_sb + q * h.out_ss + hh * h.out_sh;
          for (int64_t j = 0; j < D; ++j) x[j] = load_as_double(h.in, t, in_off + j);  // read all first: in place
          for (int64_t j = 0; j < D; ++j) {
            if (j >= R) {
              y[j] = x[j];
              continue;
            }
            bool first;
            const int64_t m = partner(j, R, p.interleaved, &first);
            const double cj = load_as_double(p.cos, ct, cos_off + j);
            // forward: y[a] = x[a] c[a] - x[b] s[a], y[b] = x[b] c[b] + x[a] s[b]
            // backward: dx[a] = g[a] c[a] + g[b] s[b], dx[b] = g[b] c[b] - g[a] s[a]
            const double sj = load_as_double(p.sin, ct, sin_off + (p.backward ? m : j));
            const double sign = (first != p.backward) ? -1.0 : 1.0;
            y[j] = x[j] * cj + sign * x[m] * sj;
          }
          for (int64_t j = 0; j < D; ++j) store_from_double(h.out, t, out_off + j, y[j]);
        }
      }
    }
  }
  return Status::Ok();
}

RopeCall make(const char* name, bool bwd, const TensorView& q, const TensorView* k, const TensorView& cos,
              const TensorView& sin, const TensorView* pos, const RopeOptions& opts, const TensorView& q_out,
              const TensorView* k_out) {
  RopeCall c;
  c.name = name;
  c.backward = bwd;
  c.cuda = false;
  c.q = &q, c.k = k, c.cos = &cos, c.sin = &sin, c.pos = pos, c.opts = opts, c.q_out = &q_out, c.k_out = k_out;
  return c;
}

}  // namespace

Status apply_rope(const TensorView& q, const TensorView* k, const TensorView& cos, const TensorView& sin,
                  const TensorView* position_ids, const RopeOptions& opts, const TensorView& q_out,
                  const TensorView* k_out) {
  return run(make("apply_rope", false, q, k, cos, sin, position_ids, opts, q_out, k_out));
}

Status apply_rope_backward(const TensorView& dq_out, const TensorView* dk_out, const TensorView& cos,
                           const TensorView& sin, const TensorView* position_ids, const RopeOptions& opts,
                           const TensorView& dq, const TensorView* dk) {
  return run(make("apply_rope_backward", true, dq_out, dk_out, cos, sin, position_ids, opts, dq, dk));
}

}  // namespace ref
}  // namespace kernelforge
