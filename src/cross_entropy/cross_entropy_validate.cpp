// Argument checks for the cross-entropy family: the one place that validates (see
// cross_entropy_problem.h). Every message names the op, the argument and what was expected.
#include <climits>
#include <cmath>
#include <string>

#include "common/validate_util.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/flce_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::shape_str;
using validate_util::strides_str;

// The options' ranges, shared by the cross-entropy and the fused linear cross-entropy: "" or why not.
std::string options_error(const CrossEntropyOptions& o) {
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0))
    return "label_smoothing must be in [0, 1], got " + std::to_string(o.label_smoothing);
  if (!(o.z_loss_scale >= 0.0) || !std::isfinite(o.z_loss_scale))
    return "z_loss_scale must be finite and >= 0, got " + std::to_string(o.z_loss_scale);
  if (!(o.softcap >= 0.0) || !std::isfinite(o.softcap))
    return "softcap must be finite and > 0 (or 0 / None: no softcap), got " + std::to_string(o.softcap);
  if (o.reduction != Reduction::kNone && o.reduction != Reduction::kMean && o.reduction != Reduction::kSum)
    return "reduction must be none (0), mean (1) or sum (2), got " + std::to_string(int(o.reduction));
  return "";
}

struct Checker {
  const CeCall& c;
  explicit Checker(const CeCall& call) : c(call) {}

  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  Status same_device(const TensorView& t, const char* name) const {
    const TensorView& l = *c.logits;
    if (t.device.type != l.device.type || (l.device.type == DeviceType::kCUDA && t.device.index != l.device.index))
      return fail(std::string(name) + " must be on the same device as logits (" + device_str(l.device) + "), got " +
                  device_str(t.device));
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    return Status::Ok();
  }

  // A float32 vector of `n` elements: contiguous unless `any_stride`.
  Status f32_vector(const TensorView* t, const char* name, int64_t n, bool any_stride, int64_t* stride) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = same_device(*t, name);
    if (!s.ok()) return s;
    if (t->dtype != DType::kFloat32) return fail(std::string(name) + " must be float32, got " + dtype_name(t->dtype));
    if (t->ndim != 1 || t->shape[0] != n)
      return fail(std::string(name) + " must have shape [" + std::to_string(n) + "], got " + shape_str(*t));
    if (!any_stride && n > 1 && t->strides[0] != 1)
      return fail(std::string(name) + " must be contiguous, got stride " + std::to_string(t->strides[0]));
    if (stride) *stride = t->strides[0];
    return Status::Ok();
  }

  // A float32 tensor of one element (any shape, e.g. [] or [1]).
  Status f32_scalar(const TensorView* t, const char* name) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = same_device(*t, name);
    if (!s.ok()) return s;
    if (t->dtype != DType::kFloat32) return fail(std::string(name) + " must be float32, got " + dtype_name(t->dtype));
    if (t->numel() != 1) return fail(std::string(name) + " must have one element, got shape " + shape_str(*t));
    return Status::Ok();
  }

  Status run(CeParams* p, DType* dtype) const {
    const CrossEntropyOptions& o = c.opts;
    if (c.logits == nullptr) return fail("logits must not be null");
    const TensorView& l = *c.logits;
    const bool float_ok = l.dtype == DType::kFloat32 || l.dtype == DType::kFloat16 || l.dtype == DType::kBFloat16 ||
                          (!c.cuda && l.dtype == DType::kFloat64);
    if (!float_ok)
      return fail(std::string("logits must be a ") + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                  " tensor, got " + dtype_name(l.dtype));
    if (c.cuda && l.device.type != DeviceType::kCUDA) return fail("logits must be a CUDA tensor, got a CPU tensor");
    if (!c.cuda && l.device.type != DeviceType::kCPU)
      return fail("the reference takes CPU tensors, got logits on " + device_str(l.device));
    if (l.ndim != 2) return fail("logits must have shape [tokens, vocab] (2 dimensions), got " + shape_str(l));
    if (l.numel() > 0 && l.data == nullptr) return fail("logits has a null data pointer");
    const int64_t rows = l.shape[0], vocab = l.shape[1];
    if (vocab < 1) return fail("logits must have at least one class (vocab >= 1), got shape " + shape_str(l));
    if (vocab > INT_MAX) return fail("logits: vocab must be below 2^31, got " + std::to_string(vocab));
    int64_t ld = vocab;
    if (rows > 0) {
      const std::string why = validate_util::collapse_rows(l, &ld);
      if (!why.empty()) return fail("logits" + why);
    }
    // options
    const std::string bad_option = options_error(o);
    if (!bad_option.empty()) return fail(bad_option);
    const int64_t classes = o.num_classes == 0 ? vocab : o.num_classes;
    if (o.class_start < 0 || o.num_classes < 0 || o.class_start > classes - vocab)
      return fail("a vocabulary shard must lie inside the classes: class_start (" + std::to_string(o.class_start) +
                  ") >= 0 and class_start + vocab (" + std::to_string(o.class_start + vocab) + ") <= num_classes (" +
                  std::to_string(classes) + "; 0 means vocab)");
    // target
    if (c.target == nullptr) return fail("target must not be null");
    const TensorView& t = *c.target;
    Status s = same_device(t, "target");
    if (!s.ok()) return s;
    if (t.dtype != DType::kInt64 && t.dtype != DType::kInt32)
      return fail(std::string("target must be an int64 (or int32) tensor of class indices, got ") +
                  dtype_name(t.dtype));
    if (t.ndim != 1 || t.shape[0] != rows)
      return fail("target must have shape [" + std::to_string(rows) + "] to match logits " + shape_str(l) + ", got " +
                  shape_str(t));
    // The CUDA grids have rows x (segments or tiles) CTAs along x.
    if (c.cuda && rows * (ce_segments(vocab, DType::kFloat32) + 1) > INT_MAX)
      return fail("too many logits rows for one call (" + std::to_string(rows) + "); split the call");

    *dtype = l.dtype;
    p->logits = l.data;
    p->ld = ld;
    p->target = t.data;
    p->target_stride = t.ndim == 1 ? t.strides[0] : 1;
    p->target64 = t.dtype == DType::kInt64;
    p->rows = rows;
    p->vocab = vocab;
    p->class_start = o.class_start;
    p->classes = classes;
    p->ignore_index = o.ignore_index;
    p->smoothing = float(o.label_smoothing);
    p->z_loss = float(o.z_loss_scale);
    p->softcap = float(o.softcap);
    p->reduction = o.reduction;

    if (!c.backward) {
      if (!(s = f32_vector(c.row_loss, "row_loss", rows, false, nullptr)).ok()) return s;
      if (!(s = f32_vector(c.lse_out, "lse", rows, false, nullptr)).ok()) return s;
      if (!(s = f32_scalar(c.valid_out, "valid")).ok()) return s;
      if (o.reduction != Reduction::kNone && !(s = f32_scalar(c.loss, "loss")).ok()) return s;
      p->row_loss = static_cast<float*>(c.row_loss->data);
      p->lse_out = static_cast<float*>(c.lse_out->data);
      p->valid_out = static_cast<float*>(c.valid_out->data);
      p->loss = o.reduction != Reduction::kNone ? static_cast<float*>(c.loss->data) : nullptr;
      return Status::Ok();
    }
    // backward
    int64_t dstride = 0;
    if (o.reduction == Reduction::kNone) {
      if (!(s = f32_vector(c.dloss, "dloss", rows, true, &dstride)).ok()) return s;
    } else if (!(s = f32_scalar(c.dloss, "dloss")).ok()) {
      return s;
    }
    if (!(s = f32_vector(c.lse, "lse", rows, false, nullptr)).ok()) return s;
    if (!(s = f32_scalar(c.valid, "valid")).ok()) return s;
    if (c.dlogits == nullptr) return fail("dlogits must not be null");
    const TensorView& d = *c.dlogits;
    if (!(s = same_device(d, "dlogits")).ok()) return s;
    if (d.dtype != l.dtype)
      return fail(std::string("dlogits must have the dtype of logits (") + dtype_name(l.dtype) + "), got " +
                  dtype_name(d.dtype));
    if (d.ndim != 2 || d.shape[0] != rows || d.shape[1] != vocab)
      return fail("dlogits must have the shape of logits " + shape_str(l) + ", got " + shape_str(d));
    int64_t dld = vocab;
    if (rows > 0) {
      const std::string why = validate_util::collapse_rows(d, &dld);
      if (!why.empty()) return fail("dlogits" + why);
      if (rows > 1 && dld < vocab) return fail("dlogits rows overlap (row stride " + std::to_string(dld) + " < vocab)");
    }
    p->dloss = static_cast<const float*>(c.dloss->data);
    p->dloss_stride = dstride;
    p->lse = static_cast<const float*>(c.lse->data);
    p->valid = static_cast<const float*>(c.valid->data);
    p->dlogits = d.data;
    p->dld = dld;
    return Status::Ok();
  }
};

}  // namespace

Status validate_cross_entropy(const CeCall& c, CeParams* p, DType* dtype) { return Checker(c).run(p, dtype); }

int64_t flce_padded_vocab(int64_t vocab, DType dtype) {
  const int64_t per16 = 16 / int64_t(dtype_size(dtype));
  return (vocab + per16 - 1) / per16 * per16;
}

Status validate_flce(const char* name, bool cuda, bool backward, const FlceTensors& t, const CrossEntropyOptions& o,
                     FlceParams* p) {
  auto fail = [&](const std::string& m) { return Status::Invalid(std::string(name) + ": " + m); };
  if (t.hidden == nullptr || t.weight == nullptr || t.target == nullptr || t.lse == nullptr)
    return fail("hidden, weight, target and lse must not be null");
  const TensorView& h = *t.hidden;
  const TensorView& w = *t.weight;
  const bool float_ok = h.dtype == DType::kFloat32 || h.dtype == DType::kFloat16 || h.dtype == DType::kBFloat16 ||
                        (!cuda && h.dtype == DType::kFloat64);
  if (!float_ok)
    return fail(std::string("hidden must be a ") + (cuda ? "float32/float16/bfloat16" : "floating-point") +
                " tensor, got " + dtype_name(h.dtype));
  if (cuda && h.device.type != DeviceType::kCUDA) return fail("hidden must be a CUDA tensor, got a CPU tensor");
  if (!cuda && h.device.type != DeviceType::kCPU)
    return fail("the reference takes CPU tensors, got hidden on " + device_str(h.device));
  if (h.ndim != 2) return fail("hidden must have shape [tokens, hidden] (2 dimensions), got " + shape_str(h));
  const int64_t tokens = h.shape[0], hid = h.shape[1];
  if (w.ndim != 2 || w.shape[1] != hid)
    return fail("weight must have shape [vocab, " + std::to_string(hid) + "] to match hidden's last dimension, got " +
                shape_str(w));
  const int64_t vocab = w.shape[0];
  if (vocab < 1) return fail("weight must have at least one row (vocab >= 1)");
  // A matrix [rows, H]: stride 1 along H, rows apart (the GEMMs read it row-major).
  auto rows_of = [&](const TensorView& v, const char* arg, int64_t* ld) -> Status {
    std::string e = validate_util::placement_error(v, arg, h, "hidden", cuda);
    if (e.empty()) e = validate_util::strided_view_error(v, arg);
    if (!e.empty()) return fail(e);
    *ld = v.shape[0] > 1 ? v.strides[0] : v.shape[1];
    if (v.shape[0] > 1 && v.numel() > 0 && *ld < v.shape[1])
      return fail(std::string(arg) + "'s rows overlap (row stride " + std::to_string(*ld) + " < " +
                  std::to_string(v.shape[1]) + ")");
    return Status::Ok();
  };
  Status s = rows_of(h, "hidden", &p->ldh);
  if (!s.ok()) return s;
  if (!(s = rows_of(w, "weight", &p->ldw)).ok()) return s;
  if (t.bias != nullptr) {
    const TensorView& b = *t.bias;
    std::string e = validate_util::placement_error(b, "bias", h, "hidden", cuda);
    if (!e.empty()) return fail(e);
    if (b.ndim != 1 || b.shape[0] != vocab)
      return fail("bias must have shape [" + std::to_string(vocab) + "], got " + shape_str(b));
    if (vocab > 1 && b.strides[0] != 1) return fail("bias must be contiguous, got strides " + strides_str(b));
  }
  // target
  const TensorView& tg = *t.target;
  if (tg.dtype != DType::kInt64 && tg.dtype != DType::kInt32)
    return fail(std::string("target must be an int64 (or int32) tensor of class indices, got ") + dtype_name(tg.dtype));
  if (tg.ndim != 1 || tg.shape[0] != tokens)
    return fail("target must have shape [" + std::to_string(tokens) + "] to match hidden's tokens, got " +
                shape_str(tg));
  if (tg.device.type != h.device.type || tg.device.index != h.device.index)
    return fail("target must be on hidden's device (" + device_str(h.device) + "), got " + device_str(tg.device));
  if (tokens > 0 && tg.data == nullptr) return fail("target has a null data pointer");
  // options
  if (o.class_start != 0 || o.num_classes != 0)
    return fail("vocabulary shards (class_start, num_classes) are not taken: the weight holds every class");
  const std::string bad_option = options_error(o);
  if (!bad_option.empty()) return fail(bad_option);
  // float32 vectors and scalars
  auto f32 = [&](const TensorView* v, const char* arg, bool vector, bool any_stride) -> Status {
    if (v == nullptr) return fail(std::string(arg) + " must not be null");
    if (v->device.type != h.device.type || v->device.index != h.device.index)
      return fail(std::string(arg) + " must be on hidden's device (" + device_str(h.device) + "), got " +
                  device_str(v->device));
    if (v->dtype != DType::kFloat32) return fail(std::string(arg) + " must be float32, got " + dtype_name(v->dtype));
    if (!vector) {
      if (v->numel() != 1) return fail(std::string(arg) + " must have one element, got shape " + shape_str(*v));
    } else if (v->ndim != 1 || v->shape[0] != tokens) {
      return fail(std::string(arg) + " must have shape [" + std::to_string(tokens) + "], got " + shape_str(*v));
    } else if (!any_stride && tokens > 1 && v->strides[0] != 1) {
      return fail(std::string(arg) + " must be contiguous, got strides " + strides_str(*v));
    }
    if (v->numel() > 0 && v->data == nullptr) return fail(std::string(arg) + " has a null data pointer");
    return Status::Ok();
  };
  if (!(s = f32(t.lse, "lse", true, false)).ok()) return s;
  if (backward) {
    if (o.reduction != Reduction::kNone)
      return fail("the backward entry takes reduction none (mean and sum compute their gradients in the forward)");
    if (!(s = f32(t.dloss, "dloss", true, true)).ok()) return s;
  } else {
    if (!(s = f32(t.row_loss, "row_loss", true, false)).ok()) return s;
    if (!(s = f32(t.valid, "valid", false, false)).ok()) return s;
    if (o.reduction != Reduction::kNone && !(s = f32(t.loss, "loss", false, false)).ok()) return s;
  }
  // gradients
  const bool grads = t.dhidden != nullptr || t.dweight != nullptr || t.dbias != nullptr;
  if (grads && !backward && o.reduction == Reduction::kNone)
    return fail("gradients in the forward take reduction mean or sum (reduction none: the backward entry, for dloss)");
  if (t.dhidden != nullptr) {
    if (t.dhidden->ndim != 2 || t.dhidden->shape[0] != tokens || t.dhidden->shape[1] != hid)
      return fail("dhidden must have hidden's shape " + shape_str(h) + ", got " + shape_str(*t.dhidden));
    if (!(s = rows_of(*t.dhidden, "dhidden", &p->lddh)).ok()) return s;
  }
  if (t.dweight != nullptr) {
    if (t.dweight->ndim != 2 || t.dweight->shape[0] != vocab || t.dweight->shape[1] != hid)
      return fail("dweight must have weight's shape " + shape_str(w) + ", got " + shape_str(*t.dweight));
    if (!(s = rows_of(*t.dweight, "dweight", &p->lddw)).ok()) return s;
  }
  if (t.dbias != nullptr) {
    if (t.bias == nullptr) return fail("dbias goes with a bias");
    const TensorView& db = *t.dbias;
    if (db.device.type != h.device.type || db.device.index != h.device.index)
      return fail("dbias must be on hidden's device (" + device_str(h.device) + "), got " + device_str(db.device));
    if (db.dtype != DType::kFloat32) return fail(std::string("dbias must be float32, got ") + dtype_name(db.dtype));
    if (db.ndim != 1 || db.shape[0] != vocab || (vocab > 1 && db.strides[0] != 1))
      return fail("dbias must be contiguous with shape [" + std::to_string(vocab) + "], got " + shape_str(db) +
                  " strides " + strides_str(db));
  }
  p->dtype = h.dtype;
  p->tokens = tokens, p->hidden = hid, p->vocab = vocab;
  p->grads = grads;
  return Status::Ok();
}

}  // namespace kernelforge
