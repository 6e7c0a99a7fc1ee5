// Argument checks of the attention backward (see attention_problem.h): the forward's through
// validate_attention (lse required), then dout and the gradients; and the AttentionGradParams ->
// AttentionProblem summary the backward planner reads.
#include <cstdint>
#include <string>
#include <utility>

#include "attention/attention_plan.h"
#include "attention/attention_problem.h"
#include "attention/attention_validate_util.h"

namespace kernelforge {

namespace {

using attention_validate::Checker;
using attention_validate::may_overlap;
using attention_validate::stride_or_0;
using validate_util::shape_str;

using Named = std::pair<const TensorView*, const char*>;

}  // namespace

Status validate_attention_backward(const AttentionGradCall& c, AttentionGradParams* p, DType* dtype) {
  AttentionCall fc;
  fc.name = c.name;
  fc.cuda = c.cuda;
  fc.t = c.t.fwd;
  fc.opts = c.opts;
  Status s = validate_attention(fc, &p->f, dtype);
  if (!s.ok()) return s;
  Checker ck(c.name, c.t.fwd);
  const AttentionTensors& t = c.t.fwd;
  const TensorView &q = *t.q, &k = *t.k, &v = *t.v, &out = *t.out;
  ck.q = &q;
  if (t.lse == nullptr)
    return ck.fail(std::string("lse must not be null: the backward needs the forward's logsumexp (") +
                   (c.cuda ? "float32" : "float32/float64") +
                   (c.opts.layout == AttentionLayout::kVarlen ? " [Hq, Tq])" : " [B, Hq, Sq])"));
  const bool varlen = c.opts.layout == AttentionLayout::kVarlen;
  const int nd = varlen ? 3 : 4;
  const int sd = varlen ? 0 : c.opts.layout == AttentionLayout::kBSHD ? 1 : 2;
  const int hd = varlen ? 1 : c.opts.layout == AttentionLayout::kBSHD ? 2 : 1;
  const char* lname = varlen                                    ? " (layout varlen)"
                      : c.opts.layout == AttentionLayout::kBSHD ? " (layout bshd)"
                                                                : " (layout bhsd)";

  // ---- dout and the gradients: non-null, q's dtype and device, the shape of their partner -------
  struct Grad {
    const TensorView* x;
    const char* name;
    const TensorView* like;  // the tensor whose shape it has
    const char* like_name;
  };
  const Grad grads[] = {
      {c.t.dout, "dout", &out, "out"}, {c.t.dq, "dq", &q, "q"}, {c.t.dk, "dk", &k, "k"}, {c.t.dv, "dv", &v, "v"}};
  for (const Grad& g : grads) {
    if (g.x == nullptr) return ck.fail(std::string(g.name) + " must not be null");
    const TensorView& x = *g.x;
    if (x.dtype != q.dtype)
      return ck.fail(std::string(g.name) + " must have the dtype of q (" + dtype_name(q.dtype) + "), got " +
                     dtype_name(x.dtype));
    if (!(s = ck.same_device_as_q(x, g.name)).ok()) return s;
    if (!(s = ck.basic(x, g.name, nd, (shape_str(*g.like) + lname).c_str())).ok()) return s;
    bool same = true;
    for (int d = 0; d < nd; ++d) same = same && x.shape[d] == g.like->shape[d];
    if (!same)
      return ck.fail(std::string(g.name) + " must have shape " + shape_str(*g.like) + " (the shape of " + g.like_name +
                     "), got " + shape_str(x));
  }

  // ---- dsinks: float32 [Hq] exactly when sinks is given -----------------------------------------
  const int64_t Hq = q.shape[hd];
  if (t.sinks != nullptr && c.t.dsinks == nullptr)
    return ck.fail("dsinks must not be null when sinks is given (float32 [" + std::to_string(Hq) + "])");
  if (t.sinks == nullptr && c.t.dsinks != nullptr) return ck.fail("dsinks must be null when sinks is not given");
  if (c.t.dsinks) {
    const TensorView& ds = *c.t.dsinks;
    const bool ok = ds.dtype == DType::kFloat32 || (!c.cuda && ds.dtype == DType::kFloat64);
    if (!ok)
      return ck.fail(std::string("dsinks must be a ") + (c.cuda ? "float32" : "float32/float64") + " tensor, got " +
                     dtype_name(ds.dtype));
    if (!(s = ck.same_device_as_q(ds, "dsinks")).ok()) return s;
    if (!(s = ck.basic(ds, "dsinks", 1, "[Hq]")).ok()) return s;
    if (!(s = ck.expect_shape(ds, "dsinks", {Hq}, "(one gradient per query head, like sinks)")).ok()) return s;
  }

  // ---- no gradient overlaps itself, another gradient or any input -------------------------------
  const Named outs[] = {{c.t.dq, "dq"}, {c.t.dk, "dk"}, {c.t.dv, "dv"}, {c.t.dsinks, "dsinks"}};
  const Named ins[] = {{t.q, "q"},
                       {t.k, "k"},
                       {t.v, "v"},
                       {t.out, "out"},
                       {c.t.dout, "dout"},
                       {t.lse, "lse"},
                       {t.sinks, "sinks"},
                       {t.cu_seqlens_q, "cu_seqlens_q"},
                       {t.cu_seqlens_k, "cu_seqlens_k"}};
  for (size_t i = 0; i < 4; ++i) {
    if (outs[i].first == nullptr) continue;
    const TensorView& g = *outs[i].first;
    if (!attention_validate::non_overlapping(g))
      return ck.fail(std::string(outs[i].second) + " has overlapping elements (shape " + shape_str(g) + ", strides " +
                     validate_util::strides_str(g) + "): gradients would race");
    for (const Named& in : ins)
      if (in.first != nullptr && may_overlap(g, *in.first))
        return ck.fail(std::string(outs[i].second) + " must not overlap " + in.second +
                       " (the backward does not run in place)");
    for (size_t j = 0; j < i; ++j)
      if (outs[j].first != nullptr && may_overlap(g, *outs[j].first))
        return ck.fail(std::string(outs[i].second) + " must not overlap " + outs[j].second);
  }

  // ---- params ---------------------------------------------------------------------------------
  auto strides = [&](const TensorView& x, int64_t* sb, int64_t* ss, int64_t* sh) {
    *sb = varlen ? 0 : stride_or_0(x, 0);
    *ss = stride_or_0(x, sd);
    *sh = stride_or_0(x, hd);
  };
  p->dout = c.t.dout->data;
  p->dq = c.t.dq->data;
  p->dk = c.t.dk->data;
  p->dv = c.t.dv->data;
  p->dsinks = c.t.dsinks ? static_cast<float*>(c.t.dsinks->data) : nullptr;
  strides(*c.t.dout, &p->do_sb, &p->do_ss, &p->do_sh);
  strides(*c.t.dq, &p->dq_sb, &p->dq_ss, &p->dq_sh);
  strides(*c.t.dk, &p->dk_sb, &p->dk_ss, &p->dk_sh);
  strides(*c.t.dv, &p->dv_sb, &p->dv_ss, &p->dv_sh);
  p->deterministic = c.opts.deterministic;
  return Status::Ok();
}

AttentionProblem make_attention_bwd_problem(const AttentionGradParams& p, DType dtype) {
  AttentionProblem pr = make_attention_problem(p.f, dtype);
  pr.total_k = p.f.total_k;
  pr.deterministic = p.deterministic;
  // TMA also loads dout and stores dq / dk / dv: the same 16-byte rule for their bases and strides
  const int64_t eb = pr.elem_bytes;
  auto aligned_ptr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto aligned_strides = [&](int64_t sb, int64_t ss, int64_t sh) {
    return (sb * eb) % 16 == 0 && (ss * eb) % 16 == 0 && (sh * eb) % 16 == 0;
  };
  pr.tma_ok = pr.tma_ok && aligned_ptr(p.dout) && aligned_ptr(p.dq) && aligned_ptr(p.dk) && aligned_ptr(p.dv) &&
              aligned_strides(p.do_sb, p.do_ss, p.do_sh) && aligned_strides(p.dq_sb, p.dq_ss, p.dq_sh) &&
              aligned_strides(p.dk_sb, p.dk_ss, p.dk_sh) && aligned_strides(p.dv_sb, p.dv_ss, p.dv_sh);
  return pr;
}

}  // namespace kernelforge
