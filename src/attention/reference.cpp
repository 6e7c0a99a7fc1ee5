// float64 CPU reference of the attention family: the test oracle and the CPU implementation of the
// PyTorch op. The formula of attention.h in double, straight from the options (causal, window,
// softcap, scale as given, not the folded params), every output rounded once to its dtype.
// O(Sq * Sk * (Dqk + Dv)) per (batch, head): 2e9 multiply-adds take a few seconds.
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

Status run(const AttentionCall& c) {
  AttentionParams p;
  DType t;
  Status s = validate_attention(c, &p, &t);
  if (!s.ok()) return s;
  const AttentionOptions& o = c.opts;
  const int64_t B = p.batch, group = p.group, Dqk = p.head_dim_qk, Dv = p.head_dim_v;

  std::vector<Seq> seqs;
  if (!(s = detail::read_seqs(c.name, c.t, o, p, &seqs)).ok()) return s;

  const double scale = o.scale > 0.0f ? double(o.scale) : 1.0 / std::sqrt(double(Dqk));
  const double softcap = o.softcap;
  const int64_t wl = o.window_left, wr = o.causal ? 0 : o.window_right;
  const DType lse_t = c.t.lse ? c.t.lse->dtype : DType::kFloat32;
  const DType sink_t = c.t.sinks ? c.t.sinks->dtype : DType::kFloat32;

  std::vector<double> kd, vd, qd(static_cast<size_t>(Dqk)), sc, acc(static_cast<size_t>(Dv));
  for (int64_t b = 0; b < B; ++b) {
    const Seq& seq = seqs[b];
    const int64_t d = seq.sk - seq.sq;  // bottom-right alignment
    kd.assign(static_cast<size_t>(seq.sk * Dqk), 0.0);
    vd.assign(static_cast<size_t>(seq.sk * Dv), 0.0);
    sc.assign(static_cast<size_t>(seq.sk), 0.0);
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
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
          for (int64_t e = 0; e < Dqk; ++e) qd[e] = load_as_double(p.q, t, qo + e);
          // s_ij for the visible keys (-inf for the others); m = max(max_j s_ij, sink)
          double m = sink;
          for (int64_t j = 0; j < seq.sk; ++j) {
            const bool visible = (wl < 0 || j >= i + d - wl) && (wr < 0 || j <= i + d + wr);
            if (!visible) {
              sc[j] = kNegInf;
              continue;
            }
            // q_i . k_j in four partial sums (every Dqk is a multiple of 4): independent adds pipeline
            const double* kj = kd.data() + j * Dqk;
            double part[4] = {0.0, 0.0, 0.0, 0.0};
            for (int64_t e = 0; e < Dqk; e += 4)
              for (int u = 0; u < 4; ++u) part[u] += qd[e + u] * kj[e + u];
            double sij = scale * ((part[0] + part[1]) + (part[2] + part[3]));
            if (softcap > 0.0) sij = softcap * std::tanh(sij / softcap);
            sc[j] = sij;
            if (sij > m) m = sij;
          }
          for (int64_t e = 0; e < Dv; ++e) acc[e] = 0.0;
          double lse = kNegInf;
          if (m != kNegInf) {  // some key (or the sink) is visible
            double l = std::exp(sink - m);
            for (int64_t j = 0; j < seq.sk; ++j) {
              if (sc[j] == kNegInf) continue;
              const double pj = std::exp(sc[j] - m);
              l += pj;
              const double* vj = vd.data() + j * Dv;
              for (int64_t e = 0; e < Dv; ++e) acc[e] += pj * vj[e];
            }
            for (int64_t e = 0; e < Dv; ++e) acc[e] /= l;
            lse = m + std::log(l);
          }
          const int64_t oo = b * p.o_sb + r * p.o_ss + h * p.o_sh;
          for (int64_t e = 0; e < Dv; ++e) store_from_double(p.out, t, oo + e, acc[e]);
          if (p.lse) store_from_double(p.lse, lse_t, b * p.lse_sb + h * p.lse_sh + r, lse);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status attention_forward(const AttentionTensors& t, const AttentionOptions& opts) {
  AttentionCall c;
  c.name = "attention_forward";
  c.cuda = false;
  c.t = t;
  c.opts = opts;
  return run(c);
}

}  // namespace ref
}  // namespace kernelforge
