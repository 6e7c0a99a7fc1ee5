// Argument checks of the decode family (decode_attention, kv_append, rope_kv_append, mla_decode): every message names
// the entry and the argument, and says what was expected.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "common/validate_util.h"
#include "decode/decode_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::non_overlapping;
using validate_util::ranges_overlap;
using validate_util::shape_str;
using validate_util::strides_str;

struct Check {
  const char* name;
  bool cuda;
  const TensorView* q;  // the reference tensor for device and dtype

  Status fail(const std::string& m) const { return Status::Invalid(std::string(name) + ": " + m); }

  Status basic(const TensorView* x, const char* arg, int ndim, const char* shape_desc) const {
    if (x == nullptr) return fail(std::string(arg) + " must not be null");
    if (x->ndim != ndim)
      return fail(std::string(arg) + " must have " + std::to_string(ndim) +
                  (ndim == 1 ? " dimension " : " dimensions ") + shape_desc + ", got " + std::to_string(x->ndim) +
                  " dimensions " + shape_str(*x));
    const std::string e = validate_util::strided_view_error(*x, arg);
    if (!e.empty()) return fail(e);
    const bool same_device =
        x->device.type == q->device.type && (q->device.type != DeviceType::kCUDA || x->device.index == q->device.index);
    if (!same_device)
      return fail(std::string(arg) + " must be on the same device as " + (x == q ? "itself" : "the other tensors") +
                  " (" + device_str(q->device) + "), got " + device_str(x->device));
    if (cuda && x->device.type != DeviceType::kCUDA)
      return fail(std::string(arg) + " must be a CUDA tensor, got " + device_str(x->device));
    return Status::Ok();
  }

  // The 16-bit float dtype of q (CUDA) or any float dtype (the CPU reference).
  Status float_dtype(const TensorView& x, const char* arg) const {
    const bool half = x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16;
    const bool wide = x.dtype == DType::kFloat32 || x.dtype == DType::kFloat64;
    if (!(half || (!cuda && wide)))
      return fail(std::string(arg) + " must be float16 or bfloat16" + (cuda ? "" : " (float32 / float64 on CPU)") +
                  ", got " + dtype_name(x.dtype));
    return Status::Ok();
  }

  Status same_dtype(const TensorView& x, const char* arg, const TensorView& ref, const char* ref_name) const {
    if (x.dtype != ref.dtype)
      return fail(std::string(arg) + " must have " + ref_name + "'s dtype (" + dtype_name(ref.dtype) + "), got " +
                  dtype_name(x.dtype));
    return Status::Ok();
  }

  // 16-byte cp.async of cache rows: base 16-byte aligned, every stride a multiple of 8 elements.
  Status aligned_cache(const TensorView& x, const char* arg) const {
    if (!cuda || x.numel() == 0) return Status::Ok();
    const bool ok =
        reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && (x.strides[0] | x.strides[1] | x.strides[2]) % 8 == 0;
    if (!ok)
      return fail(std::string(arg) +
                  " must start at a 16-byte aligned address with strides that are multiples of 8 "
                  "elements (16-byte row loads), got strides " +
                  strides_str(x));
    return Status::Ok();
  }
};

bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }
int log2_int(int64_t x) {
  int s = 0;
  while ((int64_t(1) << s) < x) ++s;
  return s;
}

// seq_lens and block_table, shared by both entries. Fills the paging fields.
template <typename P>
Status check_paging(const Check& ck, const TensorView* seq_lens, const TensorView* block_table, const TensorView& kc,
                    int64_t B, P* p, const char* cache = "k_cache") {
  Status s = ck.basic(seq_lens, "seq_lens", 1, "[B]");
  if (!s.ok()) return s;
  if (seq_lens->dtype != DType::kInt32)
    return ck.fail(std::string("seq_lens must be int32, got ") + dtype_name(seq_lens->dtype));
  if (seq_lens->shape[0] != B)
    return ck.fail("seq_lens must have shape [" + std::to_string(B) + "] (one length per sequence of q), got " +
                   shape_str(*seq_lens));
  if (B > 1 && seq_lens->strides[0] != 1)
    return ck.fail("seq_lens must be contiguous, got strides " + strides_str(*seq_lens));
  p->seq_lens = static_cast<const int32_t*>(seq_lens->data);
  p->pages = int32_t(kc.shape[0]);
  p->page_size = int32_t(kc.shape[1]);
  p->block_table = nullptr;
  if (block_table != nullptr) {
    if (!(s = ck.basic(block_table, "block_table", 2, "[B, max_pages]")).ok()) return s;
    if (block_table->dtype != DType::kInt32)
      return ck.fail(std::string("block_table must be int32, got ") + dtype_name(block_table->dtype));
    if (block_table->shape[0] != B)
      return ck.fail("block_table must have " + std::to_string(B) + " rows (one per sequence), got shape " +
                     shape_str(*block_table));
    if (!is_pow2(kc.shape[1]) || kc.shape[1] > 65536)
      return ck.fail(std::string(cache) +
                     "'s page size (dimension 1) must be a power of two up to 65536 with a block_table, got " +
                     std::to_string(kc.shape[1]));
    if (block_table->shape[1] * kc.shape[1] > INT32_MAX)
      return ck.fail("block_table's max_pages * page_size must fit int32, got " +
                     std::to_string(block_table->shape[1] * kc.shape[1]));
    p->block_table = static_cast<const int32_t*>(block_table->data);
    p->bt_sb = block_table->shape[0] > 1 ? block_table->strides[0] : 0;
    p->max_pages = int32_t(block_table->shape[1]);
    p->page_shift = log2_int(kc.shape[1]);
    p->capacity = int32_t(block_table->shape[1] * kc.shape[1]);
  } else {
    if (kc.shape[0] < B)
      return ck.fail(std::string(cache) +
                     " must hold at least one page per sequence without a block_table (page b is sequence b): "
                     "got " +
                     std::to_string(kc.shape[0]) + " pages for " + std::to_string(B) + " sequences");
    p->max_pages = 1;
    p->page_shift = 0;
    p->capacity = int32_t(kc.shape[1]);
  }
  return Status::Ok();
}

Status check_cache_pair(const Check& ck, const TensorView* kc, const TensorView* vc) {
  Status s = ck.basic(kc, "k_cache", 4, "[pages, page_size, Hkv, D]");
  if (!s.ok()) return s;
  if (!(s = ck.basic(vc, "v_cache", 4, "[pages, page_size, Hkv, D] (k_cache's shape)")).ok()) return s;
  if (!validate_util::same_shape(*kc, *vc))
    return ck.fail("v_cache must have k_cache's shape " + shape_str(*kc) + ", got " + shape_str(*vc));
  if (kc->shape[1] > INT32_MAX || kc->shape[0] > INT32_MAX)
    return ck.fail("k_cache's pages and page size must fit int32, got shape " + shape_str(*kc));
  if (!(s = ck.aligned_cache(*kc, "k_cache")).ok()) return s;
  return ck.aligned_cache(*vc, "v_cache");
}

}  // namespace

Status validate_decode(const DecodeCall& c, DecodeParams* p, DType* dtype) {
  const DecodeTensors& t = c.t;
  if (t.q == nullptr) return Status::Invalid(std::string(c.name) + ": q must not be null");
  const Check ck{c.name, c.cuda, t.q};
  Status s = ck.basic(t.q, "q", 4, "[B, Lq, Hq, D]");
  if (!s.ok()) return s;
  if (!(s = ck.float_dtype(*t.q, "q")).ok()) return s;
  if (!(s = check_cache_pair(ck, t.k_cache, t.v_cache)).ok()) return s;
  const TensorView &q = *t.q, &kc = *t.k_cache, &vc = *t.v_cache;
  if (!(s = ck.same_dtype(kc, "k_cache", q, "q")).ok()) return s;
  if (!(s = ck.same_dtype(vc, "v_cache", q, "q")).ok()) return s;
  const int64_t B = q.shape[0], Lq = q.shape[1], Hq = q.shape[2], D = q.shape[3], Hkv = kc.shape[2];
  if (kc.shape[3] != D)
    return ck.fail("k_cache's head dim (" + std::to_string(kc.shape[3]) + ") must equal q's (" + std::to_string(D) +
                   ")");
  if (D != 64 && D != 128 && D != 256) return ck.fail("q's head dim must be 64, 128 or 256, got " + std::to_string(D));
  if (Hkv == 0 || Hq % Hkv != 0)
    return ck.fail("q's heads (" + std::to_string(Hq) + ") must be a multiple of k_cache's kv heads (" +
                   std::to_string(Hkv) + ")");
  if (B > 65535) return ck.fail("q's batch must be at most 65535, got " + std::to_string(B));
  if (Lq < 1 || Lq > 64)
    return ck.fail("q must have 1 to 64 new tokens per sequence (dimension 1), got " + std::to_string(Lq));
  if (!(s = check_paging(ck, t.seq_lens, t.block_table, kc, B, p)).ok()) return s;

  if (!(s = ck.basic(t.out, "out", 4, "[B, Lq, Hq, D] (q's shape)")).ok()) return s;
  if (!validate_util::same_shape(*t.out, q))
    return ck.fail("out must have q's shape " + shape_str(q) + ", got " + shape_str(*t.out));
  if (!(s = ck.same_dtype(*t.out, "out", q, "q")).ok()) return s;
  if (t.lse != nullptr) {
    if (!(s = ck.basic(t.lse, "lse", 3, "[B, Lq, Hq]")).ok()) return s;
    if (t.lse->dtype != (c.cuda ? DType::kFloat32 : t.lse->dtype) ||
        (t.lse->dtype != DType::kFloat32 && t.lse->dtype != DType::kFloat64))
      return ck.fail(std::string("lse must be float32, got ") + dtype_name(t.lse->dtype));
    if (t.lse->shape[0] != B || t.lse->shape[1] != Lq || t.lse->shape[2] != Hq)
      return ck.fail("lse must have shape [" + std::to_string(B) + ", " + std::to_string(Lq) + ", " +
                     std::to_string(Hq) + "], got " + shape_str(*t.lse));
  }
  if (t.sinks != nullptr) {
    if (!(s = ck.basic(t.sinks, "sinks", 1, "[Hq]")).ok()) return s;
    if (t.sinks->shape[0] != Hq)
      return ck.fail("sinks must have shape [" + std::to_string(Hq) + "] (one logit per query head), got " +
                     shape_str(*t.sinks));
    if (t.sinks->dtype != DType::kFloat32 && t.sinks->dtype != q.dtype &&
        !(!c.cuda && t.sinks->dtype == DType::kFloat64))
      return ck.fail(std::string("sinks must be float32 or q's dtype (") + dtype_name(q.dtype) + "), got " +
                     dtype_name(t.sinks->dtype));
    if (Hq > 1 && t.sinks->strides[0] != 1)
      return ck.fail("sinks must be contiguous, got strides " + strides_str(*t.sinks));
  }
  if (t.key_starts != nullptr) {
    if (!(s = ck.basic(t.key_starts, "key_starts", 1, "[B]")).ok()) return s;
    if (t.key_starts->dtype != DType::kInt32)
      return ck.fail(std::string("key_starts must be int32, got ") + dtype_name(t.key_starts->dtype));
    if (t.key_starts->shape[0] != B)
      return ck.fail("key_starts must have shape [" + std::to_string(B) +
                     "] (the first visible key of each sequence of q), got " + shape_str(*t.key_starts));
    if (B > 1 && t.key_starts->strides[0] != 1)
      return ck.fail("key_starts must be contiguous, got strides " + strides_str(*t.key_starts));
  }
  const DecodeOptions& o = c.opts;
  if (!(std::isfinite(o.scale) && o.scale >= 0.0f)) return ck.fail("scale must be finite and >= 0 (0: 1 / sqrt(D))");
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.0f)) return ck.fail("softcap must be finite and >= 0 (0: none)");
  if (o.window_left < -1)
    return ck.fail("window_left must be >= 0 or -1 (unbounded), got " + std::to_string(o.window_left));
  if (o.max_seq_len < 0)
    return ck.fail("max_seq_len must be >= 0 (0: the cache capacity), got " + std::to_string(o.max_seq_len));

  p->q = q.data;
  p->k_cache = kc.data;
  p->v_cache = vc.data;
  p->out = t.out->data;
  p->lse = t.lse != nullptr ? static_cast<float*>(t.lse->data) : nullptr;
  p->sinks = t.sinks != nullptr ? t.sinks->data : nullptr;
  p->sinks_float = t.sinks == nullptr || t.sinks->dtype == DType::kFloat32;
  p->key_starts = t.key_starts != nullptr ? static_cast<const int32_t*>(t.key_starts->data) : nullptr;
  p->q_sb = q.strides[0], p->q_st = q.strides[1], p->q_sh = q.strides[2];
  p->o_sb = t.out->strides[0], p->o_st = t.out->strides[1], p->o_sh = t.out->strides[2];
  if (t.lse != nullptr) p->lse_sb = t.lse->strides[0], p->lse_st = t.lse->strides[1];
  if (t.lse != nullptr && Hq > 1 && t.lse->strides[2] != 1)
    return ck.fail("lse must be contiguous in its last dimension, got strides " + strides_str(*t.lse));
  p->k_sp = kc.strides[0], p->k_st = kc.strides[1], p->k_sh = kc.strides[2];
  p->v_sp = vc.strides[0], p->v_st = vc.strides[1], p->v_sh = vc.strides[2];
  p->batch = int32_t(B);
  p->q_len = int32_t(Lq);
  p->heads_q = int32_t(Hq);
  p->heads_kv = int32_t(Hkv);
  p->group = int32_t(Hkv > 0 ? Hq / Hkv : 1);
  p->rows = p->group * p->q_len;
  p->head_dim = int32_t(D);
  p->scale = o.scale > 0.0f ? o.scale : float(1.0 / std::sqrt(double(D)));
  p->softcap = o.softcap;
  p->window_left = o.window_left < 0 ? -1 : int32_t(o.window_left > INT32_MAX ? INT32_MAX : o.window_left);
  p->max_seq_len = o.max_seq_len > 0 && o.max_seq_len < p->capacity ? o.max_seq_len : p->capacity;
  *dtype = q.dtype;
  return Status::Ok();
}

Status validate_kv_append(const char* name, bool cuda, const KvAppendTensors& t, KvAppendParams* p, DType* dtype) {
  if (t.k == nullptr) return Status::Invalid(std::string(name) + ": k must not be null");
  const Check ck{name, cuda, t.k};
  Status s = ck.basic(t.k, "k", 4, "[B, Lq, Hkv, D]");
  if (!s.ok()) return s;
  if (!(s = ck.float_dtype(*t.k, "k")).ok()) return s;
  if (!(s = ck.basic(t.v, "v", 4, "[B, Lq, Hkv, D] (k's shape)")).ok()) return s;
  if (!validate_util::same_shape(*t.k, *t.v))
    return ck.fail("v must have k's shape " + shape_str(*t.k) + ", got " + shape_str(*t.v));
  if (!(s = ck.same_dtype(*t.v, "v", *t.k, "k")).ok()) return s;
  if (!(s = check_cache_pair(ck, t.k_cache, t.v_cache)).ok()) return s;
  if (!(s = ck.same_dtype(*t.k_cache, "k_cache", *t.k, "k")).ok()) return s;
  if (!(s = ck.same_dtype(*t.v_cache, "v_cache", *t.k, "k")).ok()) return s;
  const TensorView &k = *t.k, &kc = *t.k_cache;
  if (k.shape[2] != kc.shape[2] || k.shape[3] != kc.shape[3])
    return ck.fail("k's heads and head dim " + shape_str(k) + " must match k_cache's [.., .., " +
                   std::to_string(kc.shape[2]) + ", " + std::to_string(kc.shape[3]) + "]");
  if (k.shape[1] < 1) return ck.fail("k must have at least one new token per sequence (dimension 1)");
  if (!(s = check_paging(ck, t.seq_lens, t.block_table, kc, k.shape[0], p)).ok()) return s;
  p->k_cache = t.k_cache->data;
  p->v_cache = t.v_cache->data;
  p->k = k.data;
  p->v = t.v->data;
  p->k_sp = kc.strides[0], p->k_st = kc.strides[1], p->k_sh = kc.strides[2];
  p->v_sp = t.v_cache->strides[0], p->v_st = t.v_cache->strides[1], p->v_sh = t.v_cache->strides[2];
  p->kn_sb = k.strides[0], p->kn_st = k.strides[1], p->kn_sh = k.strides[2];
  p->vn_sb = t.v->strides[0], p->vn_st = t.v->strides[1], p->vn_sh = t.v->strides[2];
  p->batch = int32_t(k.shape[0]);
  p->q_len = int32_t(k.shape[1]);
  p->heads_kv = int32_t(k.shape[2]);
  p->head_dim = int32_t(k.shape[3]);
  *dtype = k.dtype;
  return Status::Ok();
}

Status validate_rope_kv_append(const char* name, bool cuda, const RopeKvAppendTensors& t, RopeKvAppendParams* p,
                               DType* dtype, DType* cs_dtype) {
  KvAppendTensors kt;
  kt.k_cache = t.k_cache, kt.v_cache = t.v_cache, kt.k = t.k, kt.v = t.v, kt.seq_lens = t.seq_lens;
  kt.block_table = t.block_table;
  Status s = validate_kv_append(name, cuda, kt, &p->kv, dtype);
  if (!s.ok()) return s;
  const Check ck{name, cuda, t.k};
  const TensorView& k = *t.k;
  if (!(s = ck.basic(t.q, "q", 4, "[B, Lq, Hq, D]")).ok()) return s;
  const TensorView& q = *t.q;
  if (!(s = ck.same_dtype(q, "q", k, "k")).ok()) return s;
  if (q.shape[0] != k.shape[0] || q.shape[1] != k.shape[1] || q.shape[3] != k.shape[3])
    return ck.fail("q must have k's batch, new tokens and head dim [" + std::to_string(k.shape[0]) + ", " +
                   std::to_string(k.shape[1]) + ", Hq, " + std::to_string(k.shape[3]) + "], got " + shape_str(q));
  if (q.shape[2] > INT32_MAX) return ck.fail("q's heads must fit int32, got " + std::to_string(q.shape[2]));
  if (!(s = ck.basic(t.q_out, "q_out", 4, "[B, Lq, Hq, D] (q's shape)")).ok()) return s;
  const TensorView& qo = *t.q_out;
  if (!validate_util::same_shape(qo, q))
    return ck.fail("q_out must have q's shape " + shape_str(q) + ", got " + shape_str(qo));
  if (!(s = ck.same_dtype(qo, "q_out", q, "q")).ok()) return s;
  if (!non_overlapping(qo))
    return ck.fail("q_out has overlapping elements (shape " + shape_str(qo) + ", strides " + strides_str(qo) +
                   "): outputs would race");
  bool same_strides = true;
  for (int d = 0; d < 4; ++d)
    if (q.shape[d] > 1 && q.strides[d] != qo.strides[d]) same_strides = false;
  const bool inplace = q.numel() > 0 && qo.data == q.data && same_strides;
  if (!inplace && ranges_overlap(q, qo))
    return ck.fail("q_out overlaps q without being q itself (in place needs the same data pointer and strides)");

  if (!(s = ck.basic(t.cos, "cos", 2, "[max_pos, rotary_dim]")).ok()) return s;
  if (!(s = ck.basic(t.sin, "sin", 2, "[max_pos, rotary_dim] (cos's shape)")).ok()) return s;
  const TensorView &cs = *t.cos, &sn = *t.sin;
  if (!validate_util::same_shape(sn, cs))
    return ck.fail("sin must have cos's shape " + shape_str(cs) + ", got " + shape_str(sn));
  if (!(s = ck.same_dtype(sn, "sin", cs, "cos")).ok()) return s;
  if (cs.dtype != DType::kFloat32 && cs.dtype != q.dtype && !(!cuda && cs.dtype == DType::kFloat64))
    return ck.fail(std::string("cos must be float32 or q's dtype (") + dtype_name(q.dtype) + "), got " +
                   dtype_name(cs.dtype));
  const int64_t R = cs.shape[1], D = q.shape[3];
  if (R < 2 || R % 2 != 0 || R > D)
    return ck.fail("cos's rotary_dim (dimension 1) must be even and within [2, " + std::to_string(D) +
                   "] (the head dim), got " + std::to_string(R));
  if (cs.shape[0] < 1 || cs.shape[0] > INT32_MAX)
    return ck.fail("cos must have 1 to 2^31 - 1 positions (dimension 0), got " + std::to_string(cs.shape[0]));

  p->q = q.data;
  p->q_out = qo.data;
  p->cos = cs.data;
  p->sin = sn.data;
  p->q_sb = q.strides[0], p->q_st = q.strides[1], p->q_sh = q.strides[2];
  p->qo_sb = qo.strides[0], p->qo_st = qo.strides[1], p->qo_sh = qo.strides[2];
  p->cos_sp = cs.strides[0], p->sin_sp = sn.strides[0];
  p->heads_q = int32_t(q.shape[2]);
  p->max_pos = int32_t(cs.shape[0]);
  p->rot_dim = int32_t(R);
  p->q_inplace = inplace;
  *cs_dtype = cs.dtype;
  return Status::Ok();
}

Status validate_mla_decode(const MlaDecodeCall& c, DecodeParams* p, DType* dtype) {
  const MlaDecodeTensors& t = c.t;
  if (t.q == nullptr) return Status::Invalid(std::string(c.name) + ": q must not be null");
  const Check ck{c.name, c.cuda, t.q};
  Status s = ck.basic(t.q, "q", 4, "[B, Lq, H, 576]");
  if (!s.ok()) return s;
  if (!(s = ck.float_dtype(*t.q, "q")).ok()) return s;
  if (!(s = ck.basic(t.kv_cache, "kv_cache", 3, "[pages, page_size, 576]")).ok()) return s;
  const TensorView &q = *t.q, &kc = *t.kv_cache;
  if (!(s = ck.same_dtype(kc, "kv_cache", q, "q")).ok()) return s;
  const int64_t B = q.shape[0], Lq = q.shape[1], H = q.shape[2];
  if (q.shape[3] != kMlaHeadDimK)
    return ck.fail("q's last dimension must be " + std::to_string(kMlaHeadDimK) + " (512 latent + 64 rope), got " +
                   std::to_string(q.shape[3]));
  if (kc.shape[2] != kMlaHeadDimK)
    return ck.fail("kv_cache's last dimension must be " + std::to_string(kMlaHeadDimK) +
                   " (512 latent + 64 rope), got shape " + shape_str(kc));
  if (kc.shape[1] > INT32_MAX || kc.shape[0] > INT32_MAX)
    return ck.fail("kv_cache's pages and page size must fit int32, got shape " + shape_str(kc));
  if (H < 1 || H > 128) return ck.fail("q must have 1 to 128 heads (dimension 2), got " + std::to_string(H));
  if (Lq < 1 || Lq > 8)
    return ck.fail("q must have 1 to 8 new tokens per sequence (dimension 1), got " + std::to_string(Lq));
  if (B > 65535) return ck.fail("q's batch must be at most 65535, got " + std::to_string(B));
  if (c.cuda && q.numel() > 0) {  // 16-byte cp.async of q rows
    const bool ok =
        reinterpret_cast<uintptr_t>(q.data) % 16 == 0 && (q.strides[0] | q.strides[1] | q.strides[2]) % 8 == 0;
    if (!ok)
      return ck.fail(
          "q must start at a 16-byte aligned address with strides that are multiples of 8 elements (16-byte row "
          "loads), got strides " +
          strides_str(q));
  }
  if (c.cuda && kc.numel() > 0) {
    const bool ok = reinterpret_cast<uintptr_t>(kc.data) % 16 == 0 && (kc.strides[0] | kc.strides[1]) % 8 == 0;
    if (!ok)
      return ck.fail(
          "kv_cache must start at a 16-byte aligned address with strides that are multiples of 8 elements (16-byte "
          "row loads), got strides " +
          strides_str(kc));
  }
  if (!(s = check_paging(ck, t.seq_lens, t.block_table, kc, B, p, "kv_cache")).ok()) return s;

  if (!(s = ck.basic(t.out, "out", 4, "[B, Lq, H, 512]")).ok()) return s;
  if (t.out->shape[0] != B || t.out->shape[1] != Lq || t.out->shape[2] != H || t.out->shape[3] != kMlaHeadDimV)
    return ck.fail("out must have shape [" + std::to_string(B) + ", " + std::to_string(Lq) + ", " + std::to_string(H) +
                   ", " + std::to_string(kMlaHeadDimV) + "] (q's with the 512 latent columns), got " +
                   shape_str(*t.out));
  if (!(s = ck.same_dtype(*t.out, "out", q, "q")).ok()) return s;
  if (t.lse != nullptr) {
    if (!(s = ck.basic(t.lse, "lse", 3, "[B, Lq, H]")).ok()) return s;
    if (t.lse->dtype != (c.cuda ? DType::kFloat32 : t.lse->dtype) ||
        (t.lse->dtype != DType::kFloat32 && t.lse->dtype != DType::kFloat64))
      return ck.fail(std::string("lse must be float32, got ") + dtype_name(t.lse->dtype));
    if (t.lse->shape[0] != B || t.lse->shape[1] != Lq || t.lse->shape[2] != H)
      return ck.fail("lse must have shape [" + std::to_string(B) + ", " + std::to_string(Lq) + ", " +
                     std::to_string(H) + "], got " + shape_str(*t.lse));
    if (H > 1 && t.lse->strides[2] != 1)
      return ck.fail("lse must be contiguous in its last dimension, got strides " + strides_str(*t.lse));
  }
  const MlaDecodeOptions& o = c.opts;
  if (!(std::isfinite(o.scale) && o.scale >= 0.0f)) return ck.fail("scale must be finite and >= 0 (0: 1 / sqrt(576))");
  if (o.max_seq_len < 0)
    return ck.fail("max_seq_len must be >= 0 (0: the cache capacity), got " + std::to_string(o.max_seq_len));

  p->q = q.data;
  p->k_cache = kc.data;
  p->v_cache = kc.data;  // values: the first 512 columns of the same rows
  p->out = t.out->data;
  p->lse = t.lse != nullptr ? static_cast<float*>(t.lse->data) : nullptr;
  p->sinks = nullptr;
  p->sinks_float = true;
  p->q_sb = q.strides[0], p->q_st = q.strides[1], p->q_sh = q.strides[2];
  p->o_sb = t.out->strides[0], p->o_st = t.out->strides[1], p->o_sh = t.out->strides[2];
  if (t.lse != nullptr) p->lse_sb = t.lse->strides[0], p->lse_st = t.lse->strides[1];
  p->k_sp = kc.strides[0], p->k_st = kc.strides[1], p->k_sh = 0;
  p->v_sp = kc.strides[0], p->v_st = kc.strides[1], p->v_sh = 0;
  p->batch = int32_t(B);
  p->q_len = int32_t(Lq);
  p->heads_q = int32_t(H);
  p->heads_kv = 1;
  p->group = int32_t(H);
  p->rows = p->group * p->q_len;
  p->head_dim = kMlaHeadDimK;
  p->scale = o.scale > 0.0f ? o.scale : float(1.0 / std::sqrt(double(kMlaHeadDimK)));
  p->softcap = 0.0f;
  p->window_left = -1;
  p->max_seq_len = o.max_seq_len > 0 && o.max_seq_len < p->capacity ? o.max_seq_len : p->capacity;
  *dtype = q.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
