// Argument checks for the RoPE family: the one place that validates (see rope_problem.h).
#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "common/validate_util.h"
#include "rope/rope_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::non_overlapping;
using validate_util::ranges_overlap;
using validate_util::shape_str;
using validate_util::strided_view_error;
using validate_util::strides_str;

struct Names {
  const char *q, *k, *q_out, *k_out;
};

struct Checker {
  const RopeCall& c;
  const TensorView* q = nullptr;
  const char* qname = "";
  explicit Checker(const RopeCall& call) : c(call) {}

  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  bool same_device(const TensorView& t) const {
    return t.device.type == q->device.type &&
           (q->device.type != DeviceType::kCUDA || t.device.index == q->device.index);
  }
  Status device_like_q(const TensorView& t, const char* name) const {
    if (!same_device(t))
      return fail(std::string(name) + " must be on the same device as " + qname + " (" + device_str(q->device) +
                  "), got " + device_str(t.device));
    return Status::Ok();
  }

  // Rank, sizes, unit last stride, non-negative strides, non-null data.
  Status basic(const TensorView& t, const char* name, int ndim_lo, int ndim_hi) const {
    if (t.ndim < ndim_lo || t.ndim > ndim_hi) {
      std::string want =
          ndim_lo == ndim_hi ? std::to_string(ndim_lo) : std::to_string(ndim_lo) + " or " + std::to_string(ndim_hi);
      return fail(std::string(name) + " must have " + want + " dimensions, got " + std::to_string(t.ndim));
    }
    const std::string layout = strided_view_error(t, name);
    return layout.empty() ? Status::Ok() : fail(layout);
  }

  Status qk_dtype(const TensorView& t, const char* name) const {
    const bool ok = t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16 ||
                    (!c.cuda && t.dtype == DType::kFloat64);
    if (!ok)
      return fail(std::string(name) + " must be a " + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                  " tensor, got " + dtype_name(t.dtype));
    return Status::Ok();
  }
};

// (b, s, h) strides of a 4-D head tensor in the given layout.
// A dimension of size 1 gets stride 0 (its index is always 0; PyTorch may give it any stride, which
// would otherwise needlessly rule out 16-byte vectors).
void bsh_strides(const TensorView& t, RopeLayout layout, int64_t* sb, int64_t* ss, int64_t* sh) {
  auto st = [&](int d) { return t.shape[d] == 1 ? int64_t{0} : t.strides[d]; };
  *sb = st(0);
  if (layout == RopeLayout::kBSHD) {
    *ss = st(1), *sh = st(2);
  } else {
    *sh = st(1), *ss = st(2);
  }
}

}  // namespace

Status validate_rope(const RopeCall& c, RopeParams* p, DType* dtype, DType* cs_dtype) {
  Checker ck(c);
  const Names nm = c.backward ? Names{"dq_out", "dk_out", "dq", "dk"} : Names{"q", "k", "q_out", "k_out"};
  if (c.q == nullptr) return ck.fail(std::string(nm.q) + " must not be null");
  const TensorView& q = *c.q;
  ck.q = &q;
  ck.qname = nm.q;
  Status s = ck.qk_dtype(q, nm.q);
  if (!s.ok()) return s;
  if (c.cuda && q.device.type != DeviceType::kCUDA)
    return ck.fail(std::string(nm.q) + " must be a CUDA tensor, got " + device_str(q.device) +
                   " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && q.device.type != DeviceType::kCPU)
    return ck.fail(std::string(nm.q) + " must be a CPU tensor for the reference, got " + device_str(q.device));
  const RopeLayout layout = c.opts.layout;
  if (layout != RopeLayout::kBSHD && layout != RopeLayout::kBHSD)
    return ck.fail("layout must be RopeLayout::kBSHD or RopeLayout::kBHSD, got " +
                   std::to_string(static_cast<int>(layout)));
  const bool bshd = layout == RopeLayout::kBSHD;
  const char* lay = bshd ? "[B, S, H, D] (layout bshd)" : "[B, H, S, D] (layout bhsd)";
  if (q.ndim != 4)
    return ck.fail(std::string(nm.q) + " must have 4 dimensions " + lay + ", got " + std::to_string(q.ndim) +
                   " dimensions " + shape_str(q));
  if (!(s = ck.basic(q, nm.q, 4, 4)).ok()) return s;
  const int64_t B = q.shape[0], S = bshd ? q.shape[1] : q.shape[2], Hq = bshd ? q.shape[2] : q.shape[1];
  const int64_t D = q.shape[3];
  if (D > INT_MAX || Hq > INT_MAX)
    return ck.fail(std::string(nm.q) + " head_dim and heads must be at most 2^31 - 1, got " + shape_str(q));

  // ---- k -------------------------------------------------------------------------------------
  if ((c.k == nullptr) != (c.k_out == nullptr))
    return ck.fail(std::string(nm.k) + " and " + nm.k_out + " must both be given or both be null");
  int64_t Hk = 0;
  if (c.k) {
    const TensorView& k = *c.k;
    if (k.dtype != q.dtype)
      return ck.fail(std::string(nm.k) + " must have the same dtype as " + nm.q + " (" + dtype_name(q.dtype) +
                     "), got " + dtype_name(k.dtype));
    if (!(s = ck.device_like_q(k, nm.k)).ok()) return s;
    if (k.ndim != 4)
      return ck.fail(std::string(nm.k) + " must have 4 dimensions " + lay + ", got " + std::to_string(k.ndim));
    if (!(s = ck.basic(k, nm.k, 4, 4)).ok()) return s;
    const int64_t kS = bshd ? k.shape[1] : k.shape[2];
    Hk = bshd ? k.shape[2] : k.shape[1];
    if (k.shape[0] != B || kS != S || k.shape[3] != D)
      return ck.fail(std::string(nm.k) + " must have the batch, sequence and head_dim of " + nm.q + " " + shape_str(q) +
                     " (" + lay + ", any number of heads), got " + shape_str(k));
    if (Hk > INT_MAX) return ck.fail(std::string(nm.k) + " heads must be at most 2^31 - 1");
  }

  // ---- cos / sin -----------------------------------------------------------------------------
  if (c.cos == nullptr || c.sin == nullptr) return ck.fail("cos and sin must not be null");
  const TensorView &cs = *c.cos, &sn = *c.sin;
  const bool cs_ok = cs.dtype == q.dtype || cs.dtype == DType::kFloat32;
  if (!cs_ok)
    return ck.fail(std::string("cos must have the dtype of ") + nm.q + " (" + dtype_name(q.dtype) +
                   ") or float32, got " + dtype_name(cs.dtype));
  if (sn.dtype != cs.dtype)
    return ck.fail(std::string("sin must have the dtype of cos (") + dtype_name(cs.dtype) + "), got " +
                   dtype_name(sn.dtype));
  if (!(s = ck.device_like_q(cs, "cos")).ok()) return s;
  if (!(s = ck.device_like_q(sn, "sin")).ok()) return s;
  if (!(s = ck.basic(cs, "cos", 2, 3)).ok()) return s;
  if (!(s = ck.basic(sn, "sin", 2, 3)).ok()) return s;
  if (!validate_util::same_shape(cs, sn))
    return ck.fail("sin must have the shape of cos " + shape_str(cs) + ", got " + shape_str(sn));
  const int64_t R = cs.size(-1);
  if (c.opts.rotary_dim != 0 && c.opts.rotary_dim != R)
    return ck.fail("rotary_dim (" + std::to_string(c.opts.rotary_dim) +
                   ") must equal the last dimension of cos and sin " + shape_str(cs) +
                   " (one cos/sin value per rotated column)");
  if (R < 2 || R % 2 != 0)
    return ck.fail("rotary_dim (the last dimension of cos and sin) must be even and at least 2, got " +
                   std::to_string(R));
  if (R > D)
    return ck.fail("rotary_dim (the last dimension of cos and sin) must not exceed head_dim " + std::to_string(D) +
                   ", got " + std::to_string(R));

  p->cos = cs.data;
  p->sin = sn.data;
  if (c.pos) {
    const TensorView& pos = *c.pos;
    if (pos.dtype != DType::kInt64)
      return ck.fail(std::string("position_ids must be an int64 tensor, got ") + dtype_name(pos.dtype));
    if (!(s = ck.device_like_q(pos, "position_ids")).ok()) return s;
    if (pos.ndim != 2 || (pos.shape[0] != B && pos.shape[0] != 1) || pos.shape[1] != S)
      return ck.fail("position_ids must have shape [B, S] = [" + std::to_string(B) + ", " + std::to_string(S) +
                     "] (or [1, S]), got " + shape_str(pos));
    for (int d = 0; d < 2; ++d)
      if (pos.strides[d] < 0) return ck.fail("position_ids must not have negative strides");
    if (pos.numel() > 0 && pos.data == nullptr) return ck.fail("position_ids has a null data pointer");
    if (cs.ndim != 2)
      return ck.fail("with position_ids, cos and sin must be a cache of shape [max_pos, rotary_dim], got " +
                     shape_str(cs));
    p->pos = static_cast<const int64_t*>(pos.data);
    p->pos_sb = pos.shape[0] == 1 ? 0 : pos.strides[0];
    p->pos_ss = pos.shape[1] == 1 ? 0 : pos.strides[1];
    p->max_pos = cs.shape[0];
    p->cos_sb = p->sin_sb = 0;
    p->cos_ss = cs.shape[0] == 1 ? 0 : cs.strides[0];
    p->sin_ss = sn.shape[0] == 1 ? 0 : sn.strides[0];
  } else {
    const bool ok2 = cs.ndim == 2 && cs.shape[0] == S;
    const bool ok3 = cs.ndim == 3 && (cs.shape[0] == B || cs.shape[0] == 1) && cs.shape[1] == S;
    if (!ok2 && !ok3)
      return ck.fail("cos and sin must have shape [S, rotary_dim] = [" + std::to_string(S) + ", " + std::to_string(R) +
                     "] or [B, S, rotary_dim] = [" + std::to_string(B) + ", " + std::to_string(S) + ", " +
                     std::to_string(R) + "] (or [1, S, rotary_dim]), got " + shape_str(cs) +
                     " (with position_ids: a cache [max_pos, rotary_dim])");
    p->pos = nullptr;
    p->max_pos = 0;
    const int sd = cs.ndim - 2;  // the sequence dimension
    p->cos_sb = cs.ndim == 3 && cs.shape[0] != 1 ? cs.strides[0] : 0;
    p->sin_sb = sn.ndim == 3 && sn.shape[0] != 1 ? sn.strides[0] : 0;
    p->cos_ss = S == 1 ? 0 : cs.strides[sd];
    p->sin_ss = S == 1 ? 0 : sn.strides[sd];
  }

  // ---- outputs -------------------------------------------------------------------------------
  auto output = [&](const TensorView* o, const TensorView& in, const char* name, const char* in_name,
                    RopeHeads* h) -> Status {
    if (o == nullptr) return ck.fail(std::string(name) + " must not be null");
    if (o->dtype != in.dtype)
      return ck.fail(std::string(name) + " must have the dtype of " + in_name + " (" + dtype_name(in.dtype) +
                     "), got " + dtype_name(o->dtype));
    Status st = ck.device_like_q(*o, name);
    if (!st.ok()) return st;
    if (!validate_util::same_shape(*o, in))
      return ck.fail(std::string(name) + " must have the shape of " + in_name + " " + shape_str(in) + ", got " +
                     shape_str(*o));
    if (!(st = ck.basic(*o, name, 4, 4)).ok()) return st;
    if (!non_overlapping(*o))
      return ck.fail(std::string(name) + " has overlapping elements (shape " + shape_str(*o) + ", strides " +
                     strides_str(*o) + "): outputs would race");
    bool same_strides = true;
    for (int d = 0; d < 4; ++d)
      if (in.shape[d] > 1 && in.strides[d] != o->strides[d]) same_strides = false;
    const bool inplace = in.numel() > 0 && o->data == in.data && same_strides;
    if (!inplace && ranges_overlap(in, *o))
      return ck.fail(std::string(name) + " overlaps " + in_name + " without being " + in_name +
                     " itself (in place needs the same data pointer and strides)");
    h->in = in.data;
    h->out = o->data;
    bsh_strides(in, layout, &h->in_sb, &h->in_ss, &h->in_sh);
    bsh_strides(*o, layout, &h->out_sb, &h->out_ss, &h->out_sh);
    h->inplace = inplace;
    return Status::Ok();
  };
  if (!(s = output(c.q_out, q, nm.q_out, nm.q, &p->t[0])).ok()) return s;
  p->t[0].heads = static_cast<int32_t>(Hq);
  p->t[1] = RopeHeads{};
  if (c.k) {
    if (!(s = output(c.k_out, *c.k, nm.k_out, nm.k, &p->t[1])).ok()) return s;
    p->t[1].heads = static_cast<int32_t>(Hk);
  }

  p->batch = B;
  p->seq = S;
  p->head_dim = static_cast<int32_t>(D);
  p->rot_dim = static_cast<int32_t>(R);
  p->interleaved = c.opts.interleaved;
  p->backward = c.backward;
  *dtype = q.dtype;
  *cs_dtype = cs.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
