// Argument checks for the fused_linear_rowsum family: the one place that validates (see
// fused_linear_rowsum_problem.h).
#include <climits>
#include <string>

#include "common/validate_util.h"
#include "fused_linear_rowsum/fused_linear_rowsum_problem.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::shape_str;
using validate_util::strides_str;

struct Checker {
  const FlrsCall& c;
  explicit Checker(const FlrsCall& call) : c(call) {}

  // The message is only built on failure: a valid call allocates nothing here.
  Status fail(const std::string& m) const { return Status::Invalid(std::string(c.name) + ": " + m); }

  // x's dtype and device, a rank in 1..8, no negative sizes, data when non-empty.
  Status like_x(const TensorView& t, const char* name) const {
    const TensorView& x = *c.x;
    if (t.dtype != x.dtype)
      return fail(std::string(name) + " must have the same dtype as x (" + dtype_name(x.dtype) + "), got " +
                  dtype_name(t.dtype));
    if (t.device.type != x.device.type || (x.device.type == DeviceType::kCUDA && t.device.index != x.device.index))
      return fail(std::string(name) + " must be on the same device as x (" + device_str(x.device) + "), got " +
                  device_str(t.device));
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] < 0) return fail(std::string(name) + " has a negative size " + shape_str(t));
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    return Status::Ok();
  }

  // Leading dims collapse into one row stride; the last dim is contiguous. Outputs' rows must not
  // overlap (row stride >= the row length), or rows would race.
  Status rows_of(const TensorView& t, const char* name, int64_t* row_stride, bool output) const {
    const std::string why = validate_util::collapse_rows(t, row_stride);
    if (!why.empty()) return fail(std::string(name) + why);
    const int64_t n = t.shape[t.ndim - 1];
    if (output && t.numel() > n && *row_stride < n)
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*row_stride) +
                  " is smaller than the row length " + std::to_string(n));
    return Status::Ok();
  }

  // A tensor whose elements are equally spaced (y, dy: x.shape[:-1]; bias, dbias: [O]): its
  // dimensions collapse into one stride, at least 1 for an output with more than one element.
  Status spaced(const TensorView& t, const char* name, int64_t* stride, bool output) const {
    *stride = 1;
    if (t.numel() == 0) return Status::Ok();
    int64_t s = 1, expect = -1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] == 1) continue;
      if (expect < 0) {
        s = t.strides[d];
      } else if (t.strides[d] != expect) {
        return fail(std::string(name) + " must have dimensions that collapse into one stride (shape " + shape_str(t) +
                    ", strides " + strides_str(t) + "); make it contiguous first");
      }
      expect = t.strides[d] * t.shape[d];
    }
    if (s < 0) return fail(std::string(name) + " must not have negative strides, got " + strides_str(t));
    if (output && t.numel() > 1 && s < 1)
      return fail(std::string(name) + " elements overlap: stride " + std::to_string(s));
    *stride = s;
    return Status::Ok();
  }

  // x.shape[:-1] (y, dy).
  Status row_vector(const TensorView* t, const char* name, int64_t* stride, bool output) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = like_x(*t, name);
    if (!s.ok()) return s;
    const TensorView& x = *c.x;
    bool same = t->ndim == x.ndim - 1;
    for (int d = 0; same && d < t->ndim; ++d) same = t->shape[d] == x.shape[d];
    if (!same) {
      TensorView want = x;
      want.ndim = x.ndim - 1;
      return fail(std::string(name) + " must have shape " + shape_str(want) +
                  " (the shape of x without its last dimension), got " + shape_str(*t));
    }
    return spaced(*t, name, stride, output);
  }

  // [O] (bias, dbias).
  Status out_vector(const TensorView& t, const char* name, int64_t o, const char* o_from, int64_t* stride,
                    bool output) const {
    Status s = like_x(t, name);
    if (!s.ok()) return s;
    if (t.ndim != 1 || (o >= 0 && t.shape[0] != o))
      return fail(std::string(name) + " must have shape [" + (o >= 0 ? std::to_string(o) : std::string("O")) + "]" +
                  (o >= 0 ? std::string(" (") + o_from + ")" : std::string("")) + ", got " + shape_str(t));
    return spaced(t, name, stride, output);
  }

  // [O, K] (weight, dweight).
  Status matrix(const TensorView& t, const char* name, int64_t k, int64_t o, const char* o_from, int64_t* stride,
                bool output) const {
    Status s = like_x(t, name);
    if (!s.ok()) return s;
    if (t.ndim != 2 || t.shape[1] != k || (o >= 0 && t.shape[0] != o))
      return fail(std::string(name) + " must have shape [" + (o >= 0 ? std::to_string(o) : std::string("O")) + ", " +
                  std::to_string(k) + "] (in_features = the last dimension of x" +
                  (o >= 0 ? std::string(", ") + o_from : std::string("")) + "), got " + shape_str(t));
    return rows_of(t, name, stride, output);
  }

  // [K] float32 (the reference also takes float64), contiguous.
  Status w_sum(const TensorView* t, int64_t k, DType* dtype) const {
    if (t == nullptr) return fail("w_sum must not be null");
    const bool f64_ok = !c.cuda;
    if (t->dtype != DType::kFloat32 && !(f64_ok && t->dtype == DType::kFloat64))
      return fail(std::string("w_sum must be a float32") + (f64_ok ? " or float64" : "") + " tensor, got " +
                  dtype_name(t->dtype));
    const TensorView& x = *c.x;
    if (t->device.type != x.device.type || (x.device.type == DeviceType::kCUDA && t->device.index != x.device.index))
      return fail("w_sum must be on the same device as x (" + device_str(x.device) + "), got " + device_str(t->device));
    if (t->ndim != 1 || t->shape[0] != k)
      return fail("w_sum must have shape [" + std::to_string(k) + "] (the last dimension of x), got " + shape_str(*t));
    if (k > 1 && t->strides[0] != 1)
      return fail("w_sum must be contiguous (stride 1), got stride " + std::to_string(t->strides[0]));
    if (k > 0 && t->data == nullptr) return fail("w_sum has a null data pointer");
    *dtype = t->dtype;
    return Status::Ok();
  }
};

}  // namespace

Status validate_fused_linear_rowsum(const FlrsCall& c, FlrsParams* p, DType* dtype, DType* w_sum_dtype) {
  Checker ck(c);
  if (c.x == nullptr) return ck.fail("x must not be null");
  const TensorView& x = *c.x;
  const bool dtype_ok = x.dtype == DType::kFloat32 || x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16 ||
                        (!c.cuda && x.dtype == DType::kFloat64);
  if (!dtype_ok)
    return ck.fail(std::string("x must be a ") + (c.cuda ? "float32/float16/bfloat16" : "floating-point") +
                   " tensor, got " + dtype_name(x.dtype));
  if (x.ndim < 1 || x.ndim > kMaxDims)
    return ck.fail("x must have between 1 and " + std::to_string(kMaxDims) + " dimensions ([..., in_features]), got " +
                   std::to_string(x.ndim));
  for (int d = 0; d < x.ndim; ++d)
    if (x.shape[d] < 0) return ck.fail("x has a negative size " + shape_str(x));
  if (c.cuda && x.device.type != DeviceType::kCUDA)
    return ck.fail("x must be a CUDA tensor, got " + device_str(x.device) + " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && x.device.type != DeviceType::kCPU)
    return ck.fail("x must be a CPU tensor for the reference, got " + device_str(x.device));
  if (x.numel() > 0 && x.data == nullptr) return ck.fail("x has a null data pointer");
  const int64_t k = x.shape[x.ndim - 1];
  if (k > INT_MAX) return ck.fail("the last dimension of x must be at most 2^31 - 1, got " + std::to_string(k));
  int64_t tokens = 1;
  for (int d = 0; d < x.ndim - 1; ++d) tokens *= x.shape[d];
  Status s = ck.rows_of(x, "x", &p->x_stride, false);
  if (!s.ok()) return s;
  p->tokens = tokens;
  p->k = k;
  p->x = x.data;

  if (!c.backward) {
    if (c.weight == nullptr) return ck.fail("weight must not be null");
    if (!(s = ck.matrix(*c.weight, "weight", k, -1, "", &p->w_stride, false)).ok()) return s;
    p->o = c.weight->shape[0];
    p->w = c.weight->data;
    if (c.bias != nullptr) {
      if (!(s = ck.out_vector(*c.bias, "bias", p->o, "out_features = weight.shape[0]", &p->bias_stride, false)).ok())
        return s;
      p->bias = p->o > 0 ? c.bias->data : nullptr;
    }
    if (!(s = ck.row_vector(c.y, "y", &p->y_stride, true)).ok()) return s;
    p->y = c.y->data;
    if (!(s = ck.w_sum(c.w_sum, k, w_sum_dtype)).ok()) return s;
    p->w_sum = static_cast<float*>(c.w_sum->data);
  } else {
    if (!(s = ck.row_vector(c.dy, "dy", &p->dy_stride, false)).ok()) return s;
    p->dy = c.dy->data;
    if (!(s = ck.w_sum(c.w_sum, k, w_sum_dtype)).ok()) return s;
    p->w_sum = static_cast<float*>(c.w_sum->data);
    if (c.dx != nullptr) {
      if (!(s = ck.like_x(*c.dx, "dx")).ok()) return s;
      if (!validate_util::same_shape(*c.dx, x))
        return ck.fail("dx must have shape " + shape_str(x) + " (the shape of x), got " + shape_str(*c.dx));
      if (!(s = ck.rows_of(*c.dx, "dx", &p->dx_stride, true)).ok()) return s;
      p->dx = c.dx->data;
    }
    int64_t o = -1;
    if (c.dweight != nullptr) {
      if (!(s = ck.matrix(*c.dweight, "dweight", k, -1, "", &p->dw_stride, true)).ok()) return s;
      o = c.dweight->shape[0];
      p->dw = c.dweight->data;
    }
    if (c.dbias != nullptr) {
      if (!(s = ck.out_vector(*c.dbias, "dbias", o, "out_features = dweight.shape[0]", &p->db_stride, true)).ok())
        return s;
      o = c.dbias->shape[0];
      p->db = c.dbias->data;
    }
    p->o = o > 0 ? o : 0;
    if (p->o == 0) p->dw = p->db = nullptr;  // nothing to write
    if (p->tokens == 0 || k == 0) p->dx = nullptr;
  }
  *dtype = x.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
