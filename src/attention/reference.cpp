// float64 CPU reference of the attention family: the test oracle and the CPU implementation of the
// PyTorch op. The formula of attention.h in double, straight from the options (causal, window,
// softcap, scale as given, not the folded params), every output rounded once to its dtype.
// O(Sq * Sk * (Dqk + Dv)) per (batch, head): 2e9 multiply-adds take a few seconds.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention/attention_problem.h"
#include "common/host_convert.h"

namespace kernelforge {
namespace ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One sequence of the batch: its first query / key row and its lengths.
struct Seq {
  int64_t q0 = 0, sq = 0, k0 = 0, sk = 0;
};

// Reads cu_seqlens (host memory) and checks what the kernels assume: starts at 0, non-decreasing,
// ends at the token count, and no sequence longer than the max_seqlen bound when one is given.
Status read_cu(const AttentionCall& c, const TensorView& cu, const char* name, int64_t total, int64_t max_len,
               const char* max_name, std::vector<int64_t>* start, std::vector<int64_t>* len) {
  const int32_t* x = static_cast<const int32_t*>(cu.data);
  const int64_t B = cu.shape[0] - 1;
  auto fail = [&](const std::string& m) { return Status::Invalid(std::string(c.name) + ": " + name + " " + m); };
  if (x[0] != 0) return fail("must start at 0, got " + std::to_string(x[0]));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = int64_t(x[b + 1]) - x[b];
    if (n < 0)
      return fail("must be non-decreasing, got " + std::to_string(x[b]) + " then " + std::to_string(x[b + 1]) +
                  " at index " + std::to_string(b));
    if (max_len > 0 && n > max_len)
      return fail("holds a sequence of " + std::to_string(n) + " tokens (index " + std::to_string(b) + "), more than " +
                  max_name + " = " + std::to_string(max_len));
    (*start)[b] = x[b];
    (*len)[b] = n;
  }
  if (x[B] != total)
    return fail("must end at the token count " + std::to_string(total) + ", got " + std::to_string(x[B]));
  return Status::Ok();
}

Status run(const AttentionCall& c) {
  AttentionParams p;
  DType t;
  Status s = validate_attention(c, &p, &t);
  if (!s.ok()) return s;
  const TensorView& q = *c.t.q;
  const AttentionOptions& o = c.opts;
  const int64_t B = p.batch, Hq = p.heads_q, group = p.group, Dqk = p.head_dim_qk, Dv = p.head_dim_v;

  std::vector<Seq> seqs(static_cast<size_t>(B));
  if (p.varlen) {
    std::vector<int64_t> q0(B), sq(B), k0(B), sk(B);
    if (!(s = read_cu(c, *c.t.cu_seqlens_q, "cu_seqlens_q", q.shape[0], o.max_seqlen_q, "max_seqlen_q", &q0, &sq)).ok())
      return s;
    if (!(s = read_cu(c, *c.t.cu_seqlens_k, "cu_seqlens_k", c.t.k->shape[0], o.max_seqlen_k, "max_seqlen_k", &k0, &sk))
             .ok())
      return s;
    for (int64_t b = 0; b < B; ++b) seqs[b] = Seq{q0[b], sq[b], k0[b], sk[b]};
  } else {
    for (int64_t b = 0; b < B; ++b) seqs[b] = Seq{0, p.seqlen_q, 0, p.seqlen_k};
  }

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
            double dot = 0.0;
            const double* kj = kd.data() + j * Dqk;
            for (int64_t e = 0; e < Dqk; ++e) dot += qd[e] * kj[e];
            double sij = scale * dot;
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
