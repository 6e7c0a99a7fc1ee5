// Argument checks for the softmax family: the one place that validates (see softmax_problem.h).
#include <climits>
#include <string>

#include "common/validate_util.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::same_shape;
using validate_util::shape_str;

struct Checker {
  const SoftmaxCall& c;
  const TensorView* primary = nullptr;  // x (forward) or g (backward): the others must match it
  const char* pname = "";
  explicit Checker(const SoftmaxCall& call) : c(call) {}

  // The message is only built on failure: a valid call allocates nothing here.
  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  Status dtype_ok(const TensorView& t, const char* name) const {
    const bool ok = t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16 ||
                    (!c.cuda && t.dtype == DType::kFloat64);
    if (!ok)
      return fail(std::string(name) + " must be a " + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                  " tensor, got " + dtype_name(t.dtype));
    return Status::Ok();
  }

  // The primary tensor: dtype, rank, sizes, device kind, data, last-dimension size, row stride.
  Status first(const TensorView* t, const char* name, int64_t* row_stride) {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    primary = t;
    pname = name;
    Status s = dtype_ok(*t, name);
    if (!s.ok()) return s;
    if (t->ndim < 1 || t->ndim > kMaxDims)
      return fail(std::string(name) + " must have between 1 and " + std::to_string(kMaxDims) + " dimensions, got " +
                  std::to_string(t->ndim));
    for (int d = 0; d < t->ndim; ++d)
      if (t->shape[d] < 0) return fail(std::string(name) + " has a negative size " + shape_str(*t));
    if (c.cuda && t->device.type != DeviceType::kCUDA)
      return fail(std::string(name) + " must be a CUDA tensor, got " + device_str(t->device) +
                  " (use kernelforge::ref:: for CPU)");
    if (!c.cuda && t->device.type != DeviceType::kCPU)
      return fail(std::string(name) + " must be a CPU tensor for the reference, got " + device_str(t->device));
    if (t->numel() > 0 && t->data == nullptr) return fail(std::string(name) + " has a null data pointer");
    const int64_t n = t->shape[t->ndim - 1];
    if (n > INT_MAX)
      return fail("the last dimension of " + std::string(name) + " must be at most 2^31 - 1, got " + std::to_string(n));
    const std::string why = validate_util::collapse_rows(*t, row_stride);
    return why.empty() ? Status::Ok() : fail(std::string(name) + why);
  }

  // Another tensor of the primary's shape, dtype and device. Outputs must not overlap themselves
  // (rows at least a row length apart), or rows would race.
  Status like_primary(const TensorView* t, const char* name, int64_t* row_stride, bool output) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    const TensorView& p = *primary;
    if (t->dtype != p.dtype)
      return fail(std::string(name) + " must have the same dtype as " + pname + " (" + dtype_name(p.dtype) + "), got " +
                  dtype_name(t->dtype));
    if (t->device.type != p.device.type || (p.device.type == DeviceType::kCUDA && t->device.index != p.device.index))
      return fail(std::string(name) + " must be on the same device as " + pname + " (" + device_str(p.device) +
                  "), got " + device_str(t->device));
    if (t->ndim < 1 || t->ndim > kMaxDims) return fail(std::string(name) + " has an invalid number of dimensions");
    if (!same_shape(*t, p))
      return fail(std::string(name) + " must have shape " + shape_str(p) + " (the shape of " + pname + "), got " +
                  shape_str(*t));
    if (t->numel() > 0 && t->data == nullptr) return fail(std::string(name) + " has a null data pointer");
    const std::string why = validate_util::collapse_rows(*t, row_stride);
    if (!why.empty()) return fail(std::string(name) + why);
    const int64_t n = t->shape[t->ndim - 1];
    if (output && t->numel() > n && *row_stride < n)
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*row_stride) +
                  " is smaller than the row length " + std::to_string(n));
    return Status::Ok();
  }
};

}  // namespace

Status validate_softmax(const SoftmaxCall& c, SoftmaxParams* p, DType* dtype) {
  Checker ck(c);
  Status s;
  if (!c.backward) {
    if (!(s = ck.first(c.x, "x", &p->in_stride)).ok()) return s;
    if (!(s = ck.like_primary(c.y, "y", &p->out_stride, true)).ok()) return s;
    p->in = c.x->data;
    p->y = nullptr;
    p->out = c.y->data;
  } else {
    if (!(s = ck.first(c.g, "g", &p->in_stride)).ok()) return s;
    if (!(s = ck.like_primary(c.y, "y", &p->y_stride, false)).ok()) return s;
    if (!(s = ck.like_primary(c.dx, "dx", &p->out_stride, true)).ok()) return s;
    p->in = c.g->data;
    p->y = c.y->data;
    p->out = c.dx->data;
  }
  const TensorView& t = *ck.primary;
  p->n = t.shape[t.ndim - 1];
  p->rows = (t.numel() == 0 || p->n == 0) ? 0 : t.numel() / p->n;
  *dtype = t.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
