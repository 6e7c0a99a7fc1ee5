// Argument checks for the attention family: the one place that validates (see attention_problem.h),
// and the AttentionParams -> AttentionProblem summary the planner reads.
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "attention/attention_plan.h"
#include "attention/attention_problem.h"
#include "attention/attention_validate_util.h"
#include "common/validate_util.h"

namespace kernelforge {

namespace {

using attention_validate::Checker;
using attention_validate::ranges_overlap;
using attention_validate::stride_or_0;
using validate_util::device_str;
using validate_util::shape_str;

// Supported (Dqk, Dv) pairs: the head dims the kernels are compiled for.
bool supported_head_dims(int64_t dqk, int64_t dv) {
  if (dqk == 192 && dv == 128) return true;  // MLA prefill (DeepSeek V2/V3)
  return dqk == dv && (dqk == 64 || dqk == 96 || dqk == 128 || dqk == 256);
}

}  // namespace

Status validate_attention(const AttentionCall& c, AttentionParams* p, DType* dtype) {
  Checker ck(c.name, c.t);
  const AttentionTensors& t = c.t;
  const AttentionOptions& o = c.opts;
  if (t.q == nullptr) return ck.fail("q must not be null");
  if (t.k == nullptr) return ck.fail("k must not be null");
  if (t.v == nullptr) return ck.fail("v must not be null");
  if (t.out == nullptr) return ck.fail("out must not be null");
  const TensorView &q = *t.q, &k = *t.k, &v = *t.v, &out = *t.out;
  ck.q = &q;

  // ---- dtype and device of q -----------------------------------------------------------------
  const bool q_dtype_ok =
      q.dtype == DType::kFloat16 || q.dtype == DType::kBFloat16 || (!c.cuda && q.dtype == DType::kFloat64);
  if (!q_dtype_ok)
    return ck.fail(std::string("q must be a ") + (c.cuda ? "float16/bfloat16" : "float16/bfloat16/float64") +
                   " tensor, got " + dtype_name(q.dtype));
  if (c.cuda && q.device.type != DeviceType::kCUDA)
    return ck.fail("q must be a CUDA tensor, got " + device_str(q.device) + " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && q.device.type != DeviceType::kCPU)
    return ck.fail("q must be a CPU tensor for the reference, got " + device_str(q.device));
  const std::pair<const TensorView*, const char*> same_dtype[] = {{&k, "k"}, {&v, "v"}, {&out, "out"}};
  for (const auto& x : same_dtype) {
    if (x.first->dtype != q.dtype)
      return ck.fail(std::string(x.second) + " must have the dtype of q (" + dtype_name(q.dtype) + "), got " +
                     dtype_name(x.first->dtype));
    Status s = ck.same_device_as_q(*x.first, x.second);
    if (!s.ok()) return s;
  }

  // ---- layout, ranks, sizes ------------------------------------------------------------------
  const AttentionLayout layout = o.layout;
  if (layout != AttentionLayout::kBSHD && layout != AttentionLayout::kBHSD && layout != AttentionLayout::kVarlen)
    return ck.fail("layout must be AttentionLayout::kBSHD, kBHSD or kVarlen, got " +
                   std::to_string(static_cast<int>(layout)));
  const bool varlen = layout == AttentionLayout::kVarlen, bshd = layout == AttentionLayout::kBSHD;
  const char* qdesc = varlen ? "[Tq, Hq, Dqk] (layout varlen)"
                      : bshd ? "[B, Sq, Hq, Dqk] (layout bshd)"
                             : "[B, Hq, Sq, Dqk] (layout bhsd)";
  const char* kdesc = varlen ? "[Tk, Hkv, Dqk] (layout varlen)"
                      : bshd ? "[B, Sk, Hkv, Dqk] (layout bshd)"
                             : "[B, Hkv, Sk, Dqk] (layout bhsd)";
  const char* vdesc = varlen ? "[Tk, Hkv, Dv] (layout varlen)"
                      : bshd ? "[B, Sk, Hkv, Dv] (layout bshd)"
                             : "[B, Hkv, Sk, Dv] (layout bhsd)";
  const char* odesc = varlen ? "[Tq, Hq, Dv] (layout varlen)"
                      : bshd ? "[B, Sq, Hq, Dv] (layout bshd)"
                             : "[B, Hq, Sq, Dv] (layout bhsd)";
  const int nd = varlen ? 3 : 4;
  Status s;
  if (!(s = ck.basic(q, "q", nd, qdesc)).ok()) return s;
  if (!(s = ck.basic(k, "k", nd, kdesc)).ok()) return s;
  if (!(s = ck.basic(v, "v", nd, vdesc)).ok()) return s;
  if (!(s = ck.basic(out, "out", nd, odesc)).ok()) return s;

  // Dimension indices of (sequence, head) in this layout; the batch (dense layouts) is dimension 0.
  const int sd = varlen ? 0 : bshd ? 1 : 2, hd = varlen ? 1 : bshd ? 2 : 1;
  const int64_t Sq = q.shape[sd], Hq = q.shape[hd], Dqk = q.shape[nd - 1];
  const int64_t Sk = k.shape[sd], Hkv = k.shape[hd], Dv = v.shape[nd - 1];

  int64_t B = 0;
  if (varlen) {
    if (t.cu_seqlens_q == nullptr || t.cu_seqlens_k == nullptr)
      return ck.fail("cu_seqlens_q and cu_seqlens_k are required with layout varlen (int32 [B + 1])");
    const std::pair<const TensorView*, const char*> cus[] = {{t.cu_seqlens_q, "cu_seqlens_q"},
                                                             {t.cu_seqlens_k, "cu_seqlens_k"}};
    for (const auto& x : cus) {
      const TensorView& cu = *x.first;
      if (cu.dtype != DType::kInt32)
        return ck.fail(std::string(x.second) + " must be an int32 tensor, got " + dtype_name(cu.dtype));
      if (!(s = ck.same_device_as_q(cu, x.second)).ok()) return s;
      if (cu.ndim != 1 || cu.shape[0] < 1)
        return ck.fail(std::string(x.second) + " must have shape [B + 1] (at least one element), got " + shape_str(cu));
      if (cu.shape[0] > 1 && cu.strides[0] != 1)
        return ck.fail(std::string(x.second) + " must be contiguous (stride 1), got stride " +
                       std::to_string(cu.strides[0]));
      if (cu.data == nullptr) return ck.fail(std::string(x.second) + " has a null data pointer");
    }
    B = t.cu_seqlens_q->shape[0] - 1;
    if (t.cu_seqlens_k->shape[0] != B + 1)
      return ck.fail("cu_seqlens_k must have the shape of cu_seqlens_q [" + std::to_string(B + 1) + "] (B + 1), got " +
                     shape_str(*t.cu_seqlens_k));
  } else {
    if (t.cu_seqlens_q != nullptr || t.cu_seqlens_k != nullptr)
      return ck.fail("cu_seqlens_q and cu_seqlens_k must be null unless the layout is varlen");
    B = q.shape[0];
  }

  if (varlen) {
    if (!(s = ck.expect_shape(k, "k", {Sk, Hkv, Dqk}, "(Tk, Hkv, and the Dqk of q)")).ok()) return s;
    if (!(s = ck.expect_shape(v, "v", {Sk, Hkv, Dv}, "(the Tk and Hkv of k)")).ok()) return s;
    if (!(s = ck.expect_shape(out, "out", {Sq, Hq, Dv}, "(the Tq and Hq of q, the Dv of v)")).ok()) return s;
  } else if (bshd) {
    if (!(s = ck.expect_shape(k, "k", {B, Sk, Hkv, Dqk}, "(the B and Dqk of q)")).ok()) return s;
    if (!(s = ck.expect_shape(v, "v", {B, Sk, Hkv, Dv}, "(the B, Sk and Hkv of k)")).ok()) return s;
    if (!(s = ck.expect_shape(out, "out", {B, Sq, Hq, Dv}, "(the B, Sq and Hq of q, the Dv of v)")).ok()) return s;
  } else {
    if (!(s = ck.expect_shape(k, "k", {B, Hkv, Sk, Dqk}, "(the B and Dqk of q)")).ok()) return s;
    if (!(s = ck.expect_shape(v, "v", {B, Hkv, Sk, Dv}, "(the B, Hkv and Sk of k)")).ok()) return s;
    if (!(s = ck.expect_shape(out, "out", {B, Hq, Sq, Dv}, "(the B, Hq and Sq of q, the Dv of v)")).ok()) return s;
  }
  if (Hq > 0 && Hkv == 0) return ck.fail("k must have at least one head when q has " + std::to_string(Hq));
  if (Hkv > 0 && Hq % Hkv != 0)
    return ck.fail("the heads of q (Hq = " + std::to_string(Hq) +
                   ") must be a multiple of the heads of k and v (Hkv = " + std::to_string(Hkv) + ")");
  if (!supported_head_dims(Dqk, Dv))
    return ck.fail("head dims (Dqk = " + std::to_string(Dqk) + " of q and k, Dv = " + std::to_string(Dv) +
                   " of v) must be Dqk = Dv in {64, 96, 128, 256} or Dqk = 192 with Dv = 128");
  const std::pair<int64_t, const char*> limits[] = {
      {B, "the batch"}, {Sq, varlen ? "Tq" : "Sq"}, {Sk, varlen ? "Tk" : "Sk"}, {Hq, "Hq"}, {Hkv, "Hkv"}};
  for (const auto& x : limits)
    if (x.first > INT_MAX)
      return ck.fail(std::string(x.second) + " must be at most 2^31 - 1, got " + std::to_string(x.first));

  // ---- lse -----------------------------------------------------------------------------------
  if (t.lse) {
    const TensorView& lse = *t.lse;
    const bool lse_ok = lse.dtype == DType::kFloat32 || (!c.cuda && lse.dtype == DType::kFloat64);
    if (!lse_ok)
      return ck.fail(std::string("lse must be a ") + (c.cuda ? "float32" : "float32/float64") + " tensor, got " +
                     dtype_name(lse.dtype));
    if (!(s = ck.same_device_as_q(lse, "lse")).ok()) return s;
    if (varlen) {
      if (!(s = ck.basic(lse, "lse", 2, "[Hq, Tq] (layout varlen)")).ok()) return s;
      if (!(s = ck.expect_shape(lse, "lse", {Hq, Sq}, "([Hq, Tq] of q)")).ok()) return s;
    } else {
      if (!(s = ck.basic(lse, "lse", 3, "[B, Hq, Sq]")).ok()) return s;
      if (!(s = ck.expect_shape(lse, "lse", {B, Hq, Sq}, "([B, Hq, Sq] of q)")).ok()) return s;
    }
    if (!(s = ck.no_alias(lse, "lse")).ok()) return s;
    if (ranges_overlap(lse, out)) return ck.fail("lse must not overlap out");
  }

  // ---- sinks ---------------------------------------------------------------------------------
  if (t.sinks) {
    const TensorView& sk = *t.sinks;
    const bool sk_ok = sk.dtype == DType::kFloat32 || sk.dtype == q.dtype || (!c.cuda && sk.dtype == DType::kFloat64);
    if (!sk_ok)
      return ck.fail(std::string("sinks must be float32 or the dtype of q (") + dtype_name(q.dtype) + ")" +
                     (c.cuda ? "" : " or float64") + ", got " + dtype_name(sk.dtype));
    if (!(s = ck.same_device_as_q(sk, "sinks")).ok()) return s;
    if (!(s = ck.basic(sk, "sinks", 1, "[Hq]")).ok()) return s;
    if (!(s = ck.expect_shape(sk, "sinks", {Hq}, "(one logit per query head)")).ok()) return s;
  }

  // ---- out -----------------------------------------------------------------------------------
  if (!(s = ck.no_alias(out, "out")).ok()) return s;

  // ---- options -------------------------------------------------------------------------------
  if (o.window_left < -1)
    return ck.fail("window_left must be -1 (unbounded) or >= 0, got " + std::to_string(o.window_left));
  if (o.window_right < -1)
    return ck.fail("window_right must be -1 (unbounded) or >= 0, got " + std::to_string(o.window_right));
  if (o.causal && o.window_right > 0)
    return ck.fail("causal is window_right = 0; causal with window_right = " + std::to_string(o.window_right) +
                   " contradicts it (pass one or the other)");
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f)
    return ck.fail("softcap must be finite and >= 0 (0: none), got " + std::to_string(o.softcap));
  if (!std::isfinite(o.scale) || o.scale < 0.0f)
    return ck.fail("scale must be finite and >= 0 (0: 1 / sqrt(Dqk)), got " + std::to_string(o.scale));
  if (o.max_seqlen_q < 0 || o.max_seqlen_k < 0)
    return ck.fail("max_seqlen_q and max_seqlen_k must be >= 0 (0: the total token count), got " +
                   std::to_string(o.max_seqlen_q) + " and " + std::to_string(o.max_seqlen_k));

  // Per-sequence length bounds: every sequence's lengths (dense), or the caller's upper bounds
  // (varlen; 0 or more than the totals: the totals).
  int64_t seq_q = Sq, seq_k = Sk;
  if (varlen) {
    if (o.max_seqlen_q > 0 && o.max_seqlen_q < Sq) seq_q = o.max_seqlen_q;
    if (o.max_seqlen_k > 0 && o.max_seqlen_k < Sk) seq_k = o.max_seqlen_k;
  }
  // A window that reaches every key is no window. Row i of a sequence (Sq_b <= seq_q, Sk_b <= seq_k)
  // has d = Sk_b - Sq_b and i + d in [Sk_b - Sq_b, Sk_b - 1], so j >= i + d - wl holds for every key
  // j >= 0 once wl >= seq_k - 1, and j <= i + d + wr for every j <= Sk_b - 1 once wr >= seq_q - 1.
  // Dropping such a window keeps the planner on the unmasked path (causal decode, Sq = 1, is not
  // causal at all) and leaves window values below 2^31 for the kernels' int32 index math.
  int64_t wl = o.window_left, wr = o.causal ? 0 : o.window_right;
  if (wl >= 0 && wl >= seq_k - 1) wl = -1;
  if (wr >= 0 && wr >= seq_q - 1) wr = -1;

  // ---- params --------------------------------------------------------------------------------
  *p = AttentionParams{};
  p->q = q.data, p->k = k.data, p->v = v.data, p->out = out.data;
  p->lse = t.lse ? static_cast<float*>(t.lse->data) : nullptr;
  p->sinks = t.sinks ? t.sinks->data : nullptr;
  p->sinks_float = t.sinks ? t.sinks->dtype == DType::kFloat32 : true;
  p->cu_seqlens_q = varlen ? static_cast<const int32_t*>(t.cu_seqlens_q->data) : nullptr;
  p->cu_seqlens_k = varlen ? static_cast<const int32_t*>(t.cu_seqlens_k->data) : nullptr;
  auto strides = [&](const TensorView& x, int64_t* sb, int64_t* ss, int64_t* sh) {
    *sb = varlen ? 0 : stride_or_0(x, 0);
    *ss = stride_or_0(x, sd);
    *sh = stride_or_0(x, hd);
  };
  strides(q, &p->q_sb, &p->q_ss, &p->q_sh);
  strides(k, &p->k_sb, &p->k_ss, &p->k_sh);
  strides(v, &p->v_sb, &p->v_ss, &p->v_sh);
  strides(out, &p->o_sb, &p->o_ss, &p->o_sh);
  if (t.lse) {
    p->lse_sb = varlen ? 0 : stride_or_0(*t.lse, 0);
    p->lse_sh = stride_or_0(*t.lse, varlen ? 0 : 1);
  }
  p->batch = static_cast<int32_t>(B);
  p->heads_q = static_cast<int32_t>(Hq);
  p->heads_kv = static_cast<int32_t>(Hkv);
  p->group = Hkv > 0 ? static_cast<int32_t>(Hq / Hkv) : 1;
  p->seqlen_q = static_cast<int32_t>(seq_q);
  p->seqlen_k = static_cast<int32_t>(seq_k);
  p->total_q = varlen ? Sq : B * Sq;
  p->total_k = varlen ? Sk : B * Sk;
  p->head_dim_qk = static_cast<int32_t>(Dqk);
  p->head_dim_v = static_cast<int32_t>(Dv);
  p->scale = o.scale > 0.0f ? o.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dqk)));
  p->softcap = o.softcap;
  p->window_left = static_cast<int32_t>(wl);
  p->window_right = static_cast<int32_t>(wr);
  p->varlen = varlen;
  *dtype = q.dtype;
  return Status::Ok();
}

AttentionProblem make_attention_problem(const AttentionParams& p, DType dtype) {
  AttentionProblem pr;
  pr.elem_bytes = static_cast<int>(dtype_size(dtype));
  pr.bf16 = dtype == DType::kBFloat16;
  pr.batch = p.batch;
  pr.heads_q = p.heads_q;
  pr.heads_kv = p.heads_kv;
  pr.seqlen_q = p.seqlen_q;
  pr.seqlen_k = p.seqlen_k;
  pr.total_q = p.total_q;
  pr.head_dim_qk = p.head_dim_qk;
  pr.head_dim_v = p.head_dim_v;
  pr.varlen = p.varlen;
  pr.causal = p.window_right == 0;
  pr.window = p.window_left >= 0 || p.window_right > 0;
  pr.softcap = p.softcap > 0.0f;
  pr.sinks = p.sinks != nullptr;
  pr.lse = p.lse != nullptr;
  // TMA (cp.async.bulk.tensor) needs 16-byte aligned bases and strides that are multiples of 16 bytes.
  const int64_t eb = pr.elem_bytes;
  auto aligned_ptr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto aligned_strides = [&](int64_t sb, int64_t ss, int64_t sh) {
    return (sb * eb) % 16 == 0 && (ss * eb) % 16 == 0 && (sh * eb) % 16 == 0;
  };
  pr.tma_ok = aligned_ptr(p.q) && aligned_ptr(p.k) && aligned_ptr(p.v) && aligned_ptr(p.out) &&
              aligned_strides(p.q_sb, p.q_ss, p.q_sh) && aligned_strides(p.k_sb, p.k_ss, p.k_sh) &&
              aligned_strides(p.v_sb, p.v_ss, p.v_sh) && aligned_strides(p.o_sb, p.o_ss, p.o_sh);
  return pr;
}

}  // namespace kernelforge
