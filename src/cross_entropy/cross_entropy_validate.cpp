// Argument checks for the cross-entropy family: the one place that validates (see
// cross_entropy_problem.h). Every message names the op, the argument and what was expected.
#include <climits>
#include <cmath>
#include <string>

#include "common/validate_util.h"
#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::shape_str;

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
    if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0))
      return fail("label_smoothing must be in [0, 1], got " + std::to_string(o.label_smoothing));
    if (!(o.z_loss_scale >= 0.0) || !std::isfinite(o.z_loss_scale))
      return fail("z_loss_scale must be finite and >= 0, got " + std::to_string(o.z_loss_scale));
    if (!(o.softcap >= 0.0) || !std::isfinite(o.softcap))
      return fail("softcap must be finite and > 0 (or 0 / None: no softcap), got " + std::to_string(o.softcap));
    if (o.reduction != Reduction::kNone && o.reduction != Reduction::kMean && o.reduction != Reduction::kSum)
      return fail("reduction must be none (0), mean (1) or sum (2), got " + std::to_string(int(o.reduction)));
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

}  // namespace kernelforge
