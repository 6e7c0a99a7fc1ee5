// float64 CPU reference of the attention backward: the test oracle and the CPU implementation of the
// PyTorch op's backward. The formula of attention.h in double, straight from the options. Like the
// kernels it recomputes p_ij = exp(s_ij - lse_i) from the GIVEN lse (the forward's), and D_i from
// the given dout and out; every gradient element is accumulated in double and rounded once.
// About 3x the forward's work: O(Sq * Sk * (2 Dqk + 2 Dv)) per (batch, query head).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "attention/reference_util.h"
#include "common/host_convert.h"

namespace kernelforge {
namespace ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using detail::Seq;

double dot(const double* a, const double* b, int64_t n) {
  double part[4] = {0.0, 0.0, 0.0, 0.0};  // every head dim is a multiple of 4: independent adds pipeline
  for (int64_t e = 0; e < n; e += 4)
    for (int u = 0; u < 4; ++u) part[u] += a[e + u] * b[e + u];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

Status run(const AttentionGradCall& c) {
  AttentionGradParams g;
  DType t;
  Status s = validate_attention_backward(c, &g, &t);
  if (!s.ok()) return s;
  const AttentionParams& p = g.f;
  const AttentionOptions& o = c.opts;
  const int64_t B = p.batch, group = p.group, Dqk = p.head_dim_qk, Dv = p.head_dim_v;

  std::vector<Seq> seqs;
  if (!(s = detail::read_seqs(c.name, c.t.fwd, o, p, &seqs)).ok()) return s;

  const double scale = o.scale > 0.0f ? double(o.scale) : 1.0 / std::sqrt(double(Dqk));
  const double softcap = o.softcap;
  const int64_t wl = o.window_left, wr = o.causal ? 0 : o.window_right;
  const DType lse_t = c.t.fwd.lse->dtype;
  const DType sink_t = c.t.fwd.sinks ? c.t.fwd.sinks->dtype : DType::kFloat32;
  const DType dsink_t = c.t.dsinks ? c.t.dsinks->dtype : DType::kFloat32;

  std::vector<double> dsinks(static_cast<size_t>(p.heads_q), 0.0);
  std::vector<double> kd, vd, dkd, dvd, qd(static_cast<size_t>(Dqk)), dod(static_cast<size_t>(Dv)),
      dqd(static_cast<size_t>(Dqk));
  for (int64_t b = 0; b < B; ++b) {
    const Seq& seq = seqs[b];
    const int64_t d = seq.sk - seq.sq;  // bottom-right alignment
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      kd.assign(size_t(seq.sk * Dqk), 0.0);
      vd.assign(size_t(seq.sk * Dv), 0.0);
      dkd.assign(size_t(seq.sk * Dqk), 0.0);  // dk, dv of this kv head: summed over its query heads
      dvd.assign(size_t(seq.sk * Dv), 0.0);
      for (int64_t j = 0; j < seq.sk; ++j) {
        const int64_t r = seq.k0 + j;
        const int64_t ko = b * p.k_sb + r * p.k_ss + hk * p.k_sh, vo = b * p.v_sb + r * p.v_ss + hk * p.v_sh;
        for (int64_t e = 0; e < Dqk; ++e) kd[j * Dqk + e] = load_as_double(p.k, t, ko + e);
        for (int64_t e = 0; e < Dv; ++e) vd[j * Dv + e] = load_as_double(p.v, t, vo + e);
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const double sink = p.sinks ? load_as_double(p.sinks, sink_t, h) : kNegInf;
        for (int64_t i = 0; i < seq.sq; ++i) {
          const int64_t r = seq.q0 + i;
          const int64_t qo = b * p.q_sb + r * p.q_ss + h * p.q_sh;
          const int64_t oo = b * p.o_sb + r * p.o_ss + h * p.o_sh, doo = b * g.do_sb + r * g.do_ss + h * g.do_sh;
          const double lse = load_as_double(p.lse, lse_t, b * p.lse_sb + h * p.lse_sh + r);
          for (int64_t e = 0; e < Dqk; ++e) dqd[e] = 0.0;
          if (lse != kNegInf) {  // a row with lse = -inf saw no key and no sink: it contributes nothing
            for (int64_t e = 0; e < Dqk; ++e) qd[e] = load_as_double(p.q, t, qo + e);
            double D = 0.0;  // D_i = dout_i . out_i
            for (int64_t e = 0; e < Dv; ++e) {
              dod[e] = load_as_double(g.dout, t, doo + e);
              D += dod[e] * load_as_double(p.out, t, oo + e);
            }
            if (p.sinks) dsinks[h] -= std::exp(sink - lse) * D;  // dsinks_h = -sum p_sink_i D_i
            for (int64_t j = 0; j < seq.sk; ++j) {
              const bool visible = (wl < 0 || j >= i + d - wl) && (wr < 0 || j <= i + d + wr);
              if (!visible) continue;
              const double* kj = kd.data() + j * Dqk;
              const double* vj = vd.data() + j * Dv;
              double sij = scale * dot(qd.data(), kj, Dqk);
              if (softcap > 0.0) sij = softcap * std::tanh(sij / softcap);
              const double pij = std::exp(sij - lse);
              const double ds = pij * (dot(dod.data(), vj, Dv) - D);  // p_ij (dp_ij - D_i)
              // d/du of softcap tanh(u / softcap) = 1 - tanh^2 = 1 - (s / softcap)^2
              const double du = softcap > 0.0 ? ds * (1.0 - (sij / softcap) * (sij / softcap)) : ds;
              double* dkj = dkd.data() + j * Dqk;
              double* dvj = dvd.data() + j * Dv;
              for (int64_t e = 0; e < Dqk; ++e) dqd[e] += scale * du * kj[e], dkj[e] += scale * du * qd[e];
              for (int64_t e = 0; e < Dv; ++e) dvj[e] += pij * dod[e];
            }
          }
          const int64_t dqo = b * g.dq_sb + r * g.dq_ss + h * g.dq_sh;
          for (int64_t e = 0; e < Dqk; ++e) store_from_double(g.dq, t, dqo + e, dqd[e]);
        }
      }
      for (int64_t j = 0; j < seq.sk; ++j) {
        const int64_t r = seq.k0 + j;
        const int64_t ko = b * g.dk_sb + r * g.dk_ss + hk * g.dk_sh, vo = b * g.dv_sb + r * g.dv_ss + hk * g.dv_sh;
        for (int64_t e = 0; e < Dqk; ++e) store_from_double(g.dk, t, ko + e, dkd[j * Dqk + e]);
        for (int64_t e = 0; e < Dv; ++e) store_from_double(g.dv, t, vo + e, dvd[j * Dv + e]);
      }
    }
  }
  if (g.dsinks)
    for (int64_t h = 0; h < p.heads_q; ++h) store_from_double(g.dsinks, dsink_t, h, dsinks[h]);
  return Status::Ok();
}

}  // namespace

Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts) {
  AttentionGradCall c;
  c.name = "attention_backward";
  c.cuda = false;
  c.t = t;
  c.opts = opts;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
