// Argument checks for the activation family: the one place that validates (see activation_problem.h).
#include <climits>
#include <cstdint>
#include <string>

#include "activation/activation_plan.h"
#include "activation/activation_problem.h"
#include "common/validate_util.h"

namespace kernelforge {

namespace {

using validate_util::device_str;
using validate_util::same_shape;
using validate_util::shape_str;
using validate_util::strides_str;

// Argument names of each op, as in the public API: the primary input (the first argument, whose
// dtype, device and shape the others must match), the second input, and their gradients.
struct Names {
  const char* primary;
  const char* second;  // nullptr for the one-input ops
  const char* dprimary;
  const char* dsecond;
};
Names names_of(ActOp op) {
  switch (op) {
    case ActOp::kSwiglu:
      return {"gate", "up", "dgate", "dup"};
    case ActOp::kGeglu:
      return {"hidden", "gate", "dhidden", "dgate"};
    default:
      return {"x", nullptr, "dx", nullptr};
  }
}

struct Checker {
  const ActCall& c;
  const TensorView* primary = nullptr;
  const char* pname = "";
  explicit Checker(const ActCall& call) : c(call) {}

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

  // Same dtype and device as the primary input, a sane rank, non-null data when non-empty.
  Status like_primary(const TensorView& t, const char* name) const {
    const TensorView& p = *primary;
    if (t.dtype != p.dtype)
      return fail(std::string(name) + " must have the same dtype as " + pname + " (" + dtype_name(p.dtype) + "), got " +
                  dtype_name(t.dtype));
    if (t.device.type != p.device.type || (p.device.type == DeviceType::kCUDA && t.device.index != p.device.index))
      return fail(std::string(name) + " must be on the same device as " + pname + " (" + device_str(p.device) +
                  "), got " + device_str(t.device));
    if (t.ndim < 1 || t.ndim > kMaxDims) return fail(std::string(name) + " has an invalid number of dimensions");
    if (t.numel() > 0 && t.data == nullptr) return fail(std::string(name) + " has a null data pointer");
    return Status::Ok();
  }

  // Leading dims collapse into one row stride; the last dim is contiguous.
  Status row_stride_of(const TensorView& t, const char* name, int64_t* row_stride) const {
    const std::string why = validate_util::collapse_rows(t, row_stride);
    return why.empty() ? Status::Ok() : fail(std::string(name) + why);
  }

  // A row tensor of shape `want` (described by `what` in the message). Outputs must not overlap
  // themselves (rows at least a row length apart), or rows would race.
  Status rows_view(const TensorView* t, const char* name, const TensorView& want, const char* what, int64_t* row_stride,
                   bool output) const {
    if (t == nullptr) return fail(std::string(name) + " must not be null");
    Status s = like_primary(*t, name);
    if (!s.ok()) return s;
    if (!same_shape(*t, want))
      return fail(std::string(name) + " must have shape " + shape_str(want) + " (" + what + "), got " + shape_str(*t));
    if (!(s = row_stride_of(*t, name, row_stride)).ok()) return s;
    const int64_t n = t->shape[t->ndim - 1];
    if (output && t->numel() > n && *row_stride < n)
      return fail(std::string(name) + " rows overlap: row stride " + std::to_string(*row_stride) +
                  " is smaller than the row length " + std::to_string(n));
    return Status::Ok();
  }
};

// gelu_backward_bias_grad's dbias [n] (its own floating dtype, x's device, one stride that is not 0
// unless n = 1: every element has one writer) and, on CUDA, the workspace of its partial sums.
Status validate_bias_grad(const Checker& ck, const ActCall& c, ActParams* p) {
  if (c.op != ActOp::kGelu || !c.backward) return ck.fail("dbias is only taken by gelu_backward_bias_grad");
  const TensorView& b = *c.dbias;
  const TensorView& x = *ck.primary;
  const int64_t n = p->n;
  Status s = ck.dtype_ok(b, "dbias");
  if (!s.ok()) return s;
  if (b.device.type != x.device.type || (x.device.type == DeviceType::kCUDA && b.device.index != x.device.index))
    return ck.fail("dbias must be on the same device as x (" + device_str(x.device) + "), got " + device_str(b.device));
  if (b.ndim != 1 || b.shape[0] != n)
    return ck.fail("dbias must have shape [" + std::to_string(n) + "] (the last dimension of x), got " + shape_str(b));
  if (n > 1 && b.strides[0] == 0)
    return ck.fail("dbias must not have stride 0 (its " + std::to_string(n) + " elements would share one address)");
  if (n > 0 && b.data == nullptr) return ck.fail("dbias has a null data pointer");
  p->dbias = b.data;
  p->dbias_stride = b.strides[0];
  p->dbias_dtype = b.dtype;
  if (!c.cuda) return Status::Ok();
  const size_t need = size_t(act_bias_workspace_floats(p->rows, n)) * sizeof(float);
  if (c.workspace_bytes < need || (need > 0 && c.workspace == nullptr))
    return ck.fail("workspace must hold at least " + std::to_string(need) +
                   " bytes (gelu_backward_bias_grad_workspace_size(" + std::to_string(p->rows) + ", " +
                   std::to_string(n) + ")), got " +
                   (c.workspace == nullptr ? std::string("a null pointer") : std::to_string(c.workspace_bytes)));
  if (need > 0 && reinterpret_cast<uintptr_t>(c.workspace) % alignof(float) != 0)
    return ck.fail("workspace must be 4-byte aligned (float32 partial sums)");
  p->partials = static_cast<float*>(c.workspace);
  return Status::Ok();
}

}  // namespace

Status validate_activation(const ActCall& c, ActParams* p, DType* dtype) {
  Checker ck(c);
  const Names nm = names_of(c.op);
  const bool split = act_is_split(c.op), two = c.op == ActOp::kSwiglu || c.op == ActOp::kGeglu;
  const TensorView* prim = two ? (c.op == ActOp::kSwiglu ? c.gate : c.up) : c.x;
  const TensorView* second = two ? (c.op == ActOp::kSwiglu ? c.up : c.gate) : nullptr;
  if (prim == nullptr) return ck.fail(std::string(nm.primary) + " must not be null");
  ck.primary = prim;
  ck.pname = nm.primary;
  const TensorView& x = *prim;
  Status s = ck.dtype_ok(x, nm.primary);
  if (!s.ok()) return s;
  if (x.ndim < 1 || x.ndim > kMaxDims)
    return ck.fail(std::string(nm.primary) + " must have between 1 and " + std::to_string(kMaxDims) +
                   " dimensions, got " + std::to_string(x.ndim));
  for (int d = 0; d < x.ndim; ++d)
    if (x.shape[d] < 0) return ck.fail(std::string(nm.primary) + " has a negative size " + shape_str(x));
  if (c.cuda && x.device.type != DeviceType::kCUDA)
    return ck.fail(std::string(nm.primary) + " must be a CUDA tensor, got " + device_str(x.device) +
                   " (use kernelforge::ref:: for CPU)");
  if (!c.cuda && x.device.type != DeviceType::kCPU)
    return ck.fail(std::string(nm.primary) + " must be a CPU tensor for the reference, got " + device_str(x.device));
  if (x.numel() > 0 && x.data == nullptr) return ck.fail(std::string(nm.primary) + " has a null data pointer");
  if (c.op != ActOp::kSiluAndMul && c.op != ActOp::kSwiglu && c.approx != GeluApprox::kNone &&
      c.approx != GeluApprox::kTanh)
    return ck.fail("approximate must be GeluApprox::kNone or GeluApprox::kTanh, got " +
                   std::to_string(static_cast<int>(c.approx)));

  const int64_t last = x.shape[x.ndim - 1];
  if (last > INT_MAX)
    return ck.fail("the last dimension of " + std::string(nm.primary) + " must be at most 2^31 - 1, got " +
                   std::to_string(last));
  if (split && last % 2 != 0)
    return ck.fail(std::string(nm.primary) + " last dimension must be even (2*I), got " + std::to_string(last));
  int64_t x_stride = 0;
  if (!(s = ck.row_stride_of(x, nm.primary, &x_stride)).ok()) return s;

  // The shape of y (and dy): x's, with the last dimension halved for the [..., 2I] ops.
  TensorView out_shape = x;
  const int64_t n = split ? last / 2 : last;
  out_shape.shape[x.ndim - 1] = n;
  const char* out_what = split ? "the shape of x with the last dimension halved" : "the shape of the input";
  const std::string in_what = std::string("the shape of ") + nm.primary;

  int64_t second_stride = 0;
  if (two && !(s = ck.rows_view(second, nm.second, x, in_what.c_str(), &second_stride, false)).ok()) return s;

  p->n = n;
  p->rows = (x.numel() == 0 || n == 0) ? 0 : x.numel() / last;
  const size_t elt = dtype_size(x.dtype);
  const bool any = p->rows > 0;
  // a = activation input, b = multiplier: the halves of x's rows, or the two tensors.
  if (split) {
    const char* base = static_cast<const char*>(x.data);
    const int64_t a_off = c.gate_first ? 0 : n, b_off = c.gate_first ? n : 0;
    p->a = any ? base + a_off * int64_t(elt) : nullptr;
    p->b = any ? base + b_off * int64_t(elt) : nullptr;
    p->a_stride = p->b_stride = x_stride;
  } else if (two) {
    // swiglu(gate, up): a = gate, b = up; geglu(hidden, gate): a = gate, b = hidden
    const bool prim_is_a = c.op == ActOp::kSwiglu;
    p->a = prim_is_a ? x.data : second->data;
    p->b = prim_is_a ? second->data : x.data;
    p->a_stride = prim_is_a ? x_stride : second_stride;
    p->b_stride = prim_is_a ? second_stride : x_stride;
  } else {
    p->a = x.data;
    p->a_stride = x_stride;
  }

  if (!c.backward) {
    if (!(s = ck.rows_view(c.y, "y", out_shape, out_what, &p->y_stride, true)).ok()) return s;
    p->y = c.y->data;
  } else {
    if (!(s = ck.rows_view(c.dy, "dy", out_shape, split ? out_what : "the shape of the forward output", &p->dy_stride,
                           false))
             .ok())
      return s;
    p->dy = c.dy->data;
    if (split) {
      int64_t dx_stride = 0;
      // dx rows hold both halves: they must be at least 2I apart.
      if (!(s = ck.rows_view(c.dx, "dx", x, "the shape of x", &dx_stride, true)).ok()) return s;
      const char* base = static_cast<char*>(c.dx->data);
      const int64_t a_off = c.gate_first ? 0 : n, b_off = c.gate_first ? n : 0;
      p->da = any ? const_cast<char*>(base) + a_off * int64_t(elt) : nullptr;
      p->db = any ? const_cast<char*>(base) + b_off * int64_t(elt) : nullptr;
      p->da_stride = p->db_stride = dx_stride;
    } else if (two) {
      const TensorView* dprim = c.op == ActOp::kSwiglu ? c.dgate : c.dup;
      const TensorView* dsecond = c.op == ActOp::kSwiglu ? c.dup : c.dgate;
      const std::string second_what = std::string("the shape of ") + nm.second;
      int64_t dprim_stride = 0, dsecond_stride = 0;
      if (!(s = ck.rows_view(dprim, nm.dprimary, x, in_what.c_str(), &dprim_stride, true)).ok()) return s;
      if (!(s = ck.rows_view(dsecond, nm.dsecond, x, second_what.c_str(), &dsecond_stride, true)).ok()) return s;
      const bool prim_is_a = c.op == ActOp::kSwiglu;
      p->da = prim_is_a ? dprim->data : dsecond->data;
      p->db = prim_is_a ? dsecond->data : dprim->data;
      p->da_stride = prim_is_a ? dprim_stride : dsecond_stride;
      p->db_stride = prim_is_a ? dsecond_stride : dprim_stride;
    } else {
      if (!(s = ck.rows_view(c.dx, "dx", x, "the shape of x", &p->da_stride, true)).ok()) return s;
      p->da = c.dx->data;
    }
  }
  if (c.dbias != nullptr && !(s = validate_bias_grad(ck, c, p)).ok()) return s;
  *dtype = x.dtype;
  return Status::Ok();
}

}  // namespace kernelforge
