// float64 CPU reference of the decode family (decode_attention, kv_append, rope_kv_append, mla_decode): the test
// oracle and the CPU implementation of the PyTorch ops. The formulas of decode.h and mla.h in double,
// with the kernels' handling of out-of-range inputs (seq_lens clamped to [0, capacity], an
// out-of-range page reads zeros / is not written), every output rounded once to its dtype.
#include <cmath>
#include <limits>
#include <vector>

#include "common/host_convert.h"
#include "decode/decode_problem.h"

namespace kernelforge {
namespace ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t clamped_len(const int32_t* seq_lens, int64_t b, int64_t capacity) {
  const int64_t n = seq_lens[b];
  return n < 0 ? 0 : (n > capacity ? capacity : n);
}

// The page of key j of sequence b, or -1 when the block table points outside the cache.
template <typename P>
int64_t page_of(const P& p, int64_t b, int64_t j) {
  if (p.block_table == nullptr) return b;
  const int64_t page = p.block_table[b * p.bt_sb + (j >> p.page_shift)];
  return page >= 0 && page < p.pages ? page : -1;
}
template <typename P>
int64_t row_of(const P& p, int64_t j) {
  return p.block_table == nullptr ? j : (j & (p.page_size - 1));
}

}  // namespace

Status decode_attention(const DecodeTensors& t, const DecodeOptions& opts) {
  DecodeCall c;
  c.name = "decode_attention";
  c.cuda = false;
  c.t = t;
  c.opts = opts;
  DecodeParams p;
  DType dt;
  Status s = validate_decode(c, &p, &dt);
  if (!s.ok()) return s;
  const int64_t D = p.head_dim, Lq = p.q_len;
  const DType sink_t = t.sinks ? t.sinks->dtype : DType::kFloat32;
  const DType lse_t = t.lse ? t.lse->dtype : DType::kFloat32;
  const double scale = opts.scale > 0.0f ? double(opts.scale) : 1.0 / std::sqrt(double(D));
  const double softcap = opts.softcap;
  std::vector<double> kd, vd, qd(static_cast<size_t>(D)), sc, acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = clamped_len(p.seq_lens, b, p.capacity);
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      kd.assign(static_cast<size_t>(n * D), 0.0);
      vd.assign(static_cast<size_t>(n * D), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t page = page_of(p, b, j);
        if (page < 0) continue;  // zeros
        const int64_t ko = page * p.k_sp + row_of(p, j) * p.k_st + hk * p.k_sh;
        const int64_t vo = page * p.v_sp + row_of(p, j) * p.v_st + hk * p.v_sh;
        for (int64_t e = 0; e < D; ++e) {
          kd[j * D + e] = load_as_double(p.k_cache, dt, ko + e);
          vd[j * D + e] = load_as_double(p.v_cache, dt, vo + e);
        }
      }
      for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
        const double sink = p.sinks ? load_as_double(p.sinks, sink_t, h) : kNegInf;
        for (int64_t tq = 0; tq < Lq; ++tq) {
          const int64_t qo = b * p.q_sb + tq * p.q_st + h * p.q_sh;
          for (int64_t e = 0; e < D; ++e) qd[e] = load_as_double(p.q, dt, qo + e);
          const int64_t pos = n - Lq + tq;
          int64_t lo = opts.window_left >= 0 ? pos - opts.window_left : 0;
          if (p.key_starts != nullptr) lo = std::max(lo, int64_t(p.key_starts[b]));  // j < start: left padding
          sc.assign(static_cast<size_t>(n), kNegInf);
          double m = sink;
          for (int64_t j = 0; j < n; ++j) {
            if (j > pos || j < lo) continue;
            double x = 0.0;
            for (int64_t e = 0; e < D; ++e) x += qd[e] * kd[j * D + e];
            x *= scale;
            if (softcap > 0.0) x = softcap * std::tanh(x / softcap);
            sc[j] = x;
            m = std::max(m, x);
          }
          double den = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          if (m != kNegInf) {
            if (sink != kNegInf) den += std::exp(sink - m);
            for (int64_t j = 0; j < n; ++j) {
              if (sc[j] == kNegInf) continue;
              const double w = std::exp(sc[j] - m);
              den += w;
              for (int64_t e = 0; e < D; ++e) acc[e] += w * vd[j * D + e];
            }
          }
          const int64_t oo = b * p.o_sb + tq * p.o_st + h * p.o_sh;
          for (int64_t e = 0; e < D; ++e) store_from_double(t.out->data, dt, oo + e, den > 0.0 ? acc[e] / den : 0.0);
          if (t.lse != nullptr)
            store_from_double(t.lse->data, lse_t, b * p.lse_sb + tq * p.lse_st + h,
                              den > 0.0 ? m + std::log(den) : kNegInf);
        }
      }
    }
  }
  return Status::Ok();
}

Status kv_append(const KvAppendTensors& t) {
  KvAppendParams p;
  DType dt;
  Status s = validate_kv_append("kv_append", false, t, &p, &dt);
  if (!s.ok()) return s;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t tq = 0; tq < p.q_len; ++tq) {
      const int64_t pos = int64_t(p.seq_lens[b]) - p.q_len + tq;
      if (pos < 0 || pos >= p.capacity) continue;
      const int64_t page = page_of(p, b, pos);
      if (page < 0) continue;
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t kd = page * p.k_sp + row_of(p, pos) * p.k_st + h * p.k_sh;
        const int64_t vd = page * p.v_sp + row_of(p, pos) * p.v_st + h * p.v_sh;
        const int64_t ks = b * p.kn_sb + tq * p.kn_st + h * p.kn_sh, vs = b * p.vn_sb + tq * p.vn_st + h * p.vn_sh;
        for (int64_t e = 0; e < p.head_dim; ++e) {
          store_from_double(p.k_cache, dt, kd + e, load_as_double(p.k, dt, ks + e));
          store_from_double(p.v_cache, dt, vd + e, load_as_double(p.v, dt, vs + e));
        }
      }
    }
  return Status::Ok();
}

Status rope_kv_append(const RopeKvAppendTensors& t) {
  RopeKvAppendParams p;
  DType dt, ct;
  Status s = validate_rope_kv_append("rope_kv_append", false, t, &p, &dt, &ct);
  if (!s.ok()) return s;
  const KvAppendParams& a = p.kv;
  const int64_t D = a.head_dim, half = p.rot_dim / 2;
  // One head row: the pairs (i, i + R/2) read before either is written (q_out may be q), columns >= R
  // copied; table row r's first R/2 values (HF's halves are equal).
  auto rotate = [&](const void* in, int64_t io, void* out, int64_t oo, int64_t r) {
    for (int64_t i = 0; i < half; ++i) {
      const double c = load_as_double(p.cos, ct, r * p.cos_sp + i), sn = load_as_double(p.sin, ct, r * p.sin_sp + i);
      const double x0 = load_as_double(in, dt, io + i), x1 = load_as_double(in, dt, io + i + half);
      store_from_double(out, dt, oo + i, x0 * c - x1 * sn);
      store_from_double(out, dt, oo + i + half, x1 * c + x0 * sn);
    }
    for (int64_t e = 2 * half; e < D; ++e) store_from_double(out, dt, oo + e, load_as_double(in, dt, io + e));
  };
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t tq = 0; tq < a.q_len; ++tq) {
      const int64_t pos = int64_t(a.seq_lens[b]) - a.q_len + tq;
      const int64_t r = pos < 0 ? 0 : (pos >= p.max_pos ? p.max_pos - 1 : pos);  // the kernel's clamp
      for (int64_t h = 0; h < p.heads_q; ++h)
        rotate(p.q, b * p.q_sb + tq * p.q_st + h * p.q_sh, p.q_out, b * p.qo_sb + tq * p.qo_st + h * p.qo_sh, r);
      if (pos < 0 || pos >= a.capacity) continue;
      const int64_t page = page_of(a, b, pos);
      if (page < 0) continue;
      for (int64_t h = 0; h < a.heads_kv; ++h) {
        const int64_t kd = page * a.k_sp + row_of(a, pos) * a.k_st + h * a.k_sh;
        const int64_t vd = page * a.v_sp + row_of(a, pos) * a.v_st + h * a.v_sh;
        rotate(a.k, b * a.kn_sb + tq * a.kn_st + h * a.kn_sh, a.k_cache, kd, r);
        const int64_t vs = b * a.vn_sb + tq * a.vn_st + h * a.vn_sh;
        for (int64_t e = 0; e < D; ++e) store_from_double(a.v_cache, dt, vd + e, load_as_double(a.v, dt, vs + e));
      }
    }
  return Status::Ok();
}

Status mla_decode(const MlaDecodeTensors& t, const MlaDecodeOptions& opts) {
  MlaDecodeCall c;
  c.cuda = false;
  c.t = t;
  c.opts = opts;
  DecodeParams p;
  DType dt;
  Status s = validate_mla_decode(c, &p, &dt);
  if (!s.ok()) return s;
  const int64_t Dk = kMlaHeadDimK, Dv = kMlaHeadDimV, Lq = p.q_len;
  const DType lse_t = t.lse ? t.lse->dtype : DType::kFloat32;
  const double scale = opts.scale > 0.0f ? double(opts.scale) : 1.0 / std::sqrt(double(Dk));
  std::vector<double> kv, qd(static_cast<size_t>(Dk)), sc, acc(static_cast<size_t>(Dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = clamped_len(p.seq_lens, b, p.capacity);
    kv.assign(static_cast<size_t>(n * Dk), 0.0);  // rows of an out-of-range page stay zeros
    for (int64_t j = 0; j < n; ++j) {
      const int64_t page = page_of(p, b, j);
      if (page < 0) continue;
      const int64_t ko = page * p.k_sp + row_of(p, j) * p.k_st;
      for (int64_t e = 0; e < Dk; ++e) kv[j * Dk + e] = load_as_double(p.k_cache, dt, ko + e);
    }
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t tq = 0; tq < Lq; ++tq) {
        const int64_t qo = b * p.q_sb + tq * p.q_st + h * p.q_sh;
        for (int64_t e = 0; e < Dk; ++e) qd[e] = load_as_double(p.q, dt, qo + e);
        const int64_t pos = n - Lq + tq;  // keys j <= pos are visible
        sc.assign(static_cast<size_t>(n), kNegInf);
        double m = kNegInf;
        for (int64_t j = 0; j < n && j <= pos; ++j) {
          double x = 0.0;
          for (int64_t e = 0; e < Dk; ++e) x += qd[e] * kv[j * Dk + e];
          sc[j] = x * scale;
          m = std::max(m, sc[j]);
        }
        double den = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < n && m != kNegInf; ++j) {
          if (sc[j] == kNegInf) continue;
          const double w = std::exp(sc[j] - m);
          den += w;
          for (int64_t e = 0; e < Dv; ++e) acc[e] += w * kv[j * Dk + e];  // the value: the row's first 512 columns
        }
        const int64_t oo = b * p.o_sb + tq * p.o_st + h * p.o_sh;
        for (int64_t e = 0; e < Dv; ++e) store_from_double(t.out->data, dt, oo + e, den > 0.0 ? acc[e] / den : 0.0);
        if (t.lse != nullptr)
          store_from_double(t.lse->data, lse_t, b * p.lse_sb + tq * p.lse_st + h,
                            den > 0.0 ? m + std::log(den) : kNegInf);
      }
  }
  return Status::Ok();
}

}  // namespace ref
}  // namespace kernelforge
